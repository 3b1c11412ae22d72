//! A plugin version's shared pool of configured instances, and the background thread that keeps it filled.
//!
//! The data path only ever takes an idle instance from the pool and gives it back (or drops it when its call
//! failed): it never instantiates or configures. When no instance is idle the call fails at once with
//! [`ErrorKind::NoInstance`] and the plugin's failure policy applies. A dedicated thread per plugin version
//! replaces lost instances (and grows the pool when more threads call at once than it holds, up to
//! `max_idle_per_plugin`), at a bounded rate, with exponential backoff while instantiation or `configure` keeps
//! failing, so a plugin whose `configure` spins costs that one thread its configure budget now and then, and
//! never a data-path thread.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::factory::Factory;
use crate::base::error::{CallError, ErrorKind, LoadError};
use crate::guest::instance::Instance;
use crate::sandbox::limiter::LogLimiter;

/// Shortest pause between two instances the refill thread creates for one plugin version (a plugin that traps on
/// every call cannot make the host create more than this many per second; a healthy plugin whose instances trap
/// now and then is refilled fast enough that its other calls keep finding one).
const MIN_REFILL_INTERVAL: Duration = Duration::from_millis(1);
/// After a creation that took `t`, the refill thread waits at least `t` times this before the next one, so a
/// plugin whose `configure` is slow costs at most about a third of one core.
const REFILL_DUTY_FACTOR: u32 = 2;
/// Backoff after the first failed creation; doubles with every further failure in a row, up to the maximum.
const BACKOFF_START: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(30);

/// The pool's bookkeeping.
struct PoolState {
    idle: Vec<Instance>,
    /// Instances checked out by callers right now.
    busy: usize,
    /// How many instances (idle + busy) the refill thread keeps.
    target: usize,
    closed: bool,
    /// The refill thread is creating an instance right now.
    creating: bool,
    /// Failed creations in a row, and the last one's reason.
    failures: u32,
    last_error: Option<String>,
    /// No creation before this instant (rate bound, backoff).
    not_before: Option<Instant>,
}

/// What the pool reports for `/config_dump`.
#[derive(Debug, Clone, Default)]
pub(crate) struct PoolStatus {
    pub idle: usize,
    pub busy: usize,
    pub target: usize,
    pub refill_failures: u32,
    pub refill_error: Option<String>,
}

/// One plugin version's pool.
pub(crate) struct Pool {
    factory: Factory,
    max: usize,
    /// [`crate::HostConfig::release_memory`]: called by the refill thread when it has created instances and the
    /// pool is full again.
    release_memory: Option<fn()>,
    state: Mutex<PoolState>,
    wake: Condvar,
    warn: LogLimiter,
}

impl Pool {
    /// A pool holding `idle` (already configured instances) that keeps `target` instances, at most `max_idle`, and
    /// its refill thread.
    pub fn start(
        factory: Factory,
        idle: Vec<Instance>,
        target: usize,
        max_idle: usize,
        release_memory: Option<fn()>,
    ) -> Result<Arc<Self>, LoadError> {
        let max = max_idle.max(1);
        let pool = Arc::new(Pool {
            max,
            release_memory,
            state: Mutex::new(PoolState {
                idle,
                busy: 0,
                target: target.clamp(1, max),
                closed: false,
                creating: false,
                failures: 0,
                last_error: None,
                not_before: None,
            }),
            wake: Condvar::new(),
            warn: LogLimiter::new(1),
            factory,
        });
        let refill = pool.clone();
        std::thread::Builder::new()
            .name("weft-plugin-pool".into())
            .spawn(move || refill.refill_loop())
            .map_err(|e| {
                LoadError::Internal(format!("cannot start the instance refill thread: {e}"))
            })?;
        Ok(pool)
    }

    fn lock(&self) -> MutexGuard<'_, PoolState> {
        match self.state.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// An idle instance, or `no_instance` at once (never creates one on the caller's thread).
    pub fn checkout(&self) -> Result<Instance, CallError> {
        let mut st = self.lock();
        if let Some(inst) = st.idle.pop() {
            st.busy += 1;
            return Ok(inst);
        }
        let live = st.idle.len() + st.busy;
        if live >= st.target && st.target < self.max {
            // Every instance is busy on another thread: more threads call at once than the pool holds. Grow it.
            st.target += 1;
        }
        let message = match &st.last_error {
            Some(e) => format!(
                "instance pool exhausted ({} busy, {} wanted); refill failing ({} in a row): {e}",
                st.busy, st.target, st.failures
            ),
            None => format!(
                "instance pool exhausted ({} busy, {} wanted); refilling in the background",
                st.busy, st.target
            ),
        };
        drop(st);
        self.wake.notify_one();
        Err(CallError {
            kind: ErrorKind::NoInstance,
            message,
        })
    }

    /// Gives back an instance whose call succeeded.
    pub fn checkin(&self, inst: Instance) {
        let mut st = self.lock();
        st.busy = st.busy.saturating_sub(1);
        if !st.closed && st.idle.len() < self.max {
            st.idle.push(inst);
            return;
        }
        drop(st);
        drop(inst);
    }

    /// Throws away an instance whose call failed; the refill thread replaces it.
    pub fn discard(&self, inst: Instance) {
        drop(inst);
        let mut st = self.lock();
        st.busy = st.busy.saturating_sub(1);
        drop(st);
        self.wake.notify_one();
    }

    /// Stops the refill thread (the version is gone); idle instances are dropped, busy ones when given back.
    ///
    /// A creation in progress ends at its configure deadline, which only the engine's epoch ticks enforce; the
    /// host's ticker stops when the host is dropped, so while one is in progress a keeper ticks until it ends
    /// (otherwise a `configure` that spins would keep the refill thread busy forever).
    pub fn close(self: &Arc<Self>) {
        let mut st = self.lock();
        st.closed = true;
        let creating = st.creating;
        drop(st);
        self.wake.notify_all();
        if creating {
            let pool = self.clone();
            let spawned = std::thread::Builder::new()
                .name("weft-plugin-pool-end".into())
                .spawn(move || {
                    let tick = pool.factory.limits.tick;
                    while pool.lock().creating {
                        pool.factory.engine.increment_epoch();
                        std::thread::sleep(tick);
                    }
                });
            if let Err(e) = spawned {
                tracing::warn!(plugin = %self.factory.ctx.name, error = %e,
                    "cannot start a thread to end a closed pool's refill; it ends when the host's ticker ticks");
            }
        }
    }

    /// How many instances this pool keeps (a new version of the same plugin starts with as many).
    pub fn target(&self) -> usize {
        self.lock().target
    }

    pub fn status(&self) -> PoolStatus {
        let st = self.lock();
        PoolStatus {
            idle: st.idle.len(),
            busy: st.busy,
            target: st.target,
            refill_failures: st.failures,
            refill_error: st.last_error.clone(),
        }
    }

    /// The refill thread: waits until the pool is short and the rate bound or backoff allows, creates one
    /// instance, repeats; ends when the pool is closed.
    fn refill_loop(&self) {
        // Whether this thread created an instance since it last let the allocator take back what it holds.
        let mut created_since_release = false;
        loop {
            let mut st = self.lock();
            loop {
                if st.closed {
                    let idle = std::mem::take(&mut st.idle);
                    drop(st);
                    drop(idle);
                    return;
                }
                if st.idle.len() + st.busy < st.target {
                    match st.not_before {
                        Some(t) if Instant::now() < t => {
                            let wait = t.saturating_duration_since(Instant::now());
                            st = match self.wake.wait_timeout(st, wait) {
                                Ok((g, _)) => g,
                                Err(poisoned) => poisoned.into_inner().0,
                            };
                        }
                        _ => break,
                    }
                } else {
                    if created_since_release {
                        drop(st);
                        crate::versions::cache::release_freed_memory(self.release_memory);
                        created_since_release = false;
                        st = self.lock();
                        continue;
                    }
                    st = match self.wake.wait(st) {
                        Ok(g) => g,
                        Err(poisoned) => poisoned.into_inner(),
                    };
                }
            }
            st.creating = true;
            drop(st);
            let started = Instant::now();
            let created = self.factory.create();
            created_since_release = true;
            let took = started.elapsed();
            let mut st = self.lock();
            st.creating = false;
            let pause = (took * REFILL_DUTY_FACTOR).max(MIN_REFILL_INTERVAL);
            let name = &self.factory.ctx.name;
            match created {
                Ok(inst) => {
                    if st.failures > 0 {
                        tracing::info!(plugin = %name, after_failures = st.failures, "plugin instance refill recovered");
                    }
                    st.failures = 0;
                    st.last_error = None;
                    st.not_before = Some(Instant::now() + pause);
                    if st.closed {
                        drop(st);
                        drop(inst);
                    } else {
                        st.idle.push(inst);
                    }
                }
                Err(e) => {
                    st.failures = st.failures.saturating_add(1);
                    let backoff = BACKOFF_START
                        .saturating_mul(1u32 << (st.failures - 1).min(16))
                        .min(BACKOFF_MAX);
                    st.not_before = Some(Instant::now() + backoff.max(pause));
                    let reason = e.to_string();
                    st.last_error = Some(reason.clone());
                    let failures = st.failures;
                    drop(st);
                    self.factory
                        .ctx
                        .counters
                        .error(ErrorKind::Instantiate)
                        .inc();
                    if self.warn.allow() {
                        tracing::warn!(
                            plugin = %name,
                            error = %reason,
                            failures,
                            retry_in = ?backoff.max(pause),
                            "cannot refill the plugin's instance pool; calls find no instance and apply the failure policy"
                        );
                    }
                }
            }
        }
    }
}
