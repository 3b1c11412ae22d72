//! Per-call time budgets measured in the calling thread's CPU time. The epoch ticker only wakes the check: when
//! a call's epoch deadline passes, the callback compares the CPU time the thread really spent in the call with the
//! budget, so a call preempted by the OS (a busy node, more threads than cores) is not killed for time it never
//! ran, while a runaway plugin is stopped once it has burnt its budget. A wall-clock cap (100× the budget) bounds
//! the worst case anyway.

use std::time::{Duration, Instant};

use wasmtime::{StoreContextMut, UpdateDeadline};

use crate::store::StoreData;

/// The CPU time the current thread has used.
#[allow(unsafe_code)]
pub(crate) fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `clock_gettime` writes one `timespec` through a valid, exclusive pointer; CLOCK_THREAD_CPUTIME_ID
    // exists on every Linux we run on. On failure `ts` stays zero, which only makes the budget stricter.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return Duration::ZERO;
    }
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// The budget of the call in progress.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Budget {
    cpu_start: Duration,
    wall_start: Instant,
    cpu_budget: Duration,
    tick: Duration,
}

impl Budget {
    pub fn new(tick: Duration) -> Self {
        Self {
            cpu_start: Duration::ZERO,
            wall_start: Instant::now(),
            cpu_budget: Duration::ZERO,
            tick,
        }
    }

    /// Starts a call with `budget`; returns the epoch ticks to the first check.
    pub fn start(&mut self, budget: Duration) -> u64 {
        self.cpu_start = thread_cpu_time();
        self.wall_start = Instant::now();
        self.cpu_budget = budget;
        ticks(budget, self.tick)
    }

    fn check(&self) -> UpdateDeadline {
        let used = thread_cpu_time().saturating_sub(self.cpu_start);
        if used >= self.cpu_budget || self.wall_start.elapsed() >= self.cpu_budget * 100 {
            UpdateDeadline::Interrupt
        } else {
            UpdateDeadline::Continue(ticks(self.cpu_budget - used, self.tick))
        }
    }
}

/// Ticks for a duration, rounded up, plus one (a tick may land right after the call starts), at least two.
pub(crate) fn ticks(d: Duration, tick: Duration) -> u64 {
    let tick = tick.as_nanos().max(1);
    (d.as_nanos().div_ceil(tick) as u64)
        .saturating_add(1)
        .max(2)
}

/// The store's epoch-deadline callback.
pub(crate) fn on_deadline(
    store: StoreContextMut<'_, StoreData>,
) -> wasmtime::Result<UpdateDeadline> {
    Ok(store.data().budget.check())
}
