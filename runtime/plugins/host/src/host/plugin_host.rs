//! `PluginHost`: the engine and the chain behind `weft_hooks::ConnectionHooks`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, mpsc};
use std::time::Instant;

use arc_swap::ArcSwap;
use prometheus_client::registry::Registry;
use weft_hooks::{CloseRecord, ConnectionHooks, ConnectionRecord, Verdict};
use weft_state::PluginSpec;

use crate::chain::Chain;
use crate::config::HostConfig;
use crate::engine::{CompileCache, build_engine};
use crate::epoch::Ticker;
use crate::host_metrics::HostMetrics;
use crate::instance::Limits;
use crate::plugin::{PluginVersion, PolicyState};
use crate::plugin_metrics::{LabelLimits, MetricsHub};
use crate::rollout::{RollbackEvent, RolloutState, Wake};
use crate::shared::Shared;
use crate::telemetry::{Msg, TelemetryQueue};

/// Why the host could not start.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// The wasm engine could not be created (bad limits).
    #[error("{0}")]
    Engine(String),
    /// A helper thread could not be spawned.
    #[error("cannot spawn a plugin-host thread: {0}")]
    Thread(#[from] std::io::Error),
}

/// What `apply` reconciles against: the serving versions and the specs that were rejected.
#[derive(Default)]
pub(crate) struct Applied {
    pub serving: BTreeMap<String, Arc<PluginVersion>>,
    /// Last rejection per plugin name (cleared when a version of it loads), with the spec that was rejected.
    pub rejected: BTreeMap<String, (Arc<PluginSpec>, String)>,
    /// Names in the last applied config (serving or not).
    pub specs: BTreeMap<String, Arc<PluginSpec>>,
    pub policies: Vec<Arc<weft_state::Policy>>,
    pub policy_state: PolicyState,
    pub generation: u64,
    /// Versions on probation and versions refused after a rollback.
    pub rollout: RolloutState,
}

/// The outcome of the `apply` for one state version (what an xDS source waits for before it ACKs).
#[derive(Debug, Clone, Default)]
pub struct AppliedVersion {
    /// The state version applied (0 for an `apply` without one).
    pub state_version: u64,
    /// What happened to each plugin.
    pub report: crate::ApplyReport,
}

/// What the rollout thread shares with the host: enough to swap a version back.
#[derive(Clone)]
pub(crate) struct Swapper {
    pub shared: Arc<Shared>,
    pub chain: Arc<ArcSwap<Chain>>,
    pub applied: Arc<Mutex<Applied>>,
    pub changes: Arc<tokio::sync::watch::Sender<u64>>,
    pub rollbacks: tokio::sync::broadcast::Sender<RollbackEvent>,
}

/// The Wasm plugin host. Cheap to share (`Arc<PluginHost>`); implements [`ConnectionHooks`] for the data path.
pub struct PluginHost {
    pub(crate) shared: Arc<Shared>,
    pub(crate) chain: Arc<ArcSwap<Chain>>,
    pub(crate) applied: Arc<Mutex<Applied>>,
    pub(crate) changes: Arc<tokio::sync::watch::Sender<u64>>,
    pub(crate) rollbacks: tokio::sync::broadcast::Sender<RollbackEvent>,
    pub(crate) reports: tokio::sync::watch::Sender<Arc<AppliedVersion>>,
    pub(crate) wake: mpsc::Sender<Wake>,
    telemetry: TelemetryQueue,
    _ticker: Ticker,
}

impl Drop for PluginHost {
    fn drop(&mut self) {
        let _ = self.wake.send(Wake::Stop);
    }
}

impl std::fmt::Debug for PluginHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PluginHost").finish_non_exhaustive()
    }
}

/// What [`PluginHost::epoch_ticker`] reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EpochTickerStatus {
    /// Epoch increments so far.
    pub ticks: u64,
    /// How many times the ticker parked for want of calls.
    pub parks: u64,
    /// Whether it is parked now.
    pub parked: bool,
    /// Its current wait between ticks: the configured tick while it sees calls running, longer while it does not.
    pub interval: std::time::Duration,
}

impl PluginHost {
    /// Creates the engine, the epoch ticker and the telemetry thread. No plugin is loaded until [`Self::apply`].
    pub fn new(config: HostConfig) -> Result<Self, HostError> {
        let engine = build_engine(&config).map_err(HostError::Engine)?;
        let ticker = Ticker::start(engine.clone(), config.epoch_tick)?;
        let limits = Limits {
            memory: config.memory_limit,
            call_deadline: config.call_deadline,
            configure_deadline: config.configure_deadline,
            tick: config.epoch_tick,
            clock: ticker.clock(),
            max_reason_len: config.max_reason_len,
        };
        let metrics = HostMetrics::default();
        let chain = Arc::new(ArcSwap::from_pointee(Chain::default()));
        let telemetry = TelemetryQueue::start(
            chain.clone(),
            config.telemetry_queue,
            config.telemetry_batch,
            config.telemetry_linger,
            metrics.telemetry_dropped.clone(),
        )?;
        let shared = Arc::new(Shared {
            cache: CompileCache::new(
                engine.clone(),
                config.engine_settings(),
                config.compiler.clone(),
                config.cache_dir.clone(),
            ),
            engine,
            limits,
            metrics,
            hub: Arc::new(MetricsHub::new(LabelLimits {
                max_value_len: config.max_label_value_len,
                max_bytes: config.max_label_bytes_per_plugin,
            })),
            epoch_start: Instant::now(),
            config,
        });
        let (wake, woken) = mpsc::channel();
        let swapper = Swapper {
            shared: shared.clone(),
            chain: chain.clone(),
            applied: Arc::new(Mutex::new(Applied::default())),
            changes: Arc::new(tokio::sync::watch::channel(0).0),
            rollbacks: tokio::sync::broadcast::channel(64).0,
        };
        swapper.clone().start(woken)?;
        Ok(Self {
            shared,
            chain,
            applied: swapper.applied,
            changes: swapper.changes,
            rollbacks: swapper.rollbacks,
            reports: tokio::sync::watch::channel(Arc::new(AppliedVersion::default())).0,
            wake,
            telemetry,
            _ticker: ticker,
        })
    }

    /// Automatic rollbacks as they happen (the xDS source reports each to the control plane as a NACK).
    pub fn rollbacks(&self) -> tokio::sync::broadcast::Receiver<RollbackEvent> {
        self.rollbacks.subscribe()
    }

    /// The outcome of the latest `apply`, with the state version it applied.
    pub fn applied(&self) -> tokio::sync::watch::Receiver<Arc<AppliedVersion>> {
        self.reports.subscribe()
    }

    /// Waits until a state version at or after `version` has been applied and returns that outcome (versions
    /// applied together are reported once, under the latest).
    pub async fn wait_applied(&self, version: u64) -> Arc<AppliedVersion> {
        let mut rx = self.reports.subscribe();
        let waited = rx
            .wait_for(|a| a.state_version >= version)
            .await
            .map(|a| a.clone());
        // The sender lives as long as the host, which `&self` proves; fall back to the latest all the same.
        waited.unwrap_or_else(|_| self.reports.borrow().clone())
    }

    /// Judges every probation now (rolls back what crossed its threshold, ends what outlived its window). The
    /// rollout thread does this when a call wakes it and once a second; tests with a [`crate::ManualClock`] call it
    /// after moving the clock.
    pub fn check_rollouts(&self) -> Vec<RollbackEvent> {
        Swapper {
            shared: self.shared.clone(),
            chain: self.chain.clone(),
            applied: self.applied.clone(),
            changes: self.changes.clone(),
            rollbacks: self.rollbacks.clone(),
        }
        .check()
    }

    /// The host's configuration.
    pub fn config(&self) -> &HostConfig {
        &self.shared.config
    }

    /// Registers the per-plugin host metrics (`weft_plugin_*`) and every plugin-defined metric (names and labels
    /// exactly as the plugin defined them; a counter `x_total` is exposed as `x_total`) into `registry`. Register
    /// into the root registry (no prefix) so plugin metric names stay as defined. Plugin metrics appear and
    /// disappear with the plugins; nothing needs re-registering after `apply`.
    pub fn register_metrics(&self, registry: &mut Registry) {
        self.shared.metrics.register(registry, &self.shared.hub);
    }

    /// The epoch ticker's state: it ticks only while guest calls run and parks when they stop (tests, debugging).
    pub fn epoch_ticker(&self) -> EpochTickerStatus {
        let clock = &self.shared.limits.clock;
        EpochTickerStatus {
            ticks: clock.ticks(),
            parks: clock.parks(),
            parked: clock.is_parked(),
            interval: clock.interval(),
        }
    }

    /// The same metrics as Prometheus/OpenMetrics text (tests, debugging).
    pub fn metrics_text(&self) -> String {
        let mut registry = Registry::default();
        self.register_metrics(&mut registry);
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &registry).is_err() {
            out.clear();
        }
        out
    }

    /// Blocks until every telemetry event queued so far has been handed to the telemetry plugins (tests, drain).
    pub fn flush_telemetry(&self) {
        self.telemetry.flush();
    }

    /// Runs `authorize` of the named policy plugin on a brand-new instance, bypassing the pool (benchmarks: the
    /// cost that instance reuse saves). `None` when no such plugin serves.
    pub fn authorize_fresh_instance(
        &self,
        plugin: &str,
        conn: &ConnectionRecord,
    ) -> Option<Verdict> {
        let v = self.applied.lock().ok()?.serving.get(plugin).cloned()?;
        Some(v.authorize_fresh(conn))
    }
}

impl ConnectionHooks for PluginHost {
    fn authorize(&self, conn: &ConnectionRecord) -> Verdict {
        self.chain.load().authorize(conn)
    }

    fn on_open(&self, conn: &Arc<ConnectionRecord>) {
        if !self.chain.load().telemetry.is_empty() {
            self.telemetry.send(Msg::Opened(conn.clone()));
        }
    }

    fn on_close(&self, conn: &Arc<ConnectionRecord>, close: &CloseRecord) {
        if !self.chain.load().telemetry.is_empty() {
            self.telemetry
                .send(Msg::Closed(conn.clone(), close.clone()));
        }
    }

    fn policy_changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changes.subscribe()
    }
}

impl PluginHost {
    /// Checks code before it is handed to the state (the xDS plugin handler NACKs what fails here, so a broken
    /// resource never takes effect, not even as a fail-closed plugin with nothing serving): it compiles (through
    /// the compile cache, so the load that follows reuses it), exports the world of `kind` (taken from the
    /// component when `None`) and links against the host's imports. Returns the kind. Blocking.
    pub fn check_component(
        &self,
        bytes: &[u8],
        kind: Option<weft_state::PluginKind>,
    ) -> Result<weft_state::PluginKind, crate::LoadError> {
        let found = self.component_kind(bytes)?;
        if let Some(k) = kind
            && k != found
        {
            return Err(crate::LoadError::WrongWorld {
                world: match k {
                    weft_state::PluginKind::Policy => "transport-policy",
                    weft_state::PluginKind::Telemetry => "telemetry-sink",
                },
                reason: format!(
                    "the resource says {k:?} but the component exports the {found:?} interface"
                ),
            });
        }
        let sha = crate::engine::sha256_hex(bytes);
        let component = self.shared.cache.get(&sha, bytes)?;
        crate::instance::link(&self.shared.engine, &component, found)?;
        Ok(found)
    }

    /// The kind of plugin a component is, from the world it exports (`weft:plugin/policy` or
    /// `weft:plugin/telemetry`): for resources that do not say (Envoy's Wasm config has no such field). Compiles
    /// through the compile cache, so the load that follows reuses the result. Blocking.
    pub fn component_kind(&self, bytes: &[u8]) -> Result<weft_state::PluginKind, crate::LoadError> {
        let sha = crate::engine::sha256_hex(bytes);
        let component = self.shared.cache.get(&sha, bytes)?;
        let ty = component.component_type();
        let exports: Vec<String> = ty
            .exports(&self.shared.engine)
            .map(|(name, _)| name.to_string())
            .collect();
        let exports_iface = |iface: &str| {
            exports.iter().any(|e| {
                e.split('@')
                    .next()
                    .is_some_and(|n| n == format!("weft:plugin/{iface}"))
            })
        };
        match (exports_iface("policy"), exports_iface("telemetry")) {
            (true, false) => Ok(weft_state::PluginKind::Policy),
            (false, true) => Ok(weft_state::PluginKind::Telemetry),
            (true, true) => Err(crate::LoadError::WrongWorld {
                world: "transport-policy or telemetry-sink",
                reason: "the component exports both weft:plugin/policy and weft:plugin/telemetry; say which in \
                         the resource's kind"
                    .into(),
            }),
            (false, false) => Err(crate::LoadError::WrongWorld {
                world: "transport-policy or telemetry-sink",
                reason: format!(
                    "the component exports neither weft:plugin/policy nor weft:plugin/telemetry (exports: {})",
                    if exports.is_empty() { "none".to_string() } else { exports.join(", ") }
                ),
            }),
        }
    }
}
