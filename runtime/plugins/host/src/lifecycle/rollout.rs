//! Safe rollout: a version swapped in over a serving one is on probation for a window; if its share of failed
//! calls (traps, deadline overruns) passes the plugin's threshold over at least `min_calls` calls, the previous
//! version (kept warm for the window) is swapped back, counted, logged and reported to subscribers; the same
//! version is then refused until different code arrives.
//!
//! The data path only bumps atomics and compares them; the swap back runs on the rollout thread (woken by the
//! call that crossed the threshold), never on a connection's thread. Time comes from an injected [`crate::base::clock::Clock`].

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde::Serialize;

use crate::versions::probation::Probation;
use crate::versions::version::PluginVersion;

/// One automatic rollback, as reported to the control plane.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RollbackEvent {
    /// The plugin.
    pub plugin: String,
    /// sha256 of the code rolled back.
    pub rolled_back_sha256: String,
    /// sha256 of the code serving again.
    pub restored_sha256: String,
    /// Calls the rolled-back version served on probation.
    pub calls: u64,
    /// Of which failed (traps + timeouts).
    pub failures: u64,
    /// Traps (including memory and stack exhaustion and refused output).
    pub traps: u64,
    /// Deadline overruns.
    pub timeouts: u64,
    /// Time from the swap to the rollback.
    #[serde(with = "secs")]
    pub after: Duration,
    /// The threshold passed.
    pub max_failure_ratio: f64,
    /// Wall-clock time of the rollback.
    #[serde(skip)]
    pub at: SystemTime,
}

mod secs {
    pub fn serialize<S: serde::Serializer>(
        d: &std::time::Duration,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        s.serialize_f64(d.as_secs_f64())
    }
}

impl RollbackEvent {
    /// The rollback of `plugin`'s version `rolled_back` (whose probation is `probation`) for `restored`, at `now`
    /// on the probation clock.
    pub(crate) fn new(
        plugin: &str,
        probation: &Probation,
        rolled_back: &str,
        restored: &str,
        now: Duration,
    ) -> Self {
        RollbackEvent {
            plugin: plugin.to_string(),
            rolled_back_sha256: rolled_back.to_string(),
            restored_sha256: restored.to_string(),
            calls: probation.calls(),
            failures: probation.failures(),
            traps: probation.traps(),
            timeouts: probation.timeouts(),
            after: now.saturating_sub(probation.started),
            max_failure_ratio: probation.policy.max_failure_ratio(),
            at: SystemTime::now(),
        }
    }

    /// The reason a rollback gives (logs, NACKs, status).
    pub fn reason(&self) -> String {
        format!(
            "rolled back automatically: {failures} of {calls} calls failed ({traps} traps, {timeouts} timeouts) \
             within {after:.1?} of the swap, over the threshold of {ratio:.1}%; code sha256 {sha} is refused \
             until different code arrives",
            failures = self.failures,
            calls = self.calls,
            traps = self.traps,
            timeouts = self.timeouts,
            after = self.after,
            ratio = self.max_failure_ratio * 100.0,
            sha = self.rolled_back_sha256,
        )
    }
}

/// A version on probation and the one it replaced (kept warm to swap back at once).
pub(crate) struct OnProbation {
    pub probation: Arc<Probation>,
    pub previous: Arc<PluginVersion>,
}

/// A version refused after a rollback: its code, and its config when only the config differed from the version
/// restored (then the same code with another config may load).
#[derive(Debug, Clone)]
pub(crate) struct Refusal {
    pub sha256: String,
    pub config: Option<String>,
    pub event: RollbackEvent,
}

impl Refusal {
    pub fn refuses(&self, sha256: &str, config: &str) -> bool {
        self.sha256 == sha256 && self.config.as_deref().is_none_or(|c| c == config)
    }
}

/// Probations and refusals, per plugin name (inside the host's `Applied`).
#[derive(Default)]
pub(crate) struct RolloutState {
    pub probations: BTreeMap<String, OnProbation>,
    pub refused: BTreeMap<String, Refusal>,
}
