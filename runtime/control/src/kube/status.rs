//! The leader's job: each WeftPlugin's status from what the controller concluded ([`ResourceState`]) and what every
//! replica's nodes run ([`report`](crate::kube::report)): conditions `Accepted` (False with the reason when
//! refused) and `Ready` (the served version ACKed by every selected node), node counts (selected, serving,
//! NACKing, rolled back), the sha256 served, the last rollback, a phase for the printer column, and the staged
//! rollouts it steps over every replica's nodes (`rolloutState`). Written with a
//! merge patch on the `status` subresource, only when it changed (a condition's `lastTransitionTime` moves only
//! when its status does).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use kube::api::{DynamicObject, Patch, PatchParams};
use kube::{Api, Client};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::kube::KubeOptions;
use crate::kube::reconcile::{ResourceState, Resources};
use crate::kube::report::{NodeReport, read_all};
use crate::kube::watch::weftplugin_resource;

fn condition(
    old: Option<&Value>,
    kind: &str,
    ok: bool,
    reason: &str,
    message: &str,
    generation: i64,
    now: &str,
) -> Value {
    let status = if ok { "True" } else { "False" };
    let previous = old
        .and_then(|s| s.get("conditions"))
        .and_then(Value::as_array)
        .and_then(|cs| cs.iter().find(|c| c.get("type") == Some(&json!(kind))));
    let since = previous
        .filter(|c| c.get("status") == Some(&json!(status)))
        .and_then(|c| c.get("lastTransitionTime").cloned())
        .unwrap_or_else(|| json!(now));
    json!({
        "type": kind,
        "status": status,
        "reason": reason,
        "message": message,
        "observedGeneration": generation,
        "lastTransitionTime": since,
    })
}

/// The status a resource should have; `now` is the transition time of a condition that changes.
pub fn desired(s: &ResourceState, nodes: &BTreeMap<String, NodeReport>, now: &str) -> Value {
    let old = s.status.as_ref();
    let accepted = match &s.refused {
        None => condition(
            old,
            "Accepted",
            true,
            "Accepted",
            "the spec and its code checks passed",
            s.generation,
            now,
        ),
        Some(why) => condition(
            old,
            "Accepted",
            false,
            "Refused",
            &bounded(why, 32768),
            s.generation,
            now,
        ),
    };
    let Some(serving) = &s.serving else {
        let ready = condition(
            old,
            "Ready",
            false,
            "NotServed",
            "no accepted version of this resource to serve",
            s.generation,
            now,
        );
        return json!({
            "observedGeneration": s.generation,
            "phase": "Refused",
            "conditions": [accepted, ready],
            "nodes": {"selected": 0, "serving": 0, "nacking": 0, "rolledBack": 0},
            "readyNodes": "0/0",
        });
    };
    // Selected: the nodes of its workloads (of the staged ones during a staged rollout) that a replica serves.
    let selected: BTreeSet<&String> = nodes
        .keys()
        .filter(|n| serving.nodes.as_ref().is_none_or(|set| set.contains(*n)))
        .filter(|n| serving.staged.as_ref().is_none_or(|st| st.contains(n)))
        .collect();
    let mut serving_n = 0;
    let mut nacking = 0;
    let mut rolled_back = 0;
    let mut last_rollback: Option<(&String, &crate::kube::report::RollbackSeen)> = None;
    for n in &selected {
        let r = &nodes[*n];
        if r.plugins.get(&s.xds_name) == Some(&serving.version) {
            serving_n += 1;
        }
        if r.nacked
            .get(&s.xds_name)
            .is_some_and(|(v, _)| *v == serving.version)
        {
            nacking += 1;
        }
        let rb = r.rollbacks.iter().rfind(|rb| {
            rb.plugin == s.xds_name && serving.sha256.as_ref().is_none_or(|h| *h == rb.sha256)
        });
        if let Some(rb) = rb {
            rolled_back += 1;
            if last_rollback.is_none_or(|(_, l)| l.at < rb.at) {
                last_rollback = Some((n, rb));
            }
        }
    }
    let total = selected.len();
    let all = serving_n == total;
    let (reason, message) = if total == 0 {
        (
            "NoSelectedNodes",
            "no connected node runs a workload this resource selects".to_owned(),
        )
    } else if all {
        ("Serving", format!("served on all {total} selected nodes"))
    } else {
        (
            "Pending",
            format!(
                "served on {serving_n} of {total} selected nodes ({nacking} NACKing, {rolled_back} rolled back)"
            ),
        )
    };
    let ready = condition(old, "Ready", all, reason, &message, s.generation, now);
    let phase = if s.refused.is_some() {
        "Refused"
    } else if nacking > 0 || rolled_back > 0 {
        "Degraded"
    } else if serving.staged.is_some() {
        "Staged"
    } else if all {
        "Ready"
    } else {
        "Pending"
    };
    let mut status = json!({
        "observedGeneration": s.generation,
        "phase": phase,
        "conditions": [accepted, ready],
        "nodes": {"selected": total, "serving": serving_n, "nacking": nacking, "rolledBack": rolled_back},
        "readyNodes": format!("{serving_n}/{total}"),
    });
    if let Some(h) = serving.sha256.as_ref().filter(|h| is_sha256(h)) {
        status["servingSha256"] = json!(h);
    }
    if let Some(sh) = shadow(&s.xds_name, &selected, nodes) {
        status["shadow"] = sh;
    }
    if let Some((node, rb)) = last_rollback
        && is_sha256(&rb.sha256)
    {
        status["lastRollback"] = json!({
            "node": node,
            "sha256": rb.sha256,
            "reason": bounded(&rb.reason, 4096),
            "at": rb.at,
        });
    }
    status
}

/// What the shadow version decided on the selected nodes that report one: the newest report's sha256, totals, and
/// the newest samples with their node.
fn shadow(
    plugin: &str,
    selected: &BTreeSet<&String>,
    nodes: &BTreeMap<String, NodeReport>,
) -> Option<Value> {
    let records: Vec<(&String, &crate::ads::shadow::ShadowRecord)> = selected
        .iter()
        .filter_map(|n| nodes[*n].shadows.get(plugin).map(|r| (*n, r)))
        .collect();
    let newest = records.iter().max_by(|a, b| a.1.at.cmp(&b.1.at))?;
    let mut samples: Vec<(&String, &crate::ads::shadow::Sample, &String)> = records
        .iter()
        .flat_map(|(n, r)| r.samples.iter().map(move |s| (*n, s, &r.at)))
        .collect();
    samples.sort_by(|a, b| a.2.cmp(b.2));
    let keep = samples.len().saturating_sub(crate::ads::shadow::SAMPLES);
    let samples: Vec<Value> = samples
        .into_iter()
        .skip(keep)
        .map(|(n, s, _)| {
            let mut v = serde_json::to_value(s).unwrap_or_default();
            if let Some(o) = v.as_object_mut() {
                for (_, text) in o.iter_mut() {
                    if let Some(t) = text.as_str() {
                        *text = json!(bounded(t, 1024));
                    }
                }
                o.insert("node".into(), json!(n));
            }
            v
        })
        .collect();
    let mut out = json!({
        "nodes": records.len(),
        "decisions": records.iter().map(|(_, r)| r.total()).sum::<u64>(),
        "divergences": records.iter().map(|(_, r)| r.divergences).sum::<u64>(),
        "samples": samples,
    });
    if is_sha256(&newest.1.shadow_sha256) {
        out["sha256"] = json!(newest.1.shadow_sha256);
    }
    Some(out)
}

fn is_sha256(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// At most `max` bytes of `s` (the CRD bounds status strings), cut at a character boundary.
fn bounded(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut end = max.saturating_sub(3);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &s[..end])
}

/// Whether two statuses differ in more than their conditions' transition times.
fn differs(old: Option<&Value>, new: &Value) -> bool {
    let strip = |v: &Value| {
        let mut v = v.clone();
        if let Some(cs) = v.get_mut("conditions").and_then(Value::as_array_mut) {
            for c in cs {
                if let Some(o) = c.as_object_mut() {
                    o.remove("lastTransitionTime");
                }
            }
        }
        v
    };
    old.is_none_or(|o| strip(o) != strip(new))
}

#[cfg(test)]
mod tests;

/// The staged rollouts the leader steps, and the plugins it steps them for.
#[derive(Debug)]
pub struct Rollouts {
    /// The rollouts (mirroring what the status says).
    pub rollouts: Arc<crate::rollout::driver::Rollouts>,
    /// Where the source's plugins are, and where a stepped state is served from.
    pub publisher: Arc<crate::ads::publish::Publisher>,
}

impl Rollouts {
    /// Step every plugin over every replica's nodes; serve the result here at once (the other replicas when the
    /// status comes back to them); return each record as the status keeps it (no pull secret).
    fn lead(&self, nodes: &BTreeMap<String, NodeReport>) -> BTreeMap<String, Value> {
        let fleet = crate::rollout::fleet::Fleet::of_reports(nodes);
        let plugins = self.publisher.source_plugins();
        let records = self
            .rollouts
            .lead(&plugins, &fleet, std::time::SystemTime::now());
        self.rollouts.adopt(records.clone());
        self.publisher.reapply();
        records
            .into_iter()
            .map(|(name, mut r)| {
                if let Some(s) = r.stable.as_mut()
                    && let Some(res) = s.resource(&name)
                {
                    let stripped = crate::rollout::secret::strip(&res);
                    s.value_hex = hex::encode(&stripped.body.value);
                }
                (name, serde_json::to_value(&r).unwrap_or_default())
            })
            .collect()
    }
}

/// While leading, keep every resource's status current, and step the staged rollouts (recorded in the status).
pub async fn run(
    client: Client,
    opts: KubeOptions,
    resources: Arc<Resources>,
    rollouts: Rollouts,
    mut leader: tokio::sync::watch::Receiver<bool>,
    stop: CancellationToken,
) {
    let mut changes = resources.subscribe();
    // What this leader wrote, so a status it wrote is not written again before the watch shows it.
    let mut written: BTreeMap<(String, String), Value> = BTreeMap::new();
    loop {
        if *leader.borrow_and_update() {
            match read_all(&client, &opts).await {
                Ok(nodes) => {
                    let now =
                        humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
                    let records = rollouts.lead(&nodes);
                    let all = resources.all();
                    written.retain(|k, _| all.contains_key(k));
                    for ((ns, name), s) in all {
                        let mut want = desired(&s, &nodes, &now);
                        if let Some(r) = records.get(&s.xds_name) {
                            want[crate::kube::reconcile::ROLLOUT_STATE] = r.clone();
                        }
                        let key = (ns.clone(), name.clone());
                        let current = written.get(&key).or(s.status.as_ref());
                        if !differs(current, &want) {
                            continue;
                        }
                        let api: Api<DynamicObject> =
                            Api::namespaced_with(client.clone(), &ns, &weftplugin_resource());
                        let patch = Patch::Merge(json!({"status": want}));
                        match api
                            .patch_status(&name, &PatchParams::default(), &patch)
                            .await
                        {
                            Ok(_) => {
                                tracing::debug!(namespace = %ns, name = %name, "status written");
                                written.insert(key, want);
                            }
                            Err(e) => {
                                tracing::warn!(namespace = %ns, name = %name, error = %e, "writing WeftPlugin status failed; retrying")
                            }
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "reading the replicas' reports failed; retrying")
                }
            }
        } else {
            written.clear();
            rollouts.rollouts.resign();
        }
        tokio::select! {
            () = tokio::time::sleep(opts.retry_period) => {}
            r = changes.changed() => if r.is_err() { return },
            r = leader.changed() => if r.is_err() { return },
            () = stop.cancelled() => return,
        }
    }
}
