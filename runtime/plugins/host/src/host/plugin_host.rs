//! `PluginHost`: builds the engine, the epoch ticker, the telemetry thread and the plugin set with its rollout
//! thread from the config, and puts the chain behind `weft_hooks::ConnectionHooks`.

use std::sync::{Arc, mpsc};
use std::time::Instant;

use arc_swap::ArcSwap;
use prometheus_client::registry::Registry;
use weft_hooks::{CloseRecord, ConnectionHooks, ConnectionRecord, Verdict};

use super::telemetry::{Msg, TelemetryQueue};
use crate::base::config::HostConfig;
use crate::guest::instance::Limits;
use crate::lifecycle::chain::Chain;
use crate::lifecycle::plugins::{Loading, Plugins};
use crate::lifecycle::report::AppliedVersion;
use crate::lifecycle::rollback;
use crate::lifecycle::rollout::RollbackEvent;
use crate::lifecycle::shadow::{self, SampleLimits, ShadowBook, ShadowReport};
use crate::lifecycle::status::PluginStatus;
use crate::metrics::host::HostMetrics;
use crate::metrics::plugin::{LabelLimits, MetricsHub};
use crate::sandbox::engine;
use crate::sandbox::epoch::Ticker;
use crate::sandbox::store::ImportLimits;
use crate::versions::cache::CompileCache;
use crate::versions::probation::Wake;
use crate::versions::version::InstanceSettings;

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

/// The Wasm plugin host. Cheap to share (`Arc<PluginHost>`); implements [`ConnectionHooks`] for the data path.
pub struct PluginHost {
    /// The plugin set, shared with the rollout thread.
    pub(crate) plugins: Arc<Plugins>,
    config: HostConfig,
    telemetry: TelemetryQueue,
    ticker: Ticker,
}

impl Drop for PluginHost {
    fn drop(&mut self) {
        let _ = self.plugins.wake.send(Wake::Stop);
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
        let engine = engine::build(&config).map_err(HostError::Engine)?;
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
        let (shadow_queue, shadow_jobs) = shadow::queue(config.shadow_queue);
        let shadow_book = Arc::new(ShadowBook::new(
            metrics.clone(),
            config.clock.clone(),
            SampleLimits {
                ring: config.shadow_samples,
                per_interval: config.shadow_samples_per_interval,
                interval: config.shadow_sample_interval,
            },
        ));
        {
            let book = shadow_book.clone();
            std::thread::Builder::new()
                .name("weft-plugin-shadow".into())
                .spawn(move || shadow::run(shadow_jobs, book))?;
        }
        let loading = Loading {
            cache: CompileCache::new(
                engine.clone(),
                config.engine_settings(),
                config.compiler.clone(),
                config.cache_dir.clone(),
            ),
            instances: InstanceSettings {
                engine,
                limits,
                prewarm: config.prewarm_instances,
                max_idle: config.max_idle_per_plugin,
                release_memory: config.release_memory,
            },
            imports: ImportLimits {
                max_series: config.max_series_per_plugin,
                log_lines_per_sec: config.log_lines_per_sec,
                telemetry_log_lines_per_sec: config.telemetry_log_lines_per_sec,
                max_log_len: config.max_log_len,
                epoch_start: Instant::now(),
            },
            rollout: config.rollout,
            clock: config.clock.clone(),
            allow_unenforced_policies: config.allow_unenforced_policies,
            shadow_queue,
            shadow_book,
        };
        let limits = LabelLimits {
            max_value_len: config.max_label_value_len,
            max_bytes: config.max_label_bytes_per_plugin,
        };
        let hub = Arc::new(MetricsHub::new(limits));
        let shadow_hub = Arc::new(MetricsHub::new(limits));
        let (wake, woken) = mpsc::channel();
        let plugins = Arc::new(Plugins::new(chain, wake, metrics, hub, shadow_hub, loading));
        rollback::start_thread(plugins.clone(), woken)?;
        Ok(Self {
            plugins,
            config,
            telemetry,
            ticker,
        })
    }

    /// What loading a version takes (the compile cache, the engine...), as handed to the plugin set.
    pub(crate) fn loading(&self) -> &Loading {
        &self.plugins.loading
    }

    /// Automatic rollbacks as they happen (the xDS source reports each to the control plane as a NACK).
    pub fn rollbacks(&self) -> tokio::sync::broadcast::Receiver<RollbackEvent> {
        self.plugins.rollbacks.subscribe()
    }

    /// The outcome of the latest `apply`, with the state version it applied.
    pub fn applied(&self) -> tokio::sync::watch::Receiver<Arc<AppliedVersion>> {
        self.plugins.reports.subscribe()
    }

    /// Waits until a state version at or after `version` has been applied and returns that outcome (versions
    /// applied together are reported once, under the latest).
    pub async fn wait_applied(&self, version: u64) -> Arc<AppliedVersion> {
        let mut rx = self.plugins.reports.subscribe();
        let waited = rx
            .wait_for(|a| a.state_version >= version)
            .await
            .map(|a| a.clone());
        // The sender lives as long as the host, which `&self` proves; fall back to the latest all the same.
        waited.unwrap_or_else(|_| self.plugins.reports.borrow().clone())
    }

    /// Judges every probation now (rolls back what crossed its threshold, ends what outlived its window). The
    /// rollout thread does this when a call wakes it and once a second; tests with a [`crate::ManualClock`] call it
    /// after moving the clock.
    pub fn check_rollouts(&self) -> Vec<RollbackEvent> {
        self.plugins.check()
    }

    /// The host's configuration.
    pub fn config(&self) -> &HostConfig {
        &self.config
    }

    /// Registers the per-plugin host metrics (`weft_plugin_*`) and every plugin-defined metric (names and labels
    /// exactly as the plugin defined them; a counter `x_total` is exposed as `x_total`) into `registry`. Register
    /// into the root registry (no prefix) so plugin metric names stay as defined. Plugin metrics appear and
    /// disappear with the plugins; nothing needs re-registering after `apply`.
    pub fn register_metrics(&self, registry: &mut Registry) {
        self.plugins.metrics.register(registry, &self.plugins.hub);
    }

    /// Registers the metrics of the telemetry plugins' shadow versions into `registry` (a registry of their own,
    /// exposed apart: a shadow defines the same names as the version it shadows), with the same names, labels and
    /// limits as serving versions' metrics.
    pub fn register_shadow_metrics(&self, registry: &mut Registry) {
        registry.register_collector(Box::new(self.plugins.shadow_hub.clone()));
    }

    /// The epoch ticker's state: it ticks only while guest calls run and parks when they stop (tests, debugging).
    pub fn epoch_ticker(&self) -> EpochTickerStatus {
        let clock = self.ticker.clock();
        EpochTickerStatus {
            ticks: clock.ticks(),
            parks: clock.parks(),
            parked: clock.is_parked(),
            interval: clock.interval(),
        }
    }

    /// The Istio authorization policies in force that no serving policy plugin enforces at all, each with why
    /// (empty when one does, or the operator opted out with `--allow-unenforced-policies`). Connections to the
    /// workloads they apply to are denied.
    pub fn unenforced_policies(&self) -> Vec<String> {
        self.plugins.unenforced_policies()
    }

    /// A status line per configured plugin, in name order.
    pub fn status(&self) -> Vec<PluginStatus> {
        self.plugins.status()
    }

    /// What the shadow version of policy plugin `plugin` decided so far, compared with the serving version: counts
    /// per (direction, serving verdict, shadow verdict), skipped decisions and the latest divergence samples. `None`
    /// when the plugin has no shadow.
    pub fn shadow_report(&self, plugin: &str) -> Option<ShadowReport> {
        self.plugins.loading.shadow_book.report(plugin)
    }

    /// The same metrics as Prometheus/OpenMetrics text (tests, debugging).
    pub fn metrics_text(&self) -> String {
        text_of(|r| self.register_metrics(r))
    }

    /// The Prometheus text of the telemetry plugins' shadow versions' metrics (what `/metrics/shadow` shows).
    pub fn shadow_metrics_text(&self) -> String {
        text_of(|r| self.register_shadow_metrics(r))
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
        let v = self
            .plugins
            .applied
            .lock()
            .ok()?
            .serving
            .get(plugin)
            .cloned()?;
        Some(v.authorize_fresh(conn))
    }
}

/// The text exposition of a registry `register` fills (empty if it cannot be encoded).
fn text_of(register: impl FnOnce(&mut Registry)) -> String {
    let mut registry = Registry::default();
    register(&mut registry);
    let mut out = String::new();
    if prometheus_client::encoding::text::encode(&mut out, &registry).is_err() {
        out.clear();
    }
    out
}

impl ConnectionHooks for PluginHost {
    fn authorize(&self, conn: &ConnectionRecord) -> Verdict {
        self.plugins.chain.load().authorize(conn)
    }

    fn on_open(&self, conn: &Arc<ConnectionRecord>) {
        if !self.plugins.chain.load().telemetry.is_empty() {
            self.telemetry.send(Msg::Opened(conn.clone()));
        }
    }

    fn on_close(&self, conn: &Arc<ConnectionRecord>, close: &CloseRecord) {
        if !self.plugins.chain.load().telemetry.is_empty() {
            self.telemetry
                .send(Msg::Closed(conn.clone(), close.clone()));
        }
    }

    fn policy_changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.plugins.changes.subscribe()
    }
}
