//! The plugin set the lifecycle owns: what serves, what was rejected, the chain the data path reads and the watches
//! it reports on, with what loading a version takes from the host (handed over once, at start).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, mpsc};

use arc_swap::ArcSwap;
use weft_state::{PluginRollout, PluginSpec, Policy};

use super::chain::Chain;
use super::report::AppliedVersion;
use super::rollout::{RollbackEvent, RolloutState};
use super::shadow::{Shadow, ShadowBook, ShadowQueue};
use crate::base::clock::Clock;
use crate::metrics::host::HostMetrics;
use crate::metrics::plugin::MetricsHub;
use crate::sandbox::store::ImportLimits;
use crate::versions::cache::CompileCache;
use crate::versions::probation::Wake;
use crate::versions::version::{InstanceSettings, PluginVersion, PolicyState};

/// What `apply` reconciles against: the serving versions and the specs that were rejected.
#[derive(Default)]
pub(crate) struct Applied {
    pub serving: BTreeMap<String, Arc<PluginVersion>>,
    /// Last rejection per plugin name (cleared when a version of it loads), with the spec that was rejected.
    pub rejected: BTreeMap<String, (Arc<PluginSpec>, String)>,
    /// Names in the last applied config (serving or not).
    pub specs: BTreeMap<String, Arc<PluginSpec>>,
    pub policies: Vec<Arc<Policy>>,
    pub policy_state: PolicyState,
    pub generation: u64,
    /// Versions on probation and versions refused after a rollback.
    pub rollout: RolloutState,
    /// The loaded shadow versions, by plugin name.
    pub shadows: BTreeMap<String, Arc<Shadow>>,
}

/// What loading a version, starting its probation and guarding unenforced policies take from the host (its
/// config, the compile cache and the engine), handed over once.
pub(crate) struct Loading {
    pub cache: CompileCache,
    pub instances: InstanceSettings,
    pub imports: ImportLimits,
    /// Probation of a new version whose spec sets none.
    pub rollout: PluginRollout,
    /// The clock probation windows are measured on.
    pub clock: Arc<dyn Clock>,
    /// Let connections through when no serving plugin enforces the authorization policies in force.
    pub allow_unenforced_policies: bool,
    /// Where the chain queues shadow decisions, and where the shadow thread books them.
    pub shadow_queue: ShadowQueue,
    pub shadow_book: Arc<ShadowBook>,
}

/// The plugin set and everything that changes it (`apply`, the rollout thread) or reports on it (status, the
/// watches). Shared by the host and its rollout thread.
pub(crate) struct Plugins {
    /// What the data path reads, swapped whole.
    pub chain: Arc<ArcSwap<Chain>>,
    pub applied: Mutex<Applied>,
    /// Bumped when live connections should be re-checked.
    pub changes: tokio::sync::watch::Sender<u64>,
    pub rollbacks: tokio::sync::broadcast::Sender<RollbackEvent>,
    pub reports: tokio::sync::watch::Sender<Arc<AppliedVersion>>,
    /// Wakes the rollout thread (handed to every probation).
    pub wake: mpsc::Sender<Wake>,
    pub metrics: HostMetrics,
    pub hub: Arc<MetricsHub>,
    /// The metrics of telemetry plugins' shadow versions (exported apart, under the same names and limits).
    pub shadow_hub: Arc<MetricsHub>,
    pub loading: Loading,
}

impl Plugins {
    /// An empty plugin set serving `chain` (the host's telemetry thread reads it too).
    pub fn new(
        chain: Arc<ArcSwap<Chain>>,
        wake: mpsc::Sender<Wake>,
        metrics: HostMetrics,
        hub: Arc<MetricsHub>,
        shadow_hub: Arc<MetricsHub>,
        loading: Loading,
    ) -> Self {
        Self {
            chain,
            applied: Mutex::new(Applied::default()),
            changes: tokio::sync::watch::channel(0).0,
            rollbacks: tokio::sync::broadcast::channel(64).0,
            reports: tokio::sync::watch::channel(Arc::new(AppliedVersion::default())).0,
            wake,
            metrics,
            hub,
            shadow_hub,
            loading,
        }
    }

    /// The applied state, also after a thread panicked holding it.
    pub fn lock(&self) -> MutexGuard<'_, Applied> {
        self.applied.lock().unwrap_or_else(|p| p.into_inner())
    }
}
