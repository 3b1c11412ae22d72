//! Safe rollout: a version swapped in over a serving one is on probation for a window; if its share of failed
//! calls (traps, deadline overruns) passes the plugin's threshold over at least `min_calls` calls, the previous
//! version (kept warm for the window) is swapped back, counted, logged and reported to subscribers; the same
//! version is then refused until different code arrives.
//!
//! The data path only bumps atomics and compares them; the swap back runs on the rollout thread (woken by the
//! call that crossed the threshold), never on a connection's thread. Time comes from an injected [`Clock`].

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use serde::Serialize;
use weft_state::PluginRollout;

use crate::error::ErrorKind;
use crate::plugin::PluginVersion;

/// Monotonic time for probation windows (injected so tests drive it).
pub trait Clock: Send + Sync + std::fmt::Debug {
    /// Time since an arbitrary fixed start.
    fn now(&self) -> Duration;
}

/// The real monotonic clock.
#[derive(Debug)]
pub struct SystemClock(Instant);

impl Default for SystemClock {
    fn default() -> Self {
        Self(Instant::now())
    }
}

impl Clock for SystemClock {
    fn now(&self) -> Duration {
        self.0.elapsed()
    }
}

/// A clock that moves only when told (tests).
#[derive(Debug, Default)]
pub struct ManualClock(Mutex<Duration>);

impl ManualClock {
    /// Moves the clock forward.
    pub fn advance(&self, by: Duration) {
        let mut t = self.0.lock().unwrap_or_else(|p| p.into_inner());
        *t += by;
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Duration {
        *self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The node's default probation (a plugin's own `rollout` overrides it): 60 s, more than 20 % failed calls over
/// at least 20 calls.
pub fn default_rollout() -> PluginRollout {
    PluginRollout {
        window: Duration::from_secs(60),
        max_failure_ppm: 200_000,
        min_calls: 20,
        disabled: false,
    }
}

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

/// A message to the rollout thread.
pub(crate) enum Wake {
    /// A probation crossed its threshold or its window ended: look.
    Check,
    Stop,
}

/// One version's probation, shared by the data path (counting) and the rollout thread (judging).
#[derive(Debug)]
pub(crate) struct Probation {
    pub policy: PluginRollout,
    pub started: Duration,
    clock: Arc<dyn Clock>,
    calls: AtomicU64,
    traps: AtomicU64,
    timeouts: AtomicU64,
    /// Still counting (false once fired or expired).
    active: AtomicBool,
    fired: AtomicBool,
    wake: Mutex<mpsc::Sender<Wake>>,
}

/// What the data path saw of one call.
#[derive(Debug, Clone, Copy)]
pub(crate) enum CallOutcome {
    Ok,
    Failed(ErrorKind),
}

impl Probation {
    pub fn new(policy: PluginRollout, clock: Arc<dyn Clock>, wake: mpsc::Sender<Wake>) -> Self {
        Self {
            policy,
            started: clock.now(),
            clock,
            calls: AtomicU64::new(0),
            traps: AtomicU64::new(0),
            timeouts: AtomicU64::new(0),
            active: AtomicBool::new(true),
            fired: AtomicBool::new(false),
            wake: Mutex::new(wake),
        }
    }

    fn wake(&self) {
        if let Ok(tx) = self.wake.lock() {
            let _ = tx.send(Wake::Check);
        }
    }

    /// Counts one call (data path: atomics and one clock read while on probation; nothing after).
    pub fn record(&self, outcome: CallOutcome) {
        if !self.active.load(Ordering::Relaxed) {
            return;
        }
        if self.clock.now().saturating_sub(self.started) > self.policy.window {
            if self.active.swap(false, Ordering::AcqRel) {
                self.wake();
            }
            return;
        }
        let calls = self.calls.fetch_add(1, Ordering::Relaxed) + 1;
        match outcome {
            CallOutcome::Ok => {}
            CallOutcome::Failed(ErrorKind::Timeout) => {
                self.timeouts.fetch_add(1, Ordering::Relaxed);
            }
            CallOutcome::Failed(
                ErrorKind::Trap
                | ErrorKind::Memory
                | ErrorKind::StackOverflow
                | ErrorKind::BadOutput,
            ) => {
                self.traps.fetch_add(1, Ordering::Relaxed);
            }
            // Pool capacity, not the plugin's code: counted as calls, not failures.
            CallOutcome::Failed(ErrorKind::Instantiate | ErrorKind::NoInstance) => {}
        }
        if calls >= u64::from(self.policy.min_calls.max(1)) && self.over_threshold() {
            self.active.store(false, Ordering::Release);
            if !self.fired.swap(true, Ordering::AcqRel) {
                self.wake();
            }
        }
    }

    fn failures(&self) -> u64 {
        self.traps.load(Ordering::Relaxed) + self.timeouts.load(Ordering::Relaxed)
    }

    fn over_threshold(&self) -> bool {
        let calls = self.calls.load(Ordering::Relaxed);
        calls > 0 && (self.failures() as f64) > self.policy.max_failure_ratio() * calls as f64
    }

    pub fn fired(&self) -> bool {
        self.fired.load(Ordering::Acquire)
    }

    /// Whether the window has passed without a rollback.
    pub fn expired(&self, now: Duration) -> bool {
        !self.fired() && now.saturating_sub(self.started) > self.policy.window
    }

    pub fn event(
        &self,
        plugin: &str,
        rolled_back: &str,
        restored: &str,
        now: Duration,
    ) -> RollbackEvent {
        RollbackEvent {
            plugin: plugin.to_string(),
            rolled_back_sha256: rolled_back.to_string(),
            restored_sha256: restored.to_string(),
            calls: self.calls.load(Ordering::Relaxed),
            failures: self.failures(),
            traps: self.traps.load(Ordering::Relaxed),
            timeouts: self.timeouts.load(Ordering::Relaxed),
            after: now.saturating_sub(self.started),
            max_failure_ratio: self.policy.max_failure_ratio(),
            at: SystemTime::now(),
        }
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
