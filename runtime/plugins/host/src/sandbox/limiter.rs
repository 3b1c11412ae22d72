//! The sandbox's caps on one instance: its memory and tables (a `ResourceLimiter`), and the token bucket that
//! rate-limits a plugin's log lines.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use wasmtime::{ResourceLimiter, Result};

/// A token bucket for log lines (per plugin name; all instances share it).
#[derive(Debug)]
pub(crate) struct LogLimiter {
    per_sec: u32,
    state: Mutex<(f64, Instant)>,
    pub dropped: AtomicU64,
}

impl LogLimiter {
    pub fn new(per_sec: u32) -> Self {
        Self {
            per_sec,
            state: Mutex::new((f64::from(per_sec), Instant::now())),
            dropped: AtomicU64::new(0),
        }
    }

    /// Takes a token: whether one more line may be written now (a refused one is counted in `dropped`).
    pub fn allow(&self) -> bool {
        let Ok(mut st) = self.state.lock() else {
            return false;
        };
        let now = Instant::now();
        let refill = now.duration_since(st.1).as_secs_f64() * f64::from(self.per_sec);
        st.0 = (st.0 + refill).min(f64::from(self.per_sec.max(1)));
        st.1 = now;
        if st.0 >= 1.0 {
            st.0 -= 1.0;
            true
        } else {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            false
        }
    }
}

/// The sandbox's memory and table caps. Hitting the memory cap traps (and is remembered, to report the failure
/// as `memory` rather than a generic trap).
#[derive(Debug)]
pub(crate) struct Limiter {
    pub memory_limit: usize,
    pub memory_hit: bool,
}

const MAX_TABLE_ELEMENTS: usize = 100_000;

impl ResourceLimiter for Limiter {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> Result<bool> {
        if desired > self.memory_limit {
            self.memory_hit = true;
            return Err(wasmtime::format_err!(
                "memory limit of {} bytes exceeded (wanted {desired})",
                self.memory_limit
            ));
        }
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> Result<bool> {
        Ok(desired <= MAX_TABLE_ELEMENTS)
    }

    fn instances(&self) -> usize {
        32
    }

    fn tables(&self) -> usize {
        32
    }

    fn memories(&self) -> usize {
        4
    }
}
