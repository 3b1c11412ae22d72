//! What each plugin instance's `Store` holds, the sandbox limiter, and the host side of the imports: logging
//! (rate-limited), metrics (capped), the monotonic clock and the lazy `workload` resource.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use wasmtime::component::{Resource, ResourceTable};
use wasmtime::{ResourceLimiter, Result};

use crate::bindings::WorkloadRes;
use crate::bindings::policy::weft::plugin::{clock, log, metrics, types};
use crate::host_metrics::PluginCounters;
use crate::plugin_metrics::{MetricFamily, MetricsHub, PluginMetrics, Series, Shape, Update};

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

/// A token bucket for log lines (per plugin name; all instances share it).
#[derive(Debug)]
pub(crate) struct LogLimiter {
    per_sec: u32,
    state: Mutex<(f64, Instant)>,
    pub dropped: AtomicU64,
}

impl LogLimiter {
    pub fn new(per_sec: u32) -> Self {
        Self {
            per_sec,
            state: Mutex::new((f64::from(per_sec), Instant::now())),
            dropped: AtomicU64::new(0),
        }
    }

    pub fn allow_pub(&self) -> bool {
        self.allow()
    }

    fn allow(&self) -> bool {
        let Ok(mut st) = self.state.lock() else {
            return false;
        };
        let now = Instant::now();
        let refill = now.duration_since(st.1).as_secs_f64() * f64::from(self.per_sec);
        st.0 = (st.0 + refill).min(f64::from(self.per_sec.max(1)));
        st.1 = now;
        if st.0 >= 1.0 {
            st.0 -= 1.0;
            true
        } else {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            false
        }
    }
}

/// The sandbox's memory and table caps. Hitting the memory cap traps (and is remembered, to report the failure
/// as `memory` rather than a generic trap).
#[derive(Debug)]
pub(crate) struct Limiter {
    pub memory_limit: usize,
    pub memory_hit: bool,
}

const MAX_TABLE_ELEMENTS: usize = 100_000;

impl ResourceLimiter for Limiter {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> Result<bool> {
        if desired > self.memory_limit {
            self.memory_hit = true;
            return Err(wasmtime::format_err!(
                "memory limit of {} bytes exceeded (wanted {desired})",
                self.memory_limit
            ));
        }
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> Result<bool> {
        Ok(desired <= MAX_TABLE_ELEMENTS)
    }

    fn instances(&self) -> usize {
        32
    }

    fn tables(&self) -> usize {
        32
    }

    fn memories(&self) -> usize {
        4
    }
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
    series_index: std::collections::HashMap<usize, u32>,
    /// The time budget of the call in progress.
    pub budget: crate::budget::Budget,
    stub_rep: u32,
    /// WASI state (unfinished stdout/stderr lines).
    pub wasi: crate::wasi::WasiState,
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
            budget: crate::budget::Budget::new(tick),
            stub_rep: 0,
            wasi: crate::wasi::WasiState::default(),
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
        let mut message = message.to_string();
        if message.len() > self.ctx.max_log_len {
            let mut cut = self.ctx.max_log_len;
            while !message.is_char_boundary(cut) {
                cut -= 1;
            }
            message.truncate(cut);
            message.push('…');
        }
        let plugin = self.ctx.name.as_str();
        match level {
            log::Level::Trace => tracing::trace!(target: "plugin", plugin, "{message}"),
            log::Level::Debug => tracing::debug!(target: "plugin", plugin, "{message}"),
            log::Level::Info => tracing::info!(target: "plugin", plugin, "{message}"),
            log::Level::Warn => tracing::warn!(target: "plugin", plugin, "{message}"),
            log::Level::Error => tracing::error!(target: "plugin", plugin, "{message}"),
        }
    }

    fn workload(&self, r: &Resource<WorkloadRes>) -> Result<&weft_hooks::WorkloadMeta> {
        Ok(&self.table.get(r)?.meta)
    }

    fn define(
        &mut self,
        name: String,
        help: String,
        labels: Vec<String>,
        shape: Shape,
    ) -> Result<u32, String> {
        let family = self
            .ctx
            .hub
            .define(&self.ctx.metrics, &name, &help, labels, shape)?;
        if let Some(i) = self.metric_ids.iter().position(|f| Arc::ptr_eq(f, &family)) {
            return Ok(i as u32);
        }
        if self.metric_ids.len() >= 1024 {
            return Err("too many metric handles".to_string());
        }
        self.metric_ids.push(family);
        Ok((self.metric_ids.len() - 1) as u32)
    }

    fn register_series(&mut self, metric: u32, labels: Vec<String>) -> Result<u32, String> {
        let Some(family) = self.metric_ids.get(metric as usize).cloned() else {
            self.ctx
                .metrics
                .drop_update(crate::plugin_metrics::DropReason::BadUpdate);
            return Err(format!("unknown metric handle {metric}"));
        };
        let series = self
            .ctx
            .metrics
            .series(&family, labels)
            .inspect_err(|reason| self.ctx.metrics.drop_update(*reason))
            .map_err(|reason| format!("series refused: {}", reason.as_str()))?;
        if let Some(id) = self.series_index.get(&(Arc::as_ptr(&series) as usize)) {
            return Ok(*id);
        }
        if self.series_ids.len() >= self.ctx.metrics.max_series().saturating_mul(2) {
            return Err("too many series handles".to_string());
        }
        let id = self.series_ids.len() as u32;
        self.series_index.insert(Arc::as_ptr(&series) as usize, id);
        self.series_ids.push((family, series));
        Ok(id)
    }

    fn update_series(&self, id: u32, update: Update) {
        match self.series_ids.get(id as usize) {
            Some((family, series)) => self.ctx.metrics.update_series(family, series, update),
            None => self
                .ctx
                .metrics
                .drop_update(crate::plugin_metrics::DropReason::BadUpdate),
        }
    }

    fn update(&self, id: u32, labels: Vec<String>, update: Update) {
        match self.metric_ids.get(id as usize) {
            Some(family) => self.ctx.metrics.update(family, labels, update),
            None => {
                self.ctx
                    .metrics
                    .drop_update(crate::plugin_metrics::DropReason::BadUpdate);
            }
        }
    }
}

impl log::Host for StoreData {
    fn log(&mut self, level: log::Level, message: String) -> Result<()> {
        self.log_line(level, &message);
        Ok(())
    }
}

impl metrics::Host for StoreData {
    fn define_counter(
        &mut self,
        name: String,
        help: String,
        label_names: Vec<String>,
    ) -> Result<Result<u32, String>> {
        Ok(self.define(name, help, label_names, Shape::Counter))
    }

    fn define_gauge(
        &mut self,
        name: String,
        help: String,
        label_names: Vec<String>,
    ) -> Result<Result<u32, String>> {
        Ok(self.define(name, help, label_names, Shape::Gauge))
    }

    fn define_histogram(
        &mut self,
        name: String,
        help: String,
        label_names: Vec<String>,
        buckets: Vec<f64>,
    ) -> Result<Result<u32, String>> {
        if buckets.len() > 64 {
            return Ok(Err("more than 64 buckets".to_string()));
        }
        Ok(self.define(name, help, label_names, Shape::Histogram(buckets)))
    }

    fn counter_add(&mut self, metric: u32, label_values: Vec<String>, value: u64) -> Result<()> {
        self.update(metric, label_values, Update::CounterAdd(value));
        Ok(())
    }

    fn gauge_set(&mut self, metric: u32, label_values: Vec<String>, value: i64) -> Result<()> {
        self.update(metric, label_values, Update::GaugeSet(value));
        Ok(())
    }

    fn gauge_add(&mut self, metric: u32, label_values: Vec<String>, delta: i64) -> Result<()> {
        self.update(metric, label_values, Update::GaugeAdd(delta));
        Ok(())
    }

    fn histogram_observe(
        &mut self,
        metric: u32,
        label_values: Vec<String>,
        value: f64,
    ) -> Result<()> {
        self.update(metric, label_values, Update::Observe(value));
        Ok(())
    }

    fn series(&mut self, metric: u32, label_values: Vec<String>) -> Result<Result<u32, String>> {
        Ok(self.register_series(metric, label_values))
    }

    fn series_counter_add(&mut self, series: u32, value: u64) -> Result<()> {
        self.update_series(series, Update::CounterAdd(value));
        Ok(())
    }

    fn series_gauge_set(&mut self, series: u32, value: i64) -> Result<()> {
        self.update_series(series, Update::GaugeSet(value));
        Ok(())
    }

    fn series_gauge_add(&mut self, series: u32, delta: i64) -> Result<()> {
        self.update_series(series, Update::GaugeAdd(delta));
        Ok(())
    }

    fn series_histogram_observe(&mut self, series: u32, value: f64) -> Result<()> {
        self.update_series(series, Update::Observe(value));
        Ok(())
    }
}

impl clock::Host for StoreData {
    fn monotonic_now(&mut self) -> Result<u64> {
        Ok(self.ctx.epoch_start.elapsed().as_nanos() as u64)
    }
}

impl types::Host for StoreData {}

impl types::HostWorkload for StoreData {
    fn uid(&mut self, w: Resource<WorkloadRes>) -> Result<String> {
        Ok(self.workload(&w)?.uid.clone())
    }
    fn name(&mut self, w: Resource<WorkloadRes>) -> Result<String> {
        Ok(self.workload(&w)?.name.clone())
    }
    fn namespace(&mut self, w: Resource<WorkloadRes>) -> Result<String> {
        Ok(self.workload(&w)?.namespace.clone())
    }
    fn service_account(&mut self, w: Resource<WorkloadRes>) -> Result<String> {
        Ok(self.workload(&w)?.service_account.clone())
    }
    fn trust_domain(&mut self, w: Resource<WorkloadRes>) -> Result<String> {
        Ok(self.workload(&w)?.trust_domain.clone())
    }
    fn node(&mut self, w: Resource<WorkloadRes>) -> Result<String> {
        Ok(self.workload(&w)?.node.clone())
    }
    fn label(&mut self, w: Resource<WorkloadRes>, key: String) -> Result<Option<String>> {
        Ok(self
            .workload(&w)?
            .labels
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| v.clone()))
    }
    fn authorization_policies(&mut self, w: Resource<WorkloadRes>) -> Result<Vec<String>> {
        Ok(self.workload(&w)?.authorization_policies.clone())
    }
    fn meta(&mut self, w: Resource<WorkloadRes>) -> Result<types::WorkloadMeta> {
        Ok(crate::convert::workload_meta(self.workload(&w)?))
    }
    fn key(&mut self, w: Resource<WorkloadRes>) -> Result<u64> {
        Ok(self.table.get(&w)?.key)
    }
    fn drop(&mut self, w: Resource<WorkloadRes>) -> Result<()> {
        self.table.delete(w)?;
        Ok(())
    }
}
