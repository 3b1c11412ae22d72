//! The sources (mesh file, plugin directory) publish here: each good change builds a new [`Snapshot`] (its version
//! one higher, only when something changed) and wakes every stream; each refused change is recorded for the
//! status endpoint while the last good snapshot stays.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

use tokio::sync::watch;

use crate::ads::resources::{PluginEntry, Snapshot, TypeSet, carry_bases};

/// Which source.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceKind {
    /// The mesh file (Address, Authorization).
    Mesh,
    /// The plugin directory (TypedExtensionConfig).
    Plugins,
}

/// How a source is doing, for the status endpoint.
#[derive(Debug, Clone, Default, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SourceStatus {
    /// The file or directory.
    pub path: Option<String>,
    /// The last refused change's error, until a good one is applied.
    pub last_error: Option<String>,
    /// Good changes applied.
    pub applied: u64,
    /// Changes refused.
    pub refused: u64,
    /// Times the source was looked at.
    pub checks: u64,
    /// When the last good change was applied (RFC 3339).
    pub last_applied: Option<String>,
}

#[derive(Debug)]
struct Inner {
    mesh: SourceStatus,
    plugins: SourceStatus,
    /// The plugins as the source last gave them (before the staged rollouts set who gets what).
    source_plugins: Option<BTreeMap<String, PluginEntry>>,
    /// Bumped with every mesh change (what the rollouts' zone map is cached under).
    mesh_generation: u64,
}

/// Builds and publishes snapshots.
#[derive(Debug)]
pub struct Publisher {
    inner: Mutex<Inner>,
    /// The mesh file's store, whose watcher keeps the mesh source's errors and counters.
    mesh_store: Mutex<Option<Arc<weft_state::StateStore>>>,
    /// The staged rollouts every plugin set goes through.
    rollouts: Mutex<Option<Arc<crate::rollout::driver::Rollouts>>>,
    tx: watch::Sender<Arc<Snapshot>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn now_text() -> String {
    humantime::format_rfc3339_millis(SystemTime::now()).to_string()
}

impl Publisher {
    /// A publisher with an empty snapshot (version 0) and the sources' paths.
    pub fn new(mesh: Option<String>, plugins: Option<String>) -> Self {
        Self {
            inner: Mutex::new(Inner {
                mesh: SourceStatus {
                    path: mesh,
                    ..Default::default()
                },
                plugins: SourceStatus {
                    path: plugins,
                    ..Default::default()
                },
                source_plugins: None,
                mesh_generation: 0,
            }),
            rollouts: Mutex::new(None),
            tx: watch::channel(Arc::new(Snapshot::default())).0,
            mesh_store: Mutex::new(None),
        }
    }

    /// The mesh source's store (its watcher records refused edits and polls there).
    pub fn set_mesh_store(&self, store: Arc<weft_state::StateStore>) {
        *lock(&self.mesh_store) = Some(store);
    }

    /// Put every plugin set through `rollouts` from now on.
    pub fn set_rollouts(&self, rollouts: Arc<crate::rollout::driver::Rollouts>) {
        *lock(&self.rollouts) = Some(rollouts);
    }

    /// The staged rollouts, when on.
    pub fn rollouts(&self) -> Option<Arc<crate::rollout::driver::Rollouts>> {
        lock(&self.rollouts).clone()
    }

    /// The plugins as the source last gave them (before the staged rollouts set who gets what).
    pub fn source_plugins(&self) -> BTreeMap<String, PluginEntry> {
        lock(&self.inner).source_plugins.clone().unwrap_or_default()
    }

    /// The current snapshot.
    pub fn current(&self) -> Arc<Snapshot> {
        self.tx.borrow().clone()
    }

    /// A receiver that sees every new snapshot.
    pub fn subscribe(&self) -> watch::Receiver<Arc<Snapshot>> {
        self.tx.subscribe()
    }

    fn update(&self, kind: SourceKind, change: impl FnOnce(&mut Snapshot, &mut Inner)) {
        self.update_with(Some(kind), change);
    }

    /// Build and publish the next snapshot; `kind`: the source whose good change this is (`None`: a re-application
    /// of the same sources).
    fn update_with(
        &self,
        kind: Option<SourceKind>,
        change: impl FnOnce(&mut Snapshot, &mut Inner),
    ) {
        let mut g = lock(&self.inner);
        let old = self.current();
        let mut next = (*old).clone();
        change(&mut next, &mut g);
        if let Some(kind) = kind {
            let st = match kind {
                SourceKind::Mesh => &mut g.mesh,
                SourceKind::Plugins => &mut g.plugins,
            };
            st.applied += 1;
            st.last_error = None;
            st.last_applied = Some(now_text());
        }
        if next == *old {
            tracing::debug!(?kind, "source reloaded, nothing changed");
            return;
        }
        next.version = old.version + 1;
        if next.addresses != old.addresses {
            next.changed.addresses = next.version;
        }
        if next.authorizations != old.authorizations {
            next.changed.authorizations = next.version;
        }
        if next.plugins != old.plugins {
            next.changed.plugins = next.version;
        }
        tracing::info!(
            ?kind,
            version = next.version,
            addresses = next.addresses.len(),
            authorizations = next.authorizations.len(),
            plugins = next.plugins.len(),
            "publishing"
        );
        self.tx.send_replace(Arc::new(next));
    }

    /// Replace the mesh resources.
    pub fn publish_mesh(&self, addresses: TypeSet, authorizations: TypeSet) {
        self.update(SourceKind::Mesh, |s, inner| {
            inner.mesh_generation += 1;
            s.addresses = addresses;
            s.authorizations = authorizations;
        });
    }

    /// Replace the plugins (manually staged plugins keep their base: see [`carry_bases`]; the others go through
    /// the staged rollouts, when on).
    pub fn publish_plugins(&self, plugins: BTreeMap<String, PluginEntry>) {
        let rollouts = self.rollouts();
        self.update(SourceKind::Plugins, |s, inner| {
            inner.source_plugins = Some(plugins.clone());
            let mesh = (inner.mesh_generation, &s.addresses);
            s.plugins = self.staged(&s.plugins, plugins, mesh, rollouts.as_deref());
        });
    }

    /// Put the source's plugins through the staged rollouts again (the fleet changed, a bake ended) and publish
    /// what changed.
    pub fn reapply(&self) {
        let rollouts = self.rollouts();
        self.update_with(None, |s, inner| {
            if let Some(plugins) = inner.source_plugins.clone() {
                let mesh = (inner.mesh_generation, &s.addresses);
                s.plugins = self.staged(&s.plugins, plugins, mesh, rollouts.as_deref());
            }
        });
    }

    fn staged(
        &self,
        old: &BTreeMap<String, PluginEntry>,
        mut plugins: BTreeMap<String, PluginEntry>,
        mesh: (u64, &TypeSet),
        rollouts: Option<&crate::rollout::driver::Rollouts>,
    ) -> BTreeMap<String, PluginEntry> {
        carry_bases(old, &mut plugins);
        if let Some(r) = rollouts {
            r.apply(&mut plugins, mesh, SystemTime::now());
        }
        plugins
    }

    /// Record a refused change.
    pub fn record_refused(&self, kind: SourceKind, error: &str) {
        let mut g = lock(&self.inner);
        let st = match kind {
            SourceKind::Mesh => &mut g.mesh,
            SourceKind::Plugins => &mut g.plugins,
        };
        st.refused += 1;
        st.last_error = Some(error.to_owned());
    }

    /// Count one look at a source.
    pub fn count_check(&self, kind: SourceKind) {
        let mut g = lock(&self.inner);
        match kind {
            SourceKind::Mesh => g.mesh.checks += 1,
            SourceKind::Plugins => g.plugins.checks += 1,
        }
    }

    /// Both sources' status.
    pub fn sources(&self) -> (SourceStatus, SourceStatus) {
        let g = lock(&self.inner);
        let mut mesh = g.mesh.clone();
        if let Some(store) = lock(&self.mesh_store).as_ref() {
            mesh.last_error = store.last_error();
            mesh.refused = store.refused_reloads();
            mesh.checks = store.source_checks();
        }
        (mesh, g.plugins.clone())
    }
}
