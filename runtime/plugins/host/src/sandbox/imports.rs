//! The host side of a plugin's imports: `log` (rate-limited), `metrics` (capped, through the plugin's metric
//! set), `clock` (monotonic) and the lazy `workload` resource.

use std::sync::Arc;

use wasmtime::Result;
use wasmtime::component::Resource;

use super::store::StoreData;
use crate::metrics::plugin::{DropReason, Shape, Update};
use crate::wit::bindings::WorkloadRes;
use crate::wit::bindings::policy::weft::plugin::{clock, log, metrics, types};

impl StoreData {
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
            self.ctx.metrics.drop_update(DropReason::BadUpdate);
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
            None => self.ctx.metrics.drop_update(DropReason::BadUpdate),
        }
    }

    fn update(&self, id: u32, labels: Vec<String>, update: Update) {
        match self.metric_ids.get(id as usize) {
            Some(family) => self.ctx.metrics.update(family, labels, update),
            None => {
                self.ctx.metrics.drop_update(DropReason::BadUpdate);
            }
        }
    }
}

impl log::Host for StoreData {
    fn log(&mut self, level: log::Level, message: String) -> Result<()> {
        self.log_line(level, &message);
        Ok(())
    }

    fn access(&mut self, entry: log::AccessEntry) -> Result<()> {
        self.access_line(&entry);
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
        Ok(crate::wit::convert::workload_meta(self.workload(&w)?))
    }
    fn key(&mut self, w: Resource<WorkloadRes>) -> Result<u64> {
        Ok(self.table.get(&w)?.key)
    }
    fn drop(&mut self, w: Resource<WorkloadRes>) -> Result<()> {
        self.table.delete(w)?;
        Ok(())
    }
}
