//! What each plugin instance's `Store` holds: the plugin's context (shared by its instances), the caps, the
//! resource table, the metric handles, the time budget of the call in progress and the WASI state; and the store's
//! epoch-deadline callback, which asks that budget.

use std::sync::Arc;
use std::time::Instant;

use wasmtime::component::{Resource, ResourceTable};
use wasmtime::{Result, StoreContextMut, UpdateDeadline};
use weft_state::PluginKind;

use super::budget::Budget;
use super::limiter::{Limiter, LogLimiter};
use crate::metrics::host::{HostMetrics, PluginCounters};
use crate::metrics::plugin::{MetricFamily, MetricsHub, PluginMetrics, Series};
use crate::wit::bindings::WorkloadRes;
use crate::wit::bindings::policy::weft::plugin::log;

/// What the host lets every plugin's instances log and define (from the host config), and where their
/// monotonic clock starts.
#[derive(Debug, Clone)]
pub(crate) struct ImportLimits {
    /// Metric series one plugin may create.
    pub max_series: usize,
    /// Log lines per second of a policy plugin.
    pub log_lines_per_sec: u32,
    /// Log lines per second of a telemetry plugin.
    pub telemetry_log_lines_per_sec: u32,
    pub max_log_len: usize,
    pub epoch_start: Instant,
}

/// Shared by every instance of one plugin version.
#[derive(Debug)]
pub(crate) struct PluginCtx {
    pub name: String,
    pub counters: PluginCounters,
    pub metrics: Arc<PluginMetrics>,
    pub hub: Arc<MetricsHub>,
    pub log: LogLimiter,
    pub max_log_len: usize,
    pub epoch_start: Instant,
}

impl PluginCtx {
    /// The context of a new version of plugin `name`: its series in the host's families (`metrics`, by name: they
    /// carry on across versions), a fresh metric set in `hub`, and its own log limiter.
    pub fn new(
        name: &str,
        kind: PluginKind,
        metrics: &HostMetrics,
        hub: &Arc<MetricsHub>,
        limits: &ImportLimits,
    ) -> Arc<Self> {
        let counters = metrics.for_plugin(
            name,
            match kind {
                PluginKind::Policy => "policy",
                PluginKind::Telemetry => "telemetry",
            },
        );
        Arc::new(PluginCtx {
            name: name.to_string(),
            metrics: hub.plugin(name, limits.max_series, counters.series_dropped.clone()),
            counters,
            hub: hub.clone(),
            log: LogLimiter::new(match kind {
                PluginKind::Policy => limits.log_lines_per_sec,
                PluginKind::Telemetry => limits.telemetry_log_lines_per_sec,
            }),
            max_log_len: limits.max_log_len,
            epoch_start: limits.epoch_start,
        })
    }
}

/// Per-instance WASI state: the unfinished line of stdout and of stderr.
#[derive(Debug, Default)]
pub(crate) struct WasiState {
    pub(super) stdout: Vec<u8>,
    pub(super) stderr: Vec<u8>,
}

/// The data of one instance's store.
pub(crate) struct StoreData {
    pub ctx: Arc<PluginCtx>,
    pub limiter: Limiter,
    pub table: ResourceTable,
    /// Metric handles this instance defined (the WIT `metric-id` is an index).
    pub metric_ids: Vec<Arc<MetricFamily>>,
    /// Series handles this instance registered (the WIT `series-id` is an index), deduplicated by series.
    pub series_ids: Vec<(Arc<MetricFamily>, Arc<Series>)>,
    pub(super) series_index: std::collections::HashMap<usize, u32>,
    /// The time budget of the call in progress.
    pub budget: Budget,
    stub_rep: u32,
    /// WASI state (unfinished stdout/stderr lines).
    pub wasi: WasiState,
}

impl StoreData {
    pub fn new(ctx: Arc<PluginCtx>, memory_limit: usize, tick: std::time::Duration) -> Self {
        Self {
            ctx,
            limiter: Limiter {
                memory_limit,
                memory_hit: false,
            },
            table: ResourceTable::new(),
            metric_ids: Vec::new(),
            series_ids: Vec::new(),
            series_index: std::collections::HashMap::new(),
            budget: Budget::new(tick),
            stub_rep: 0,
            wasi: WasiState::default(),
        }
    }

    /// A fresh handle number for an inert WASI resource.
    pub fn next_stub_rep(&mut self) -> u32 {
        self.stub_rep = self.stub_rep.wrapping_add(1);
        self.stub_rep
    }

    pub(crate) fn log_line(&self, level: log::Level, message: &str) {
        if !self.ctx.log.allow() {
            self.ctx.counters.log_dropped.inc();
            return;
        }
        let message = capped(message, self.ctx.max_log_len);
        let plugin = self.ctx.name.as_str();
        match level {
            log::Level::Trace => tracing::trace!(target: "plugin", plugin, "{message}"),
            log::Level::Debug => tracing::debug!(target: "plugin", plugin, "{message}"),
            log::Level::Info => tracing::info!(target: "plugin", plugin, "{message}"),
            log::Level::Warn => tracing::warn!(target: "plugin", plugin, "{message}"),
            log::Level::Error => tracing::error!(target: "plugin", plugin, "{message}"),
        }
    }

    /// A plugin's access log entry, written as ztunnel writes its own (`src/proxy/metrics.rs` `access_log!`):
    /// target `access`, no parent span, "connection complete", error level when it reports an error, else info.
    /// Rate-limited with the plugin's other lines.
    pub(crate) fn access_line(&self, e: &log::AccessEntry) {
        if !tracing::enabled!(target: "access", tracing::Level::ERROR) {
            return;
        }
        if !self.ctx.log.allow() {
            self.ctx.counters.log_dropped.inc();
            return;
        }
        let max = self.ctx.max_log_len;
        let s = |v| capped(v, max);
        let o = |v| capped_opt(v, max);
        let (src_workload, src_namespace, src_identity, src_cluster) = (
            o(&e.src_workload),
            o(&e.src_namespace),
            o(&e.src_identity),
            o(&e.src_cluster),
        );
        let (dst_service, dst_workload, dst_namespace, dst_identity, dst_cluster) = (
            o(&e.dst_service),
            o(&e.dst_workload),
            o(&e.dst_namespace),
            o(&e.dst_identity),
            o(&e.dst_cluster),
        );
        let dst_hbone_addr = o(&e.dst_hbone_addr);
        let (src_addr, dst_addr, direction) = (s(&e.src_addr), s(&e.dst_addr), s(&e.direction));
        let duration = format!("{}ms", e.duration_ms);
        let error = o(&e.error);
        macro_rules! access {
            ($level:expr) => {
                tracing::event!(
                    target: "access",
                    parent: None,
                    $level,
                    src.addr = %src_addr,
                    src.workload = src_workload.as_deref(),
                    src.namespace = src_namespace.as_deref(),
                    src.identity = src_identity.as_deref(),
                    src.cluster = src_cluster.as_deref(),
                    dst.addr = %dst_addr,
                    dst.hbone_addr = dst_hbone_addr.as_deref().map(tracing::field::display),
                    dst.service = dst_service.as_deref(),
                    dst.workload = dst_workload.as_deref(),
                    dst.namespace = dst_namespace.as_deref(),
                    dst.identity = dst_identity.as_deref(),
                    dst.cluster = dst_cluster.as_deref(),
                    direction = &*direction,
                    bytes_sent = e.bytes_sent,
                    bytes_recv = e.bytes_recv,
                    duration = duration.as_str(),
                    error = error.as_deref(),
                    "connection complete"
                )
            };
        }
        if error.is_some() {
            access!(tracing::Level::ERROR);
        } else {
            access!(tracing::Level::INFO);
        }
    }

    pub(super) fn workload(&self, r: &Resource<WorkloadRes>) -> Result<&weft_hooks::WorkloadMeta> {
        Ok(&self.table.get(r)?.meta)
    }
}

/// `message`, cut to `max` bytes (on a character boundary, marked with `…`).
fn capped(message: &str, max: usize) -> std::borrow::Cow<'_, str> {
    if message.len() <= max {
        return std::borrow::Cow::Borrowed(message);
    }
    let mut cut = max;
    while !message.is_char_boundary(cut) {
        cut -= 1;
    }
    let mut m = message[..cut].to_string();
    m.push('…');
    std::borrow::Cow::Owned(m)
}

/// An optional value, cut as [`capped`] cuts.
fn capped_opt(v: &Option<String>, max: usize) -> Option<std::borrow::Cow<'_, str>> {
    v.as_deref().map(|v| capped(v, max))
}

/// The store's epoch-deadline callback: the call in progress goes on while its budget lasts.
pub(crate) fn on_deadline(store: StoreContextMut<'_, StoreData>) -> Result<UpdateDeadline> {
    Ok(store.data().budget.check())
}
