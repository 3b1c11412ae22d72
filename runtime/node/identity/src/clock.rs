//! Wall time as the secret manager sees it, behind a trait so tests can drive it with tokio's paused clock.

use std::fmt::Debug;
use std::time::SystemTime;

/// A source of wall-clock time (certificate validity is judged against it).
pub trait WallClock: Send + Sync + Debug {
    /// The current wall time.
    fn now(&self) -> SystemTime;
}

/// The operating system's clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl WallClock for SystemClock {
    fn now(&self) -> SystemTime {
        SystemTime::now()
    }
}

/// Wall time that moves with tokio's clock: the system time when it was made plus the tokio time elapsed since.
/// Under a paused tokio clock (`start_paused`, `tokio::time::advance`) it stands still or jumps exactly as the test
/// says, so renewals, expiries and backoffs happen at the same virtual instants on any machine.
#[derive(Debug, Clone, Copy)]
pub struct TokioWallClock {
    wall0: SystemTime,
    mono0: tokio::time::Instant,
}

impl TokioWallClock {
    /// A clock starting at the current system time.
    pub fn new() -> Self {
        Self {
            wall0: SystemTime::now(),
            mono0: tokio::time::Instant::now(),
        }
    }
}

impl Default for TokioWallClock {
    fn default() -> Self {
        Self::new()
    }
}

impl WallClock for TokioWallClock {
    fn now(&self) -> SystemTime {
        self.wall0 + self.mono0.elapsed()
    }
}
