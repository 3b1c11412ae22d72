//! The state store: the current [`MeshState`] behind an atomic pointer (lock-free reads on every connection),
//! replaced whole by a config source (the local file today, xDS later), with change notification and reload
//! counters.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use arc_swap::ArcSwap;
use tokio::sync::watch;

use crate::local::LocalConfig;
use crate::mesh::MeshState;
use crate::model::{PluginSpec, Policy, Service, Workload};

/// Holds the current mesh snapshot. Cheap to read from any thread; writers are serialized.
#[derive(Debug)]
pub struct StateStore {
    state: ArcSwap<MeshState>,
    /// Serializes writers so versions are assigned and published in order.
    write: Mutex<()>,
    loaded: AtomicBool,
    last_error: Mutex<Option<String>>,
    accepted: AtomicU64,
    refused: AtomicU64,
    /// Times a source looked at its input (the file watcher's polls), changed or not.
    checks: AtomicU64,
    changes: watch::Sender<u64>,
}

impl Default for StateStore {
    fn default() -> Self {
        Self::new()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding one of these locks cannot leave the data half-updated; keep going.
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl StateStore {
    /// An empty store: version 0, nothing loaded.
    pub fn new() -> Self {
        Self {
            state: ArcSwap::from_pointee(MeshState::default()),
            write: Mutex::new(()),
            loaded: AtomicBool::new(false),
            last_error: Mutex::new(None),
            accepted: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            checks: AtomicU64::new(0),
            changes: watch::channel(0).0,
        }
    }

    /// The current snapshot (lock-free; hold it for the whole decision so it stays consistent).
    pub fn current(&self) -> Arc<MeshState> {
        self.state.load_full()
    }

    /// The version of the current snapshot (0 before the first load).
    pub fn version(&self) -> u64 {
        self.state.load().version
    }

    /// Replace the whole state with `config`; returns the new version (previous + 1).
    pub fn replace(&self, config: LocalConfig) -> u64 {
        self.replace_with(|version| config.into_state(version))
    }

    /// Replace the whole state with these parts; returns the new version (previous + 1).
    pub fn replace_parts(
        &self,
        workloads: Vec<Workload>,
        services: Vec<Service>,
        policies: Vec<Policy>,
        plugins: Vec<PluginSpec>,
    ) -> u64 {
        self.replace_with(|version| MeshState::new(version, workloads, services, policies, plugins))
    }

    fn replace_with(&self, build: impl FnOnce(u64) -> MeshState) -> u64 {
        let _writer = lock(&self.write);
        let version = self.state.load().version + 1;
        self.state.store(Arc::new(build(version)));
        self.loaded.store(true, Ordering::Release);
        self.accepted.fetch_add(1, Ordering::Relaxed);
        *lock(&self.last_error) = None;
        self.changes.send_replace(version);
        version
    }

    /// Record a refused update (a config edit that did not parse, a file that vanished, ...). The current state
    /// stays; the message is kept for `/config_dump` until the next accepted update.
    pub fn record_error(&self, message: impl Into<String>) {
        *lock(&self.last_error) = Some(message.into());
        self.refused.fetch_add(1, Ordering::Relaxed);
    }

    /// Forget the last refused update's error (the source is back to what is being served).
    pub fn clear_error(&self) {
        *lock(&self.last_error) = None;
    }

    /// A receiver of the version, which changes on every accepted update.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// Whether a state has been accepted at least once.
    pub fn is_loaded(&self) -> bool {
        self.loaded.load(Ordering::Acquire)
    }

    /// The last refused update's error, unless an update was accepted since.
    pub fn last_error(&self) -> Option<String> {
        lock(&self.last_error).clone()
    }

    /// How many updates were accepted.
    pub fn accepted_reloads(&self) -> u64 {
        self.accepted.load(Ordering::Relaxed)
    }

    /// How many updates were refused.
    pub fn refused_reloads(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// How many times a source has finished looking at its input (each poll of the config file, whatever it
    /// found): lets a test or an operator see that the watcher is alive and has seen the file as it is now.
    pub fn source_checks(&self) -> u64 {
        self.checks.load(Ordering::Relaxed)
    }

    /// Count one look at a source's input (called after the input was read and handled).
    pub fn count_source_check(&self) {
        self.checks.fetch_add(1, Ordering::Relaxed);
    }
}
