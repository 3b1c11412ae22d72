//! Per-call time budgets measured in the calling thread's CPU time. The epoch ticker only wakes the check: when
//! a call's epoch deadline passes, the callback compares the CPU time the thread really spent in the call with the
//! budget, so a call preempted by the OS (a busy node, more threads than cores) is not killed for time it never
//! ran, while a runaway plugin is stopped once it has burnt its budget. A wall-clock cap (100× the budget) bounds
//! the worst case anyway.
//!
//! Reading a thread's CPU clock is a system call (about a microsecond, a third of a whole policy decision), so a
//! call does not read it when it starts: it takes an upper bound from the thread's last reading plus the wall time
//! since (a thread's CPU time cannot grow faster than the wall clock), and reads the clock only when that reading
//! is older than half the call's budget (at most [`CPU_CLOCK_REFRESH`]). A start that is too late can only make the
//! measured use smaller, by at most that age: a call gets at most 1.5× its budget, whatever the budget, never
//! less. The check, which runs only for calls that outlive an epoch deadline, reads the clock itself.

use std::cell::Cell;
use std::time::{Duration, Instant};

use wasmtime::UpdateDeadline;

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

/// The oldest this thread's last CPU clock reading may be before a call start reads the clock again; a call's own
/// limit is the smaller of this and half its budget ([`refresh_for`]), so a call gets at most 1.5× its budget. The
/// reading costs several microseconds on a virtual machine (a profile at 9,000 connections/s put a quarter of
/// `authorize`'s time in it at a 2 ms refresh).
pub(crate) const CPU_CLOCK_REFRESH: Duration = Duration::from_millis(5);

/// How old a reading a call with `budget` may start from: half the budget, at most [`CPU_CLOCK_REFRESH`].
pub(crate) fn refresh_for(budget: Duration) -> Duration {
    (budget / 2).min(CPU_CLOCK_REFRESH)
}

thread_local! {
    /// This thread's last CPU clock reading and the wall time it was taken at.
    static LAST_CPU_READING: Cell<Option<(Duration, Instant)>> = const { Cell::new(None) };
}

/// The current thread's CPU time, read now, remembered for [`thread_cpu_time_upper_bound`].
fn read_thread_cpu_time(now: Instant) -> Duration {
    let cpu = thread_cpu_time();
    LAST_CPU_READING.with(|r| r.set(Some((cpu, now))));
    cpu
}

/// A value at least the current thread's CPU time at `now` and at most `max_age` above it: the last reading plus
/// the wall time since, or a fresh reading when the last is older than `max_age` (or from the future, which `now`
/// being an earlier instant would mean).
pub(crate) fn thread_cpu_time_upper_bound(now: Instant, max_age: Duration) -> Duration {
    match LAST_CPU_READING.with(Cell::get) {
        Some((cpu, at)) if now >= at && now - at <= max_age => cpu + (now - at),
        _ => read_thread_cpu_time(now),
    }
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
        let now = Instant::now();
        self.cpu_start = thread_cpu_time_upper_bound(now, refresh_for(budget));
        self.wall_start = now;
        self.cpu_budget = budget;
        ticks(budget, self.tick)
    }

    /// At an epoch deadline: interrupt the call if it spent its budget, else the ticks to the next check.
    pub fn check(&self) -> UpdateDeadline {
        let used = read_thread_cpu_time(Instant::now()).saturating_sub(self.cpu_start);
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Burns this thread's CPU for about `d` of wall time.
    fn spin(d: Duration) {
        let until = Instant::now() + d;
        let mut x = 0u64;
        while Instant::now() < until {
            x = std::hint::black_box(x.wrapping_add(1));
        }
    }

    #[test]
    fn a_start_bounds_the_cpu_clock_from_above_by_at_most_the_refresh_interval() {
        for round in 0..200 {
            let before = thread_cpu_time();
            let bound = thread_cpu_time_upper_bound(Instant::now(), CPU_CLOCK_REFRESH);
            let after = thread_cpu_time();
            assert!(bound >= before, "round {round}: {bound:?} < {before:?}");
            assert!(
                bound <= after + CPU_CLOCK_REFRESH,
                "round {round}: {bound:?} > {after:?} + refresh"
            );
            spin(Duration::from_micros(50));
        }
    }

    #[test]
    fn a_call_start_reuses_a_recent_reading_and_refreshes_an_old_one() {
        let t0 = Instant::now();
        let first = read_thread_cpu_time(t0);
        // Within the refresh interval: the last reading plus the wall time since, no new reading.
        let later = t0 + CPU_CLOCK_REFRESH / 2;
        assert_eq!(
            thread_cpu_time_upper_bound(later, CPU_CLOCK_REFRESH),
            first + CPU_CLOCK_REFRESH / 2
        );
        assert_eq!(LAST_CPU_READING.with(Cell::get), Some((first, t0)));
        // A smaller limit (a smaller budget's) reads again at the same instant.
        let strict = thread_cpu_time_upper_bound(later, CPU_CLOCK_REFRESH / 4);
        assert_eq!(
            LAST_CPU_READING.with(Cell::get).map(|(_, at)| at),
            Some(later)
        );
        assert!(strict >= first);
        // Past it: read again (taken at `much_later`).
        let much_later = t0 + CPU_CLOCK_REFRESH * 3;
        let fresh = thread_cpu_time_upper_bound(much_later, CPU_CLOCK_REFRESH);
        assert_eq!(
            LAST_CPU_READING.with(Cell::get).map(|(_, at)| at),
            Some(much_later)
        );
        assert!(fresh >= first);
    }

    /// Burns this thread's CPU until it has used `d` more (however long the OS keeps it off a core).
    fn spin_cpu(d: Duration) {
        let until = thread_cpu_time() + d;
        while thread_cpu_time() < until {
            std::hint::black_box(());
        }
    }

    #[test]
    fn the_check_measures_cpu_spent_since_the_start() {
        // Budget 50 ms (wall cap 5 s), 1 ms of CPU spent: the call continues.
        let mut b = Budget::new(Duration::from_millis(1));
        b.start(Duration::from_millis(50));
        spin_cpu(Duration::from_millis(1));
        assert!(matches!(b.check(), UpdateDeadline::Continue(_)));
        // Budget 2 ms: at most half of it (1 ms) is forgiven, so 3.5 ms of CPU is over it.
        let mut b = Budget::new(Duration::from_millis(1));
        b.start(Duration::from_millis(2));
        spin_cpu(Duration::from_micros(3500));
        assert!(matches!(b.check(), UpdateDeadline::Interrupt));
    }

    #[test]
    fn a_small_budget_forgives_at_most_half_of_itself() {
        assert_eq!(refresh_for(Duration::from_millis(10)), CPU_CLOCK_REFRESH);
        assert_eq!(refresh_for(Duration::from_secs(1)), CPU_CLOCK_REFRESH);
        assert_eq!(
            refresh_for(Duration::from_millis(2)),
            Duration::from_millis(1)
        );
        // A budget of 1 ms started from a reading 2 ms old: the start reads the clock again, so only CPU really
        // spent counts and 1.5 ms of it is over the budget.
        let t0 = Instant::now();
        read_thread_cpu_time(t0);
        spin(Duration::from_millis(2));
        let mut b = Budget::new(Duration::from_millis(1));
        b.start(Duration::from_millis(1));
        let (_, at) = LAST_CPU_READING
            .with(Cell::get)
            .unwrap_or((Duration::ZERO, t0));
        assert!(at > t0, "the start did not read the clock again");
        spin_cpu(Duration::from_micros(1500));
        assert!(matches!(b.check(), UpdateDeadline::Interrupt));
    }
}
