//! Per-plugin status lines for `/config_dump`.

use serde::Serialize;
use weft_state::{FailurePolicy, PluginKind};

use crate::host::PluginHost;

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
    /// Denials so far.
    pub denials: u64,
    /// Live instances.
    pub instances: i64,
    /// Idle instances in the serving version's pool.
    pub idle_instances: usize,
}

impl PluginHost {
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
                    denials: c.map_or(0, |c| c.denials.get()),
                    instances: c.map_or(0, |c| c.instances.get()),
                    idle_instances: serving.map_or(0, |v| v.idle_instances()),
                }
            })
            .collect()
    }
}
