//! Monotonic time, injected so tests drive it: the real clock and a manual one. Shared by the node (the DNS
//! cache's TTLs) and the plugin platform (probation windows).

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Monotonic time (injected so tests drive it).
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
