//! A version's probation counter: while a version that replaced a serving one is on probation, every call it serves
//! is counted here (atomics only, on the data path); the call that crosses the threshold, or the first one after
//! the window, wakes the rollout thread, which judges (see `lifecycle::rollout`).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use weft_state::PluginRollout;

use crate::base::clock::Clock;
use crate::base::error::ErrorKind;

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

    /// Calls counted so far.
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }

    /// Traps counted so far (memory, stack, refused output included).
    pub fn traps(&self) -> u64 {
        self.traps.load(Ordering::Relaxed)
    }

    /// Deadline overruns counted so far.
    pub fn timeouts(&self) -> u64 {
        self.timeouts.load(Ordering::Relaxed)
    }

    /// Failed calls counted so far (traps and timeouts).
    pub fn failures(&self) -> u64 {
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
}
