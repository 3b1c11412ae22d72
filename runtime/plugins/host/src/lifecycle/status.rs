//! Per-plugin status lines for `/config_dump`.

use std::collections::BTreeMap;

use serde::Serialize;
use weft_state::{FailurePolicy, PluginKind};

use super::plugins::Plugins;
use super::rollout::RollbackEvent;
use crate::base::error::ErrorKind;

/// One plugin's status.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PluginStatus {
    /// Plugin name.
    pub name: String,
    /// `policy` or `telemetry`.
    pub kind: &'static str,
    /// `serving`, `rejected` (nothing serves for this name) or `serving-previous` (the latest spec was rejected,
    /// the previous version serves).
    pub state: &'static str,
    /// sha256 of the serving code.
    pub sha256: Option<String>,
    /// Unix seconds when the serving version was loaded.
    pub loaded_at: Option<u64>,
    /// Chain order (lower first).
    pub priority: i32,
    /// `fail-closed` or `fail-open`.
    pub failure_policy: &'static str,
    /// Directions a policy plugin runs in.
    pub directions: Vec<&'static str>,
    /// Whether live connections are re-checked when it changes.
    pub recheck: bool,
    /// Why the latest spec was rejected, if it was.
    pub last_error: Option<String>,
    /// Calls so far (all versions).
    pub calls: u64,
    /// Which connections the serving version is asked about: `all`, or the destinations its `authorize-scope`
    /// declared (policy plugins).
    pub scope: Option<String>,
    /// Connections the spec selected that the scope left out, allowed without a call (all versions).
    pub out_of_scope: u64,
    /// Denials so far.
    pub denials: u64,
    /// Live instances.
    pub instances: i64,
    /// Idle instances in the serving version's pool.
    pub idle_instances: usize,
    /// Instances of the serving version checked out by calls right now.
    pub busy_instances: usize,
    /// How many instances the serving version's pool keeps (refilled in the background).
    pub pool_target: usize,
    /// Failed calls so far by kind (`timeout`, `memory`, `stack_overflow`, `trap`, `bad_output`, `no_instance`;
    /// `instantiate` counts failed background refills). Only kinds that happened are listed.
    pub errors: BTreeMap<&'static str, u64>,
    /// Failed background refills in a row of the serving version's pool (0 while it is healthy).
    pub refill_failures: u32,
    /// Why the background refill of the serving version's pool is failing (while it is).
    pub refill_error: Option<String>,
    /// Whether the serving version is on probation (it replaced another one less than its window ago).
    pub on_probation: bool,
    /// The last automatic rollback of this plugin, if any is still in force (its version refused).
    pub rolled_back: Option<RollbackEvent>,
}

impl Plugins {
    /// The Istio authorization policies in force that no serving policy plugin enforces at all, each with why
    /// (empty when one does, or the operator opted out with `--allow-unenforced-policies`). Connections to the
    /// workloads they apply to are denied.
    pub fn unenforced_policies(&self) -> Vec<String> {
        let chain = self.chain.load();
        match &chain.unenforced {
            Some(u) if chain.enforces_no_policy() => u
                .keys()
                .into_iter()
                .map(|k| crate::lifecycle::enforce::reason(&k))
                .collect(),
            _ => Vec::new(),
        }
    }

    /// A status line per configured plugin, in name order.
    pub fn status(&self) -> Vec<PluginStatus> {
        let Ok(applied) = self.applied.lock() else {
            return Vec::new();
        };
        applied
            .specs
            .iter()
            .map(|(name, spec)| {
                let serving = applied.serving.get(name);
                let rejected = applied.rejected.get(name).map(|(_, r)| r.clone());
                let shown = serving.map_or(spec, |v| &v.spec);
                let c = serving.map(|v| &v.ctx.counters);
                let pool = serving.map(|v| v.pool_status()).unwrap_or_default();
                PluginStatus {
                    name: name.clone(),
                    kind: match shown.kind {
                        PluginKind::Policy => "policy",
                        PluginKind::Telemetry => "telemetry",
                    },
                    state: match (serving.is_some(), rejected.is_some()) {
                        (true, false) => "serving",
                        (true, true) => "serving-previous",
                        _ => "rejected",
                    },
                    sha256: serving.map(|v| v.sha256.clone()),
                    loaded_at: serving.and_then(|v| {
                        v.loaded_at
                            .duration_since(std::time::UNIX_EPOCH)
                            .ok()
                            .map(|d| d.as_secs())
                    }),
                    priority: shown.priority,
                    failure_policy: match shown.failure_policy {
                        FailurePolicy::FailClosed => "fail-closed",
                        FailurePolicy::FailOpen => "fail-open",
                    },
                    directions: [
                        (shown.directions.inbound, "inbound"),
                        (shown.directions.outbound, "outbound"),
                    ]
                    .into_iter()
                    .filter_map(|(on, d)| on.then_some(d))
                    .collect(),
                    recheck: shown.recheck,
                    last_error: rejected,
                    calls: c.map_or(0, |c| c.calls.get()),
                    scope: serving
                        .filter(|v| v.spec.kind == PluginKind::Policy)
                        .map(|v| v.scope.describe()),
                    out_of_scope: c.map_or(0, |c| c.out_of_scope.get()),
                    denials: c.map_or(0, |c| c.denials.get()),
                    instances: c.map_or(0, |c| c.instances.get()),
                    idle_instances: pool.idle,
                    busy_instances: pool.busy,
                    pool_target: pool.target,
                    errors: c.map_or_else(BTreeMap::new, |c| {
                        ErrorKind::ALL
                            .iter()
                            .map(|k| (k.as_str(), c.error(*k).get()))
                            .filter(|(_, n)| *n > 0)
                            .collect()
                    }),
                    refill_failures: pool.refill_failures,
                    refill_error: pool.refill_error,
                    on_probation: applied.rollout.probations.contains_key(name),
                    rolled_back: applied.rollout.refused.get(name).map(|r| r.event.clone()),
                }
            })
            .collect()
    }
}
