//! The state store: the current [`MeshState`] behind an atomic pointer (lock-free reads on every connection),
//! rebuilt from every source's contribution (the local file, xDS sources; see `sources.rs`) when one changes, with
//! change notification and reload counters.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use arc_swap::ArcSwap;
use tokio::sync::watch;

use crate::local::LocalConfig;
use crate::mesh::MeshState;
use crate::model::{PluginSpec, Policy, Service, Workload};
use crate::sources::{
    Change, Contribution, FILE_PRECEDENCE, LOCAL_FILE, SourceCounts, XDS_PRECEDENCE, merge,
};

/// What [`StateStore::apply_changes`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Applied {
    /// The version in force afterwards.
    pub version: u64,
    /// Whether a new snapshot was published (false: every change was a no-op).
    pub changed: bool,
}

/// Holds the current mesh snapshot. Cheap to read from any thread; writers are serialized.
#[derive(Debug)]
pub struct StateStore {
    state: ArcSwap<MeshState>,
    /// Every source's contribution; its lock also serializes writers, so versions are published in order.
    sources: Mutex<BTreeMap<String, Contribution>>,
    /// Resources defined by more than one source in the current snapshot.
    conflicts: AtomicUsize,
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
            sources: Mutex::new(BTreeMap::new()),
            conflicts: AtomicUsize::new(0),
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

    /// Replace what the local file contributes with `config`; returns the new version (previous + 1).
    pub fn replace(&self, config: LocalConfig) -> u64 {
        self.replace_parts(
            config.workloads,
            config.services,
            config.policies,
            config.plugins,
        )
    }

    /// Replace what the local file contributes with these parts; returns the new version (previous + 1).
    pub fn replace_parts(
        &self,
        workloads: Vec<Workload>,
        services: Vec<Service>,
        policies: Vec<Policy>,
        plugins: Vec<PluginSpec>,
    ) -> u64 {
        let mut c = Contribution::new(FILE_PRECEDENCE);
        for w in workloads {
            c.workloads.insert(w.uid.clone(), Arc::new(w));
        }
        for s in services {
            c.services.insert(s.key(), Arc::new(s));
        }
        for p in policies {
            c.policies.insert(p.key(), Arc::new(p));
        }
        for p in plugins {
            c.plugins.insert(p.name.clone(), Arc::new(p));
        }
        let mut sources = lock(&self.sources);
        if let Some(old) = sources.get(LOCAL_FILE) {
            c.precedence = old.precedence;
        }
        sources.insert(LOCAL_FILE.to_owned(), c);
        // Cleared before subscribers hear of the new version, so none of them sees the old error with it.
        *lock(&self.last_error) = None;
        self.publish(&sources)
    }

    /// Declare a source and its precedence (higher wins where two sources define the same resource; the local
    /// file has 0, [`XDS_PRECEDENCE`] is the default for others). Keeps what it already holds.
    pub fn register_source(&self, source: &str, precedence: i32) {
        lock(&self.sources)
            .entry(source.to_owned())
            .or_insert_with(|| Contribution::new(precedence))
            .precedence = precedence;
    }

    /// Apply a source's changes, resource by resource (each already converted and checked, e.g. by
    /// [`crate::xds`]), and publish a new snapshot if anything changed. An unknown source is created with
    /// [`XDS_PRECEDENCE`].
    pub fn apply_changes(&self, source: &str, changes: Vec<Change>) -> Applied {
        let mut sources = lock(&self.sources);
        let c = sources
            .entry(source.to_owned())
            .or_insert_with(|| Contribution::new(XDS_PRECEDENCE));
        let mut changed = false;
        for change in changes {
            changed |= c.apply(change);
        }
        if !changed {
            return Applied {
                version: self.version(),
                changed: false,
            };
        }
        Applied {
            version: self.publish(&sources),
            changed: true,
        }
    }

    /// What each source holds, by source id.
    pub fn source_counts(&self) -> BTreeMap<String, SourceCounts> {
        lock(&self.sources)
            .iter()
            .map(|(id, c)| (id.clone(), c.counts()))
            .collect()
    }

    /// Resources defined by more than one source in the current snapshot (the higher precedence one serves).
    pub fn conflicts(&self) -> usize {
        self.conflicts.load(Ordering::Relaxed)
    }

    /// Rebuild the snapshot from `sources` (held locked by the caller) and publish it; returns its version.
    fn publish(&self, sources: &BTreeMap<String, Contribution>) -> u64 {
        let merged = merge(sources);
        let version = self.state.load().version + 1;
        self.state.store(Arc::new(MeshState::from_shared(
            version,
            merged.workloads.into_values(),
            merged.services.into_values(),
            merged.policies.into_values(),
            merged.plugins.into_values(),
        )));
        self.conflicts.store(merged.conflicts, Ordering::Relaxed);
        self.loaded.store(true, Ordering::Release);
        self.accepted.fetch_add(1, Ordering::Relaxed);
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
