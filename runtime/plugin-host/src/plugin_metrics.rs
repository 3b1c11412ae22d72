//! Plugin-defined metrics: families keyed by plugin name (so a new version keeps counting where the old one was),
//! a series cap per plugin, and a `prometheus_client` collector that serves them with the plugin's names and labels.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::Counter as HostCounter;

const MAX_FAMILIES_PER_PLUGIN: usize = 256;
const MAX_LABELS: usize = 32;

/// What a family holds.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Shape {
    Counter,
    Gauge,
    Histogram(Vec<f64>),
}

#[derive(Debug)]
struct HistState {
    sum: f64,
    count: u64,
    buckets: Vec<u64>,
}

#[derive(Debug)]
enum Series {
    Counter(AtomicU64),
    Gauge(AtomicI64),
    Histogram(Mutex<HistState>),
}

/// One metric family a plugin defined.
#[derive(Debug)]
pub(crate) struct MetricFamily {
    name: String,
    help: String,
    shape: Shape,
    label_names: Vec<String>,
    series: RwLock<HashMap<Vec<String>, Series>>,
}

/// One plugin's metrics (shared by all its versions and instances).
#[derive(Debug)]
pub(crate) struct PluginMetrics {
    max_series: usize,
    series: AtomicUsize,
    dropped: HostCounter,
    families: Mutex<BTreeMap<String, Arc<MetricFamily>>>,
}

/// All plugins' metrics; registered into the admin registry as a collector.
#[derive(Debug, Default)]
pub struct MetricsHub {
    plugins: RwLock<BTreeMap<String, Arc<PluginMetrics>>>,
}

fn valid_name(s: &str, colon: bool) -> bool {
    let mut chars = s.chars();
    let ok_first = |c: char| c.is_ascii_alphabetic() || c == '_' || (colon && c == ':');
    chars.next().is_some_and(ok_first)
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || (colon && c == ':'))
}

impl MetricsHub {
    /// The metrics of `plugin`, created on first use.
    pub(crate) fn plugin(
        &self,
        plugin: &str,
        max_series: usize,
        dropped: HostCounter,
    ) -> Arc<PluginMetrics> {
        if let Some(p) = self
            .plugins
            .read()
            .ok()
            .and_then(|m| m.get(plugin).cloned())
        {
            return p;
        }
        let mut map = match self.plugins.write() {
            Ok(m) => m,
            Err(poisoned) => poisoned.into_inner(),
        };
        map.entry(plugin.to_string())
            .or_insert_with(|| {
                Arc::new(PluginMetrics {
                    max_series,
                    series: AtomicUsize::new(0),
                    dropped,
                    families: Mutex::new(BTreeMap::new()),
                })
            })
            .clone()
    }

    /// Forgets a removed plugin's metrics.
    pub(crate) fn remove(&self, plugin: &str) {
        if let Ok(mut m) = self.plugins.write() {
            m.remove(plugin);
        }
    }

    /// The family another plugin defined under `metric`, with its owner's name.
    fn defined_elsewhere(
        &self,
        metric: &str,
        except: &PluginMetrics,
    ) -> Option<(String, Arc<MetricFamily>)> {
        let map = self.plugins.read().ok()?;
        map.iter()
            .filter(|(_, p)| !std::ptr::eq(Arc::as_ptr(p), except))
            .find_map(|(name, p)| {
                let f = p.families.lock().ok()?.get(metric).cloned()?;
                Some((name.clone(), f))
            })
    }

    /// Defines (or finds, with the same shape) a family for `plugin`.
    pub(crate) fn define(
        &self,
        plugin: &PluginMetrics,
        name: &str,
        help: &str,
        labels: Vec<String>,
        shape: Shape,
    ) -> Result<Arc<MetricFamily>, String> {
        if !valid_name(name, true) || name.len() > 200 {
            return Err(format!("invalid metric name `{name}`"));
        }
        if name.starts_with("weft_") {
            return Err(format!(
                "metric name `{name}`: the `weft_` prefix is reserved for the host"
            ));
        }
        if labels.len() > MAX_LABELS {
            return Err(format!("metric `{name}`: more than {MAX_LABELS} labels"));
        }
        for l in &labels {
            if !valid_name(l, false) || l.starts_with("__") {
                return Err(format!("metric `{name}`: invalid label name `{l}`"));
            }
        }
        if let Shape::Histogram(b) = &shape
            && (b.is_empty()
                || b.windows(2).any(|w| w[0] >= w[1])
                || b.iter().any(|x| !x.is_finite()))
        {
            return Err(format!(
                "metric `{name}`: buckets must be finite and strictly ascending"
            ));
        }
        // Counters are exposed as `<name>_total`: key families by the name without the suffix.
        let key = match shape {
            Shape::Counter => name.strip_suffix("_total").unwrap_or(name),
            _ => name,
        };
        let elsewhere = self.defined_elsewhere(key, plugin);
        let mut families = plugin
            .families
            .lock()
            .map_err(|_| "metrics lock poisoned".to_string())?;
        // Plugins (e.g. two instances of one plugin under different names) share a family of the same shape.
        if let Some((owner, family)) = elsewhere {
            if family.shape == shape && family.label_names == labels {
                families.insert(key.to_string(), family.clone());
                return Ok(family);
            }
            return Err(format!(
                "metric `{name}` is already defined by plugin `{owner}` with other labels or another type"
            ));
        }
        if let Some(existing) = families.get(key)
            && existing.shape == shape
            && existing.label_names == labels
        {
            return Ok(existing.clone());
        }
        if !families.contains_key(key) && families.len() >= MAX_FAMILIES_PER_PLUGIN {
            return Err(format!("more than {MAX_FAMILIES_PER_PLUGIN} metrics"));
        }
        // New, or redefined with another shape (a new version): a fresh family replaces the old one.
        let family = Arc::new(MetricFamily {
            name: key.to_string(),
            help: help.chars().take(500).collect(),
            shape,
            label_names: labels,
            series: RwLock::new(HashMap::new()),
        });
        if let Some(old) = families.insert(key.to_string(), family.clone()) {
            let n = old.series.read().map_or(0, |s| s.len());
            plugin.series.fetch_sub(
                n.min(plugin.series.load(Ordering::Relaxed)),
                Ordering::Relaxed,
            );
        }
        Ok(family)
    }
}

/// An update to one series.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Update {
    CounterAdd(u64),
    GaugeSet(i64),
    GaugeAdd(i64),
    Observe(f64),
}

impl PluginMetrics {
    /// Applies an update; a wrong kind, a wrong label count or a full series budget drops it (counted).
    pub(crate) fn update(&self, family: &MetricFamily, labels: Vec<String>, update: Update) {
        let kind_ok = matches!(
            (&family.shape, update),
            (Shape::Counter, Update::CounterAdd(_))
                | (Shape::Gauge, Update::GaugeSet(_) | Update::GaugeAdd(_))
                | (Shape::Histogram(_), Update::Observe(_))
        );
        if !kind_ok || labels.len() != family.label_names.len() {
            self.dropped.inc();
            return;
        }
        if let Ok(series) = family.series.read()
            && let Some(s) = series.get(&labels)
        {
            apply(s, &family.shape, update);
            return;
        }
        let Ok(mut series) = family.series.write() else {
            self.dropped.inc();
            return;
        };
        if !series.contains_key(&labels) {
            if self.series.fetch_add(1, Ordering::Relaxed) >= self.max_series {
                self.series.fetch_sub(1, Ordering::Relaxed);
                self.dropped.inc();
                return;
            }
            let fresh = match &family.shape {
                Shape::Counter => Series::Counter(AtomicU64::new(0)),
                Shape::Gauge => Series::Gauge(AtomicI64::new(0)),
                Shape::Histogram(b) => Series::Histogram(Mutex::new(HistState {
                    sum: 0.0,
                    count: 0,
                    buckets: vec![0; b.len()],
                })),
            };
            series.insert(labels.clone(), fresh);
        }
        if let Some(s) = series.get(&labels) {
            apply(s, &family.shape, update);
        }
    }
}

fn apply(series: &Series, shape: &Shape, update: Update) {
    match (series, update) {
        (Series::Counter(c), Update::CounterAdd(v)) => {
            c.fetch_add(v, Ordering::Relaxed);
        }
        (Series::Gauge(g), Update::GaugeSet(v)) => g.store(v, Ordering::Relaxed),
        (Series::Gauge(g), Update::GaugeAdd(v)) => {
            g.fetch_add(v, Ordering::Relaxed);
        }
        (Series::Histogram(h), Update::Observe(v)) => {
            if let (Ok(mut h), Shape::Histogram(bounds)) = (h.lock(), shape) {
                h.sum += v;
                h.count += 1;
                if let Some(i) = bounds.iter().position(|b| v <= *b) {
                    h.buckets[i] += 1;
                }
            }
        }
        _ => {}
    }
}

impl Collector for MetricsHub {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Ok(plugins) = self.plugins.read() else {
            return Ok(());
        };
        let mut seen = std::collections::BTreeSet::new();
        for plugin in plugins.values() {
            let Ok(families) = plugin.families.lock() else {
                continue;
            };
            for family in families.values() {
                if !seen.insert(family.name.clone()) {
                    continue;
                }
                let metric_type = match family.shape {
                    Shape::Counter => MetricType::Counter,
                    Shape::Gauge => MetricType::Gauge,
                    Shape::Histogram(_) => MetricType::Histogram,
                };
                let Ok(series) = family.series.read() else {
                    continue;
                };
                if series.is_empty() {
                    continue;
                }
                let mut metric =
                    encoder.encode_descriptor(&family.name, &family.help, None, metric_type)?;
                let mut rows: Vec<_> = series.iter().collect();
                rows.sort_by(|a, b| a.0.cmp(b.0));
                for (values, s) in rows {
                    let labels: Vec<(String, String)> = family
                        .label_names
                        .iter()
                        .cloned()
                        .zip(values.iter().cloned())
                        .collect();
                    let mut m = metric.encode_family(&labels)?;
                    match s {
                        Series::Counter(c) => m.encode_counter::<NoLabelSet, _, u64>(
                            &c.load(Ordering::Relaxed),
                            None,
                        )?,
                        Series::Gauge(g) => m.encode_gauge(&g.load(Ordering::Relaxed))?,
                        Series::Histogram(h) => {
                            let Ok(h) = h.lock() else { continue };
                            let Shape::Histogram(bounds) = &family.shape else {
                                continue;
                            };
                            // The encoder accumulates: hand it per-bucket counts, +Inf last.
                            let mut buckets: Vec<(f64, u64)> = bounds
                                .iter()
                                .copied()
                                .zip(h.buckets.iter().copied())
                                .collect();
                            let finite: u64 = h.buckets.iter().sum();
                            buckets.push((f64::INFINITY, h.count.saturating_sub(finite)));
                            m.encode_histogram::<NoLabelSet>(h.sum, h.count, &buckets, None)?;
                        }
                    }
                }
            }
        }
        Ok(())
    }
}
