//! One step of a plugin's staged rollout: given the resource (its version and plan), what is remembered of it and
//! the fleet as it is now, pick the stage's nodes (a stable order spread across zones), latch the figures, abort on
//! a threshold, advance a stage that baked clean, and say what each node gets. Pure: the time comes in, so tests
//! drive it with their own clock.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use sha2::{Digest, Sha256};

use crate::ads::resources::{NodeSelector, PluginEntry, Resource};
use crate::rollout::fleet::Fleet;
use crate::rollout::plan::Plan;
use crate::rollout::state::{
    Abort, Event, Figures, Phase, Progress, Record, Rollout, StoredVersion, at_ms, ms, rfc3339,
};

/// How many divergence samples a rollout keeps.
const SAMPLES: usize = 5;

/// What a step decided.
#[derive(Debug, Default, PartialEq)]
pub struct Step {
    /// Step again by then, even if nothing else happens (a bake ends).
    pub deadline: Option<SystemTime>,
    /// The plugin is to be served to no node (a first version aborted: there is nothing to go back to).
    pub withdraw: bool,
    /// The record changed (persist it).
    pub changed: bool,
    /// It changed beyond the figures: a stage, a phase, a node picked, an event, the stable version (persist it
    /// now; figures alone may wait).
    pub progressed: bool,
}

/// The candidate nodes of a plugin in rollout order: the nodes that may run it (its placement), ordered by a
/// digest of (plugin, node) within each zone, the zones taken in turn, so each stage spreads across zones and the
/// order does not change as nodes come and go.
pub fn order(plugin: &str, fleet: &Fleet, placement: Option<&NodeSelector>) -> Vec<String> {
    let mut by_zone: BTreeMap<&str, Vec<([u8; 32], &str)>> = BTreeMap::new();
    for (name, v) in &fleet.nodes {
        let key = crate::ads::resources::NodeKey {
            id: String::new(),
            name: name.clone(),
        };
        if placement.is_some_and(|p| !p.matches(&key)) {
            continue;
        }
        let mut h = Sha256::new();
        h.update(plugin.as_bytes());
        h.update([0]);
        h.update(name.as_bytes());
        by_zone
            .entry(v.zone.as_str())
            .or_default()
            .push((h.finalize().into(), name.as_str()));
    }
    let mut zones: Vec<Vec<&str>> = by_zone
        .into_values()
        .map(|mut v| {
            v.sort();
            v.into_iter().map(|(_, n)| n).collect()
        })
        .collect();
    let mut out = Vec::new();
    let mut i = 0;
    while zones.iter().any(|z| i < z.len()) {
        for z in &mut zones {
            if let Some(n) = z.get(i) {
                out.push((*n).to_owned());
            }
        }
        i += 1;
    }
    out
}

/// Add `text` to the rollout's timeline (and the log).
pub fn event(r: &mut Rollout, now: SystemTime, text: String) {
    let stage = if r.state == Progress::Progressing || r.state == Progress::Aborted {
        r.stage + 1
    } else {
        r.stages
    };
    tracing::info!(target: "weft_control::rollout", stage, event = %text, "rollout");
    let after = at_ms(r.started_at_ms);
    r.timeline.push(Event {
        at: rfc3339(now),
        after_seconds: now
            .duration_since(after)
            .unwrap_or(Duration::ZERO)
            .as_secs_f64(),
        stage,
        event: text,
    });
}

/// `base` with `target`'s code and configuration as its shadow (what a shadow-first stage's new nodes get).
pub fn shadowing(name: &str, base: &Resource, target: &Resource) -> Option<Arc<Resource>> {
    use weft_state::xds::plugin::{ShadowResource, decode_resource_with};
    let ok = |_: &str| Ok(());
    let mut b = decode_resource_with(name, &base.body, &ok).ok()?;
    let t = decode_resource_with(name, &target.body, &ok).ok()?;
    b.shadow = Some(ShadowResource {
        code: t.code,
        sha256: t.sha256,
        config: t.config,
    });
    let ecds = weft_state::xds::encode::plugin::extension_config(&b);
    Some(Arc::new(Resource::new(
        name.to_owned(),
        weft_proto::to_any(weft_proto::type_url::EXTENSION_CONFIG, &ecds),
    )))
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 { 0.0 } else { a as f64 / b as f64 }
}

/// Latch what the rollout's nodes report of the version into its figures.
fn observe(name: &str, r: &mut Rollout, fleet: &Fleet, shadow_version: Option<&str>) {
    let sha_ok = |s: &str| r.target_sha256.as_deref().is_none_or(|t| t == s);
    let mut f: Figures = std::mem::take(&mut r.figures);
    for node in &r.nodes {
        let Some(v) = fleet.nodes.get(node) else {
            continue;
        };
        if let Some(n) = v.nacked.get(name)
            && (n.version == r.target_version || Some(n.version.as_str()) == shadow_version)
            && !n.reason.starts_with("rolled back")
        {
            f.nacked.insert(node.clone(), n.reason.clone());
        }
        for rb in &v.rollbacks {
            if rb.plugin == name && sha_ok(&rb.sha256) {
                f.rolled_back.insert(node.clone(), rb.summary.clone());
            }
        }
        if let Some(c) = v.counts.get(name)
            && v.acked.get(name) == Some(&r.target_version)
            && sha_ok(&c.sha256)
        {
            let base = *f
                .baselines
                .entry(node.clone())
                .or_insert((c.calls, c.failures));
            f.per_node.insert(
                node.clone(),
                (
                    c.calls.saturating_sub(base.0),
                    c.failures.saturating_sub(base.1),
                ),
            );
        }
        if let Some(s) = v.shadows.get(name)
            && sha_ok(&s.shadow_sha256)
            && !s.shadow_sha256.is_empty()
        {
            f.shadow_per_node
                .insert(node.clone(), (s.total(), s.divergences));
            for sample in &s.samples {
                let pair = (node.clone(), sample.clone());
                if !f.samples.contains(&pair) {
                    f.samples.push(pair);
                }
            }
        }
        if let Some(s) = v.shadows.get(name)
            && let Some(e) = &s.load_error
            && shadow_version.is_some()
        {
            f.nacked
                .insert(node.clone(), format!("the shadow did not load: {e}"));
        }
    }
    let skip = f.samples.len().saturating_sub(SAMPLES);
    f.samples.drain(..skip);
    f.calls = f.per_node.values().map(|x| x.0).sum();
    f.failures = f.per_node.values().map(|x| x.1).sum();
    f.decisions = f.shadow_per_node.values().map(|x| x.0).sum();
    f.divergences = f.shadow_per_node.values().map(|x| x.1).sum();
    r.figures = f;
}

/// The threshold the figures cross, if any, said with the figures.
fn crossed(plan: &Plan, f: &Figures) -> Option<String> {
    let t = &plan.abort_when;
    let list = |m: &BTreeMap<String, String>| {
        m.iter()
            .map(|(n, why)| format!("{n}: {why}"))
            .collect::<Vec<_>>()
            .join("; ")
    };
    for (nodes, max, what) in [
        (&f.nacked, t.nacks, "refused the version"),
        (&f.rolled_back, t.rollbacks, "rolled the version back"),
    ] {
        if nodes.len() > max as usize {
            return Some(format!(
                "{} node(s) {what} (at most {max} allowed): {}",
                nodes.len(),
                list(nodes)
            ));
        }
    }
    if let Some(max) = t.failure_ratio
        && f.calls >= t.min_calls
        && ratio(f.failures, f.calls) > max
    {
        return Some(format!(
            "failure ratio {:.4} ({} of {} calls) is over {max}",
            ratio(f.failures, f.calls),
            f.failures,
            f.calls
        ));
    }
    if let Some(max) = t.divergence_ratio
        && f.decisions >= t.min_calls
        && ratio(f.divergences, f.decisions) > max
    {
        let mut why = format!(
            "shadow divergence ratio {:.4} ({} of {} decisions) is over {max}",
            ratio(f.divergences, f.decisions),
            f.divergences,
            f.decisions
        );
        if let Some((node, s)) = f.samples.last() {
            why.push_str(&format!(
                "; e.g. on {node}: {} {} -> {} ({} -> {}): serving {}, shadow {}{}",
                s.direction,
                s.source,
                s.destination,
                if s.source_workload.is_empty() {
                    "?"
                } else {
                    &s.source_workload
                },
                if s.destination_workload.is_empty() {
                    "?"
                } else {
                    &s.destination_workload
                },
                s.serving,
                s.shadow,
                if s.shadow_reason.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", s.shadow_reason)
                }
            ));
        }
        return Some(why);
    }
    None
}

/// One step for plugin `name`: `entry` is the resource as its source gives it (with a plan); on return its `nodes`,
/// `base` and `shadowing` say what each node gets. `record` is updated (and `changed` says so).
pub fn step(
    name: &str,
    entry: &mut PluginEntry,
    record: &mut Record,
    fleet: &Fleet,
    now: SystemTime,
) -> Step {
    // Not the stable version's bytes: its version says whether it changed.
    let stable_before = record.stable.as_ref().map(|s| s.version.clone());
    let rollout_before = record.rollout.clone();
    let mut out = step_inner(name, entry, record, fleet, now);
    let stable_changed = record.stable.as_ref().map(|s| &s.version) != stable_before.as_ref();
    out.changed = stable_changed || record.rollout != rollout_before;
    out.progressed = stable_changed
        || match (&record.rollout, &rollout_before) {
            (Some(a), Some(b)) => {
                Rollout {
                    figures: Figures::default(),
                    ..a.clone()
                } != Rollout {
                    figures: Figures::default(),
                    ..b.clone()
                }
            }
            (a, b) => a.is_some() != b.is_some(),
        };
    out
}

fn step_inner(
    name: &str,
    entry: &mut PluginEntry,
    record: &mut Record,
    fleet: &Fleet,
    now: SystemTime,
) -> Step {
    let Some(plan) = entry.plan.clone() else {
        // Served at once; it is what a later staged version replaces.
        // (The bytes are encoded only when the version changed.)
        if record
            .stable
            .as_ref()
            .is_none_or(|s| s.version != entry.current.version || s.info != entry.info)
        {
            record.stable = Some(StoredVersion::of(&entry.current, &entry.info));
        }
        return Step::default();
    };
    let target = entry.current.clone();
    if record
        .stable
        .as_ref()
        .is_some_and(|s| s.version == target.version)
    {
        // Rolled out already (or back to the stable version): every node serves it.
        entry.nodes = None;
        entry.base = None;
        entry.base_info = None;
        entry.shadowing = None;
        return Step::default();
    }
    let stable = record.stable.clone();
    let base = stable.as_ref().and_then(|s| s.resource(name));
    if record
        .rollout
        .as_ref()
        .is_none_or(|r| r.target_version != target.version)
    {
        let mut r = Rollout {
            target_version: target.version.clone(),
            target_sha256: entry.info.sha256.clone(),
            previous_version: stable.as_ref().map(|s| s.version.clone()),
            previous_sha256: stable.as_ref().and_then(|s| s.info.sha256.clone()),
            state: Progress::Progressing,
            stage: 0,
            stages: plan.stages.len(),
            phase: Phase::Serving,
            nodes: Vec::new(),
            stage_from: 0,
            ready_at_ms: None,
            started_at_ms: ms(now),
            figures: Figures::default(),
            abort: None,
            timeline: Vec::new(),
        };
        r.phase = first_phase(&plan, 0, base.is_some());
        let text = format!(
            "started: version {}{}, {} stage(s), replacing {}",
            r.target_version,
            code_of(r.target_sha256.as_deref()),
            plan.stages.len(),
            match &r.previous_version {
                Some(v) => format!("version {v}{}", code_of(r.previous_sha256.as_deref())),
                None => "nothing".into(),
            }
        );
        event(&mut r, now, text);
        record.rollout = Some(r);
    }
    let Some(r) = record.rollout.as_mut() else {
        return Step::default();
    };
    entry.base = base.clone();
    entry.base_info = stable.as_ref().map(|s| s.info.clone());
    entry.shadowing = None;
    match r.state {
        Progress::Aborted => {
            entry.nodes = Some(NodeSelector(Vec::new()));
            return Step {
                withdraw: base.is_none(),
                ..Step::default()
            };
        }
        Progress::Complete => {
            // Complete but not stable: only when the stable record was lost; it is stable now.
            record.stable = Some(StoredVersion::of(&target, &entry.info));
            entry.nodes = None;
            entry.base = None;
            entry.base_info = None;
            return Step::default();
        }
        Progress::Progressing => {}
    }
    let order = order(name, fleet, entry.placement.as_ref());
    let mut deadline = None;
    // A stage that bakes clean moves on at once, so one step may pass several (a zero bake).
    for _ in 0..=plan.stages.len() * 2 {
        let stage = &plan.stages[r.stage];
        let want = stage.size.of(order.len());
        for n in &order {
            if r.nodes.len() >= want.max(r.stage_from) {
                break;
            }
            if !r.nodes.contains(n) {
                r.nodes.push(n.clone());
            }
        }
        let shadow = match (r.phase, &base) {
            (Phase::Shadow, Some(b)) => shadowing(name, b, &target),
            _ => None,
        };
        let (serving, shadowed) = match &shadow {
            Some(_) => {
                let (a, b) = r.nodes.split_at(r.stage_from.min(r.nodes.len()));
                (a.to_vec(), b.to_vec())
            }
            None => (r.nodes.clone(), Vec::new()),
        };
        entry.nodes = Some(NodeSelector(serving.clone()));
        entry.shadowing = shadow
            .as_ref()
            .map(|s| (NodeSelector(shadowed.clone()), s.clone()));
        observe(name, r, fleet, shadow.as_ref().map(|s| s.version.as_str()));
        if let Some(why) = crossed(&plan, &r.figures) {
            let phase = r.phase;
            r.abort = Some(Abort {
                stage: r.stage + 1,
                phase,
                nodes: r.nodes.clone(),
                reason: why.clone(),
                at: rfc3339(now),
            });
            r.state = Progress::Aborted;
            let back = match &r.previous_version {
                Some(v) => format!("version {v}{}", code_of(r.previous_sha256.as_deref())),
                None => "no version (the plugin is withdrawn)".into(),
            };
            event(
                r,
                now,
                format!("aborted: {why}; every node goes back to {back}"),
            );
            tracing::warn!(plugin = name, reason = %why, "staged rollout aborted");
            entry.nodes = Some(NodeSelector(Vec::new()));
            entry.shadowing = None;
            return Step {
                withdraw: base.is_none(),
                ..Step::default()
            };
        }
        // Ready: the stage has its nodes and every connected one runs what it should.
        let runs = |node: &String, version: &str| {
            fleet
                .nodes
                .get(node)
                .is_none_or(|v| v.acked.get(name).is_some_and(|a| a == version))
        };
        let ready = want > 0
            && r.nodes.len() >= want
            && serving.iter().all(|n| runs(n, &target.version))
            && shadow
                .as_ref()
                .is_none_or(|s| shadowed.iter().all(|n| runs(n, &s.version)));
        if !ready {
            return Step {
                deadline,
                ..Step::default()
            };
        }
        let ready_at = match r.ready_at_ms {
            Some(t) => at_ms(t),
            None => {
                r.ready_at_ms = Some(ms(now));
                let what = match r.phase {
                    Phase::Shadow => "runs the version as a shadow",
                    Phase::Serving => "serves the version",
                };
                let n = r.nodes.len() - if shadow.is_some() { r.stage_from } else { 0 };
                let text = format!(
                    "{n} of {} node(s) {what} ({}); baking {}",
                    order.len(),
                    stage.size,
                    humantime::format_duration(stage.bake)
                );
                event(r, now, text);
                now
            }
        };
        let done = ready_at + stage.bake;
        if now < done {
            deadline = Some(done);
            return Step {
                deadline,
                ..Step::default()
            };
        }
        // Baked clean.
        r.ready_at_ms = None;
        if r.phase == Phase::Shadow {
            r.phase = Phase::Serving;
            let f = &r.figures;
            let text = format!(
                "shadow baked clean ({} decisions, {} divergent); serving",
                f.decisions, f.divergences
            );
            event(r, now, text);
            continue;
        }
        let f = &r.figures;
        let text = format!(
            "stage baked clean ({} calls, {} failed); {} node(s) serve the version",
            f.calls,
            f.failures,
            r.nodes.len()
        );
        event(r, now, text);
        if r.stage + 1 < plan.stages.len() {
            r.stage += 1;
            r.stage_from = r.nodes.len();
            r.phase = first_phase(&plan, r.stage, base.is_some());
            continue;
        }
        r.state = Progress::Complete;
        event(r, now, "complete: every node serves the version".into());
        record.stable = Some(StoredVersion::of(&target, &entry.info));
        entry.nodes = None;
        entry.base = None;
        entry.base_info = None;
        entry.shadowing = None;
        return Step::default();
    }
    Step {
        deadline,
        ..Step::default()
    }
}

/// What each node gets of plugin `name` as `record` says, without stepping it (a replica that serves what its
/// leader decided): the stable version while no rollout of this version is recorded, the stage's nodes and phase
/// while one progresses, every node back on the stable version once it aborted. `base` is the stable version's
/// resource as this replica serves it. (The WeftPlugin controller's replicas serve what the leader records in the
/// resources' status this way.)
pub fn serve(
    name: &str,
    entry: &mut PluginEntry,
    record: &Record,
    base: Option<Arc<Resource>>,
) -> Step {
    if entry.plan.is_none() {
        return Step::default();
    }
    let target = entry.current.clone();
    let stable = record.stable.as_ref();
    let unrestricted = |entry: &mut PluginEntry| {
        entry.nodes = None;
        entry.base = None;
        entry.base_info = None;
        entry.shadowing = None;
    };
    if stable.is_some_and(|s| s.version == target.version) {
        unrestricted(entry);
        return Step::default();
    }
    entry.base = base.clone();
    entry.base_info = stable.map(|s| s.info.clone());
    entry.shadowing = None;
    entry.nodes = Some(NodeSelector(Vec::new()));
    let Some(r) = record
        .rollout
        .as_ref()
        .filter(|r| r.target_version == target.version)
    else {
        // Not started yet: everyone keeps the stable version.
        return Step::default();
    };
    match r.state {
        Progress::Aborted => Step {
            withdraw: base.is_none(),
            ..Step::default()
        },
        Progress::Complete => {
            unrestricted(entry);
            Step::default()
        }
        Progress::Progressing => {
            let shadow = match (r.phase, &base) {
                (Phase::Shadow, Some(b)) => shadowing(name, b, &target),
                _ => None,
            };
            let from = r.stage_from.min(r.nodes.len());
            match shadow {
                Some(s) => {
                    entry.nodes = Some(NodeSelector(r.nodes[..from].to_vec()));
                    entry.shadowing = Some((NodeSelector(r.nodes[from..].to_vec()), s));
                }
                None => entry.nodes = Some(NodeSelector(r.nodes.clone())),
            }
            Step::default()
        }
    }
}

/// ` (code <first 12 hex digits of its sha256>)`, when known.
fn code_of(sha256: Option<&str>) -> String {
    sha256.map_or(String::new(), |s| {
        format!(" (code {})", &s[..s.len().min(12)])
    })
}

fn first_phase(plan: &Plan, stage: usize, has_base: bool) -> Phase {
    if plan.stages[stage].shadow_first && has_base {
        Phase::Shadow
    } else {
        Phase::Serving
    }
}

#[cfg(test)]
mod tests;
