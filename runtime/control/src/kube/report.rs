//! Each replica's report of its nodes, for the leader's status: a ConfigMap `weft-control-report-<replica>` in the
//! controller's namespace (as istiod's replicas report config distribution), rewritten when what its nodes run
//! changes and at least every [`HEARTBEAT`] periods, deleted on a clean stop. The leader reads them all; a report
//! not rewritten for [`STALE`] periods is of a replica that died and is ignored; a node in two reports (it moved)
//! counts as the newer says.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{DeleteParams, ListParams, ObjectMeta, PostParams};
use kube::{Api, Client};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;
use weft_proto::type_url;

use crate::ads::registry::Registry;
use crate::kube::KubeOptions;

/// Name prefix of the report ConfigMaps.
pub const PREFIX: &str = "weft-control-report-";
/// The data key holding the report.
const KEY: &str = "report.json";
/// A report is rewritten at least every this many retry periods.
pub const HEARTBEAT: u32 = 15;
/// A report older than this many retry periods is ignored.
pub const STALE: u32 = 45;

/// One node as a replica sees it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeReport {
    /// Plugin versions it ACKed, by xDS name.
    pub plugins: BTreeMap<String, String>,
    /// Plugins it NACKed last: xDS name → (version, reason).
    pub nacked: BTreeMap<String, (String, String)>,
    /// Rollbacks it reported, oldest first: (xDS name, sha256 rolled back, summary, when).
    pub rollbacks: Vec<RollbackSeen>,
    /// Its latest shadow report of each plugin, by xDS name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub shadows: BTreeMap<String, crate::ads::shadow::ShadowRecord>,
    /// Its latest call counts of the plugins in a staged rollout (only those: counts change all the time, and a
    /// report is rewritten when it changes), by xDS name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub counts: BTreeMap<String, crate::ads::counts::CountsRecord>,
}

/// A rollback a node reported.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RollbackSeen {
    /// The plugin's xDS name.
    pub plugin: String,
    /// The code rolled back.
    pub sha256: String,
    /// Calls, failures, traps and timeouts over the probation.
    pub reason: String,
    /// When (RFC 3339).
    pub at: String,
}

/// A replica's report.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// The replica.
    pub replica: String,
    /// When it was written (RFC 3339); ignored when comparing contents.
    pub updated_at: String,
    /// Its nodes by node name.
    pub nodes: BTreeMap<String, NodeReport>,
}

/// What this replica's registry says, with the call counts of the plugins in `counted`. A node may hold several
/// streams (its mesh and its plugin sources): its report is their union.
pub fn of_registry(
    replica: &str,
    registry: &Registry,
    counted: &std::collections::BTreeSet<String>,
) -> Report {
    let mut nodes: BTreeMap<String, NodeReport> = BTreeMap::new();
    registry.visit(|n| {
        let r = nodes.entry(n.name.clone()).or_default();
        if let Some(t) = n.types.get(type_url::EXTENSION_CONFIG) {
            r.plugins
                .extend(t.acked.iter().map(|(k, v)| (k.clone(), v.clone())));
            r.nacked.extend(
                t.nacked
                    .iter()
                    .map(|(k, v)| (k.clone(), (v.version.clone(), v.reason.clone()))),
            );
        }
        r.shadows
            .extend(n.shadows.iter().map(|(k, v)| (k.clone(), v.clone())));
        r.counts.extend(
            n.counts
                .iter()
                .filter(|(k, _)| counted.contains(*k))
                .map(|(k, v)| (k.clone(), v.clone())),
        );
        r.rollbacks.extend(n.rollbacks.iter().map(|r| RollbackSeen {
            plugin: r.plugin.clone(),
            sha256: r.rolled_back_sha256.clone(),
            reason: format!(
                "{} of {} calls failed ({} traps, {} timeouts) within {:.1}s; threshold {}",
                r.failures, r.calls, r.traps, r.timeouts, r.after_seconds, r.max_failure_ratio
            ),
            at: r.at.clone(),
        }));
    });
    Report {
        replica: replica.to_owned(),
        updated_at: String::new(),
        nodes,
    }
}

fn config_map(opts: &KubeOptions, report: &Report) -> Result<ConfigMap, serde_json::Error> {
    Ok(ConfigMap {
        metadata: ObjectMeta {
            name: Some(format!("{PREFIX}{}", opts.replica)),
            namespace: Some(opts.namespace.clone()),
            labels: Some(
                [(
                    "app.kubernetes.io/component".to_owned(),
                    "weft-control-report".to_owned(),
                )]
                .into(),
            ),
            ..Default::default()
        },
        data: Some([(KEY.to_owned(), serde_json::to_string(report)?)].into()),
        ..Default::default()
    })
}

async fn write(api: &Api<ConfigMap>, opts: &KubeOptions, report: &Report) -> Result<(), String> {
    let name = format!("{PREFIX}{}", opts.replica);
    let mut cm = config_map(opts, report).map_err(|e| e.to_string())?;
    match api.get_opt(&name).await.map_err(|e| e.to_string())? {
        None => api
            .create(&PostParams::default(), &cm)
            .await
            .map(drop)
            .map_err(|e| e.to_string()),
        Some(old) => {
            cm.metadata.resource_version = old.metadata.resource_version;
            api.replace(&name, &PostParams::default(), &cm)
                .await
                .map(drop)
                .map_err(|e| e.to_string())
        }
    }
}

/// Write this replica's report until stopped, then delete it.
pub async fn run(
    client: Client,
    opts: KubeOptions,
    registry: Arc<Registry>,
    rollouts: Arc<crate::rollout::driver::Rollouts>,
    stop: CancellationToken,
) {
    let api: Api<ConfigMap> = Api::namespaced(client, &opts.namespace);
    let mut events = registry.subscribe();
    let mut written: Option<(Report, u32)> = None;
    loop {
        let mut now = of_registry(&opts.replica, &registry, &rollouts.progressing());
        let due = match &written {
            None => true,
            Some((r, age)) => r.nodes != now.nodes || *age >= HEARTBEAT,
        };
        if due {
            now.updated_at = humantime::format_rfc3339_millis(SystemTime::now()).to_string();
            match write(&api, &opts, &now).await {
                Ok(()) => written = Some((now, 0)),
                Err(e) => {
                    tracing::warn!(error = %e, "writing this replica's report failed; retrying")
                }
            }
        } else if let Some((_, age)) = written.as_mut() {
            *age += 1;
        }
        tokio::select! {
            () = tokio::time::sleep(opts.retry_period) => {}
            r = events.changed() => {
                if r.is_err() { return; }
                // Coalesce a burst of ACKs into one write.
                tokio::time::sleep(opts.retry_period / 4).await;
            }
            () = stop.cancelled() => {
                let name = format!("{PREFIX}{}", opts.replica);
                if let Err(e) = api.delete(&name, &DeleteParams::default()).await {
                    tracing::debug!(error = %e, "deleting this replica's report");
                }
                return;
            }
        }
    }
}

/// Every live replica's nodes, merged: a node in several reports as the newest says.
pub async fn read_all(
    client: &Client,
    opts: &KubeOptions,
) -> Result<BTreeMap<String, NodeReport>, kube::Error> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &opts.namespace);
    let list = api.list(&ListParams::default()).await?;
    let stale = opts.retry_period * STALE;
    let mut newest: BTreeMap<String, (SystemTime, NodeReport)> = BTreeMap::new();
    for cm in list.items {
        let name = cm.metadata.name.unwrap_or_default();
        if !name.starts_with(PREFIX) {
            continue;
        }
        let Some(text) = cm.data.as_ref().and_then(|d| d.get(KEY)) else {
            continue;
        };
        let report: Report = match serde_json::from_str(text) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(configmap = %name, error = %e, "unreadable replica report ignored");
                continue;
            }
        };
        let Ok(at) = humantime::parse_rfc3339_weak(&report.updated_at) else {
            tracing::warn!(configmap = %name, updated_at = %report.updated_at, "replica report without a readable updatedAt ignored");
            continue;
        };
        if SystemTime::now()
            .duration_since(at)
            .unwrap_or(Duration::ZERO)
            > stale
        {
            continue;
        }
        for (node, r) in report.nodes {
            if newest.get(&node).is_none_or(|(t, _)| *t < at) {
                newest.insert(node, (at, r));
            }
        }
    }
    Ok(newest.into_iter().map(|(k, (_, r))| (k, r)).collect())
}
