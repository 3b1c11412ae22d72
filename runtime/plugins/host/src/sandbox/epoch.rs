//! The engine's epoch ticker, lazy: it ticks only while a guest call may be running and parks when none has run
//! for a few ticks, so an idle or lightly loaded node is not woken a thousand times a second for nothing.
//!
//! Every guest call (instantiate, `configure`, `update-state`, `authorize`, `on-events`) is bracketed by
//! [`EpochClock::enter`] and [`EpochClock::exit`]. Entering counts the call on one of a few cache-line-padded
//! shards (the calling thread's own, so data threads do not bounce one counter between cores) and, only if the
//! ticker is parked, unparks it. The ticker, after [`IDLE_TICKS_BEFORE_PARK`] ticks that each found no call in
//! progress, announces that it parks, counts the calls again and parks only if there are still none. Both sides
//! use sequentially consistent operations, so either the caller sees the announcement (and unparks the ticker) or
//! the ticker sees the call (and keeps ticking): a call that loops forever is always interrupted.
//!
//! A parked ticker leaves the epoch where it was. A call's deadline is a number of ticks from the epoch at its
//! start ([`super::budget::ticks`], rounded up plus one), and the first tick after an unpark comes a whole tick
//! later, so parking never shortens a budget.
//!
//! Before it parks, a ticker that finds no call in progress slows down: each such tick doubles the wait to the
//! next, up to [`SLOWEST_TICK_FACTOR`] ticks, and a tick that finds a call goes back to the configured tick at
//! once. Under load, calls of a microsecond are almost never in progress when the ticker looks, so it wakes up to a
//! quarter as often (half as often in the mesh bench's connection-rate case). Ticks that come later only lengthen a
//! budget: a call that starts during a slow wait is seen at the next tick, from which the ticker ticks at full
//! rate, so a runaway call is interrupted at most `SLOWEST_TICK_FACTOR - 1` ticks later than with a steady ticker
//! (3 ms with the default 1 ms tick).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::thread::Thread;
use std::time::Duration;

use wasmtime::Engine;

/// Consecutive ticks that found no call in progress before the ticker parks.
pub(crate) const IDLE_TICKS_BEFORE_PARK: u32 = 16;
/// The longest wait between two ticks, in configured ticks, reached while the ticker finds no call in progress.
pub(crate) const SLOWEST_TICK_FACTOR: u32 = 4;
/// Counter shards; threads are spread over them round-robin.
const SHARDS: usize = 8;

/// One shard of the in-progress count, alone on its cache line(s).
#[derive(Debug, Default)]
#[repr(align(128))]
struct Shard(AtomicUsize);

#[derive(Debug, Default)]
struct State {
    /// Calls in progress, summed over the shards (each shard wraps; only the sum means anything).
    calls: [Shard; SHARDS],
    /// The ticker has announced that it parks (or is parked).
    parked: AtomicBool,
    /// The host is gone: the ticker thread ends.
    stop: AtomicBool,
    /// Ticks so far (for status and tests).
    ticks: AtomicU64,
    /// How many times the ticker parked (for status and tests).
    parks: AtomicU64,
    /// The wait before the next tick, in nanoseconds (for status and tests; kept while parked).
    interval_ns: AtomicU64,
    /// The ticker thread, to unpark it.
    thread: std::sync::OnceLock<Thread>,
}

impl State {
    fn calls_in_progress(&self) -> usize {
        self.calls.iter().fold(0usize, |sum, s| {
            sum.wrapping_add(s.0.load(Ordering::SeqCst))
        })
    }
}

thread_local! {
    /// This thread's shard.
    static SHARD: usize = {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        NEXT.fetch_add(1, Ordering::Relaxed) % SHARDS
    };
}

/// What every store holds to bracket its calls; cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct EpochClock(Arc<State>);

impl EpochClock {
    /// A guest call starts on this thread: count it, and wake the ticker if it parked.
    pub fn enter(&self) {
        let shard = SHARD.with(|s| *s);
        self.0.calls[shard].0.fetch_add(1, Ordering::SeqCst);
        if self.0.parked.load(Ordering::SeqCst)
            && let Some(t) = self.0.thread.get()
        {
            t.unpark();
        }
    }

    /// The guest call this thread entered has returned (or trapped).
    pub fn exit(&self) {
        let shard = SHARD.with(|s| *s);
        self.0.calls[shard].0.fetch_sub(1, Ordering::Release);
    }

    /// Ticks so far.
    pub fn ticks(&self) -> u64 {
        self.0.ticks.load(Ordering::SeqCst)
    }

    /// How many times the ticker has parked.
    pub fn parks(&self) -> u64 {
        self.0.parks.load(Ordering::SeqCst)
    }

    /// Whether the ticker is parked (or about to park).
    pub fn is_parked(&self) -> bool {
        self.0.parked.load(Ordering::SeqCst)
    }

    /// The ticker's current wait between ticks: the configured tick while calls are seen, up to
    /// [`SLOWEST_TICK_FACTOR`] times it while none are.
    pub fn interval(&self) -> Duration {
        Duration::from_nanos(self.0.interval_ns.load(Ordering::SeqCst))
    }
}

/// The ticker thread; dropping it ends the thread.
#[derive(Debug)]
pub(crate) struct Ticker {
    clock: EpochClock,
}

impl Ticker {
    /// Starts the thread that increments `engine`'s epoch every `tick` while calls may be running.
    pub fn start(engine: Engine, tick: Duration) -> std::io::Result<Self> {
        let state = Arc::new(State::default());
        let st = state.clone();
        let handle = std::thread::Builder::new()
            .name("weft-plugin-epoch".into())
            .spawn(move || run(&st, &engine, tick))?;
        // Set before any store exists (stores get the clock from the returned ticker), so `enter` always finds it.
        let _ = state.thread.set(handle.thread().clone());
        Ok(Self {
            clock: EpochClock(state),
        })
    }

    /// The clock the stores bracket their calls with.
    pub fn clock(&self) -> EpochClock {
        self.clock.clone()
    }
}

impl Drop for Ticker {
    fn drop(&mut self) {
        let st = &self.clock.0;
        st.stop.store(true, Ordering::SeqCst);
        if let Some(t) = st.thread.get() {
            t.unpark();
        }
    }
}

/// The wait before the next tick: back to `tick` when a call was seen, else twice the last, at most
/// [`SLOWEST_TICK_FACTOR`] ticks.
fn next_interval(last: Duration, saw_call: bool, tick: Duration) -> Duration {
    if saw_call {
        tick
    } else {
        last.saturating_mul(2)
            .min(tick * SLOWEST_TICK_FACTOR)
            .max(tick)
    }
}

fn run(st: &State, engine: &Engine, tick: Duration) {
    let mut idle = 0u32;
    let mut interval = tick;
    let publish = |d: Duration| {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        st.interval_ns.store(ns, Ordering::SeqCst);
    };
    publish(interval);
    while !st.stop.load(Ordering::SeqCst) {
        let saw_call = st.calls_in_progress() != 0;
        if saw_call {
            idle = 0;
        } else {
            idle += 1;
        }
        interval = next_interval(interval, saw_call, tick);
        publish(interval);
        if idle >= IDLE_TICKS_BEFORE_PARK {
            st.parked.store(true, Ordering::SeqCst);
            if st.calls_in_progress() == 0 {
                st.parks.fetch_add(1, Ordering::SeqCst);
                // A spurious wake-up finds no call and parks again; a call or the stop flag ends the wait.
                while st.calls_in_progress() == 0 && !st.stop.load(Ordering::SeqCst) {
                    std::thread::park();
                }
            }
            st.parked.store(false, Ordering::SeqCst);
            idle = 0;
            // Woken by a call: tick at full rate until the ticker sees none again.
            interval = tick;
            publish(interval);
            continue;
        }
        std::thread::sleep(interval);
        engine.increment_epoch();
        st.ticks.fetch_add(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test code: a panic fails the test

    use super::*;

    /// Waits until `f` holds (the shared test kit's event wait).
    fn eventually(what: &str, f: impl Fn() -> bool) {
        weft_testkit::eventually_blocking(what, || f().then_some(()))
    }

    #[test]
    fn the_ticker_parks_when_idle_ticks_while_a_call_runs_and_parks_again_after() {
        let tick = Duration::from_millis(1);
        let ticker = Ticker::start(Engine::default(), tick).unwrap();
        let clock = ticker.clock();
        eventually("the idle ticker parks", || clock.parks() == 1);
        let parked_at = clock.ticks();
        assert!(
            parked_at >= u64::from(IDLE_TICKS_BEFORE_PARK) - 1,
            "{parked_at}"
        );

        // It slowed down before parking: the ticks before it found no call.
        assert_eq!(clock.interval(), tick * SLOWEST_TICK_FACTOR);

        // A call from another thread wakes it; it ticks for as long as the call runs, however long that is, at
        // the full rate.
        let caller = clock.clone();
        std::thread::spawn(move || caller.enter()).join().unwrap();
        eventually("the ticker ticks for the call", || {
            clock.ticks() >= parked_at + 3 * u64::from(IDLE_TICKS_BEFORE_PARK)
        });
        assert_eq!(clock.parks(), 1, "parked while a call was in progress");
        assert_eq!(clock.interval(), tick, "slow ticks while a call runs");

        // The call ends (on another thread than it started: only the sum counts); the ticker parks again.
        clock.exit();
        eventually("the ticker parks after the call", || clock.parks() == 2);
        assert!(clock.is_parked());
    }

    #[test]
    fn the_wait_doubles_while_no_call_is_seen_and_drops_back_at_once_when_one_is() {
        let tick = Duration::from_millis(1);
        let mut waits = Vec::new();
        let mut d = tick;
        for saw_call in [false, false, false, false, true, false] {
            d = next_interval(d, saw_call, tick);
            waits.push(d.as_millis());
        }
        assert_eq!(waits, [2, 4, 4, 4, 1, 2]);
        // Never below the tick, whatever it starts from.
        assert_eq!(next_interval(Duration::ZERO, false, tick), tick);
    }

    #[test]
    fn a_dropped_ticker_ends_its_thread_even_while_parked() {
        let ticker = Ticker::start(Engine::default(), Duration::from_millis(1)).unwrap();
        let clock = ticker.clock();
        eventually("the idle ticker parks", || clock.parks() == 1);
        drop(ticker);
        // The thread's `run` returns only on `stop`; the state's last other reference is the thread's.
        eventually("the ticker thread ends", || {
            Arc::strong_count(&clock.0) == 1
        });
    }
}
