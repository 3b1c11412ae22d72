//! Plugin-defined metrics: one set per plugin version (a new code or config version starts empty, and a removed
//! plugin's series are freed with it, as Envoy drops a removed extension's stats; a new control-plane state keeps
//! the set), bounded in what a plugin can make the host hold, and a `prometheus_client` collector that serves the
//! serving versions' sets with the plugin's names and labels.
//!
//! Bounds: a label value longer than [`LabelLimits::max_value_len`] bytes is refused (not truncated: two long
//! values would silently merge into one series), as is a new series past the plugin's series cap or past its
//! label-bytes budget (the label names and values of all its series, which is also what its exposition costs).
//! Each refused update is counted in `weft_plugin_metric_dropped_total{plugin,reason}`. Label names are at most
//! [`MAX_LABEL_NAME_LEN`] bytes and [`MAX_LABELS`] per metric (checked when the metric is defined).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::Counter as HostCounter;

const MAX_FAMILIES_PER_PLUGIN: usize = 256;
/// Most labels one metric may have.
pub(crate) const MAX_LABELS: usize = 32;
/// Longest label name.
pub(crate) const MAX_LABEL_NAME_LEN: usize = 128;

/// How much a plugin's labels may hold (from the host config).
#[derive(Debug, Clone, Copy)]
pub(crate) struct LabelLimits {
    /// Longest label value, in bytes.
    pub max_value_len: usize,
    /// Label bytes (names and values) of all the series of one plugin version.
    pub max_bytes: usize,
}

impl Default for LabelLimits {
    fn default() -> Self {
        Self {
            max_value_len: 1024,
            max_bytes: 8 << 20,
        }
    }
}

/// Why a metric update was dropped (the `reason` label of `weft_plugin_metric_dropped_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DropReason {
    /// A metric handle the instance never defined, the wrong update for the metric's type, or the wrong number
    /// of label values.
    BadUpdate,
    /// A label value longer than the limit.
    LabelValueTooLong,
    /// The plugin's series cap is reached.
    SeriesCap,
    /// The plugin's label-bytes budget is spent.
    LabelBytes,
}

impl DropReason {
    /// All reasons, for pre-created series.
    pub const ALL: [DropReason; 4] = [
        DropReason::BadUpdate,
        DropReason::LabelValueTooLong,
        DropReason::SeriesCap,
        DropReason::LabelBytes,
    ];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            DropReason::BadUpdate => "bad_update",
            DropReason::LabelValueTooLong => "label_value_too_long",
            DropReason::SeriesCap => "series_cap",
            DropReason::LabelBytes => "label_bytes",
        }
    }
}

/// One plugin's dropped-update counters, one per [`DropReason`] (cheap to clone: shared).
#[derive(Debug, Clone, Default)]
pub(crate) struct MetricDrops {
    counters: Vec<HostCounter>,
}

impl MetricDrops {
    /// From counters in [`DropReason::ALL`] order.
    pub fn new(counters: Vec<HostCounter>) -> Self {
        Self { counters }
    }

    /// Counts one dropped update.
    pub fn inc(&self, reason: DropReason) {
        if let Some(c) = DropReason::ALL
            .iter()
            .position(|r| *r == reason)
            .and_then(|i| self.counters.get(i))
        {
            c.inc();
        }
    }
}

/// What a family holds.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Shape {
    Counter,
    Gauge,
    Histogram(Vec<f64>),
}

#[derive(Debug)]
pub(crate) struct HistState {
    sum: f64,
    count: u64,
    buckets: Vec<u64>,
}

/// One series' value (shared with the instances holding a handle to it).
#[derive(Debug)]
pub(crate) enum Series {
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
    series: RwLock<HashMap<Vec<String>, Arc<Series>>>,
}

/// The metrics of one plugin version (shared by its instances, and by the versions that only got new state).
#[derive(Debug)]
pub(crate) struct PluginMetrics {
    plugin: String,
    max_series: usize,
    limits: LabelLimits,
    series: AtomicUsize,
    label_bytes: AtomicUsize,
    dropped: MetricDrops,
    families: Mutex<BTreeMap<String, Arc<MetricFamily>>>,
}

/// The serving plugins' metrics; registered into the admin registry as a collector.
#[derive(Debug, Default)]
pub struct MetricsHub {
    limits: LabelLimits,
    plugins: RwLock<BTreeMap<String, Arc<PluginMetrics>>>,
}

/// Label bytes of one series.
fn series_bytes(names: &[String], values: &[String]) -> usize {
    names.iter().map(String::len).sum::<usize>() + values.iter().map(String::len).sum::<usize>()
}

fn valid_name(s: &str, colon: bool) -> bool {
    let mut chars = s.chars();
    let ok_first = |c: char| c.is_ascii_alphabetic() || c == '_' || (colon && c == ':');
    chars.next().is_some_and(ok_first)
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || (colon && c == ':'))
}

impl MetricsHub {
    /// A hub whose plugins' labels are bounded by `limits`.
    pub(crate) fn new(limits: LabelLimits) -> Self {
        Self {
            limits,
            plugins: RwLock::new(BTreeMap::new()),
        }
    }

    /// An empty metric set for a new version of `plugin`. It is served once [`Self::publish`] names it (when the
    /// version serves); until then (and for a version that is rejected) nothing of it is exposed.
    pub(crate) fn plugin(
        &self,
        plugin: &str,
        max_series: usize,
        dropped: MetricDrops,
    ) -> Arc<PluginMetrics> {
        Arc::new(PluginMetrics {
            plugin: plugin.to_string(),
            max_series,
            limits: self.limits,
            series: AtomicUsize::new(0),
            label_bytes: AtomicUsize::new(0),
            dropped,
            families: Mutex::new(BTreeMap::new()),
        })
    }

    /// Serves exactly these metric sets (the serving versions, by plugin name): a replaced version's set and a
    /// removed plugin's set are dropped here, and their memory is freed when the last instance using them goes.
    pub(crate) fn publish<'a>(
        &self,
        serving: impl IntoIterator<Item = (&'a str, &'a Arc<PluginMetrics>)>,
    ) {
        let next: BTreeMap<String, Arc<PluginMetrics>> = serving
            .into_iter()
            .map(|(name, m)| (name.to_string(), m.clone()))
            .collect();
        let mut map = match self.plugins.write() {
            Ok(m) => m,
            Err(poisoned) => poisoned.into_inner(),
        };
        *map = next;
    }

    /// Forgets a removed plugin's metrics.
    pub(crate) fn remove(&self, plugin: &str) {
        if let Ok(mut m) = self.plugins.write() {
            m.remove(plugin);
        }
    }

    /// The family another serving plugin (not another version of this one) defined under `metric`, with its
    /// owner's name.
    fn defined_elsewhere(
        &self,
        metric: &str,
        except: &PluginMetrics,
    ) -> Option<(String, Arc<MetricFamily>)> {
        let map = self.plugins.read().ok()?;
        map.iter()
            .filter(|(name, p)| !std::ptr::eq(Arc::as_ptr(p), except) && **name != except.plugin)
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
            if l.len() > MAX_LABEL_NAME_LEN {
                return Err(format!(
                    "metric `{name}`: label name `{l}` is longer than {MAX_LABEL_NAME_LEN} bytes"
                ));
            }
        }
        if let Some(dup) = labels
            .iter()
            .enumerate()
            .find(|(i, l)| labels[..*i].contains(l))
            .map(|(_, l)| l)
        {
            return Err(format!("metric `{name}`: label `{dup}` appears twice"));
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
            let (n, bytes) = old.series.read().map_or((0, 0), |s| {
                (
                    s.len(),
                    s.keys()
                        .map(|values| series_bytes(&old.label_names, values))
                        .sum(),
                )
            });
            release(&plugin.series, n);
            release(&plugin.label_bytes, bytes);
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

/// Gives back `n` of a budget (never below zero).
fn release(budget: &AtomicUsize, n: usize) {
    let _ = budget.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
        Some(v.saturating_sub(n))
    });
}

/// Takes `n` of a budget of `max`; false (nothing taken) when it would go over.
fn reserve(budget: &AtomicUsize, n: usize, max: usize) -> bool {
    budget
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
            v.checked_add(n).filter(|total| *total <= max)
        })
        .is_ok()
}

impl PluginMetrics {
    /// Counts an update dropped for `reason`.
    pub(crate) fn drop_update(&self, reason: DropReason) {
        self.dropped.inc(reason);
    }

    /// Applies an update; a wrong kind or label count, an over-long label value, a full series cap or a spent
    /// label-bytes budget drops it (counted by reason).
    pub(crate) fn update(&self, family: &MetricFamily, labels: Vec<String>, update: Update) {
        if !kind_ok(&family.shape, update) {
            self.dropped.inc(DropReason::BadUpdate);
            return;
        }
        match self.series(family, labels) {
            Ok(s) => apply(&s, &family.shape, update),
            Err(reason) => self.dropped.inc(reason),
        }
    }

    /// Applies an update to a series found by [`Self::series`] (a wrong kind is dropped and counted).
    pub(crate) fn update_series(&self, family: &MetricFamily, series: &Series, update: Update) {
        if kind_ok(&family.shape, update) {
            apply(series, &family.shape, update);
        } else {
            self.dropped.inc(DropReason::BadUpdate);
        }
    }

    /// The series of `family` with these label values, created (at zero) within the plugin's caps.
    pub(crate) fn series(
        &self,
        family: &MetricFamily,
        labels: Vec<String>,
    ) -> Result<Arc<Series>, DropReason> {
        if labels.len() != family.label_names.len() {
            return Err(DropReason::BadUpdate);
        }
        if labels.iter().any(|v| v.len() > self.limits.max_value_len) {
            return Err(DropReason::LabelValueTooLong);
        }
        if let Ok(series) = family.series.read()
            && let Some(s) = series.get(&labels)
        {
            return Ok(s.clone());
        }
        let Ok(mut series) = family.series.write() else {
            return Err(DropReason::BadUpdate);
        };
        if let Some(s) = series.get(&labels) {
            return Ok(s.clone());
        }
        if !reserve(&self.series, 1, self.max_series) {
            return Err(DropReason::SeriesCap);
        }
        let bytes = series_bytes(&family.label_names, &labels);
        if !reserve(&self.label_bytes, bytes, self.limits.max_bytes) {
            release(&self.series, 1);
            return Err(DropReason::LabelBytes);
        }
        let fresh = Arc::new(match &family.shape {
            Shape::Counter => Series::Counter(AtomicU64::new(0)),
            Shape::Gauge => Series::Gauge(AtomicI64::new(0)),
            Shape::Histogram(b) => Series::Histogram(Mutex::new(HistState {
                sum: 0.0,
                count: 0,
                buckets: vec![0; b.len()],
            })),
        });
        series.insert(labels, fresh.clone());
        Ok(fresh)
    }

    /// The plugin's series cap.
    pub(crate) fn max_series(&self) -> usize {
        self.max_series
    }
}

fn kind_ok(shape: &Shape, update: Update) -> bool {
    matches!(
        (shape, update),
        (Shape::Counter, Update::CounterAdd(_))
            | (Shape::Gauge, Update::GaugeSet(_) | Update::GaugeAdd(_))
            | (Shape::Histogram(_), Update::Observe(_))
    )
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
                    match s.as_ref() {
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // a test panics to fail

    use super::*;

    fn hub() -> MetricsHub {
        MetricsHub::new(LabelLimits {
            max_value_len: 8,
            max_bytes: 64,
        })
    }

    fn drops() -> (MetricDrops, Vec<HostCounter>) {
        let counters: Vec<HostCounter> = DropReason::ALL
            .iter()
            .map(|_| HostCounter::default())
            .collect();
        (MetricDrops::new(counters.clone()), counters)
    }

    fn dropped(counters: &[HostCounter], reason: DropReason) -> u64 {
        let i = DropReason::ALL.iter().position(|r| *r == reason).unwrap();
        counters[i].get()
    }

    #[test]
    fn label_names_are_bounded_in_length_count_and_unique() {
        let hub = hub();
        let p = hub.plugin("p", 100, drops().0);
        let long = "l".repeat(MAX_LABEL_NAME_LEN + 1);
        let err = hub
            .define(&p, "m", "", vec![long], Shape::Counter)
            .unwrap_err();
        assert!(err.contains("longer than 128 bytes"), "{err}");
        let ok = "l".repeat(MAX_LABEL_NAME_LEN);
        hub.define(&p, "m", "", vec![ok], Shape::Counter).unwrap();
        let many: Vec<String> = (0..=MAX_LABELS).map(|i| format!("l{i}")).collect();
        let err = hub.define(&p, "n", "", many, Shape::Counter).unwrap_err();
        assert!(err.contains("more than 32 labels"), "{err}");
        let err = hub
            .define(&p, "o", "", vec!["a".into(), "a".into()], Shape::Counter)
            .unwrap_err();
        assert!(err.contains("appears twice"), "{err}");
    }

    #[test]
    fn long_values_and_spent_budgets_are_dropped_by_reason() {
        let hub = hub();
        let (d, counters) = drops();
        let p = hub.plugin("p", 3, d);
        // Label name "k" (1 byte) + value: 64 bytes of budget.
        let f = hub
            .define(&p, "m", "", vec!["k".into()], Shape::Counter)
            .unwrap();
        p.update(&f, vec!["123456789".into()], Update::CounterAdd(1));
        assert_eq!(dropped(&counters, DropReason::LabelValueTooLong), 1);
        for v in ["a", "b", "c", "d"] {
            p.update(&f, vec![v.into()], Update::CounterAdd(1));
        }
        assert_eq!(dropped(&counters, DropReason::SeriesCap), 1);
        // An existing series still counts.
        p.update(&f, vec!["a".into()], Update::CounterAdd(1));
        assert_eq!(dropped(&counters, DropReason::SeriesCap), 1);
        p.update(&f, vec![], Update::CounterAdd(1));
        p.update(&f, vec!["a".into()], Update::GaugeSet(1));
        assert_eq!(dropped(&counters, DropReason::BadUpdate), 2);

        let (d, counters) = drops();
        let q = hub.plugin("q", 100, d);
        let g = hub
            .define(&q, "g", "", vec!["k".into()], Shape::Gauge)
            .unwrap();
        // 7 series of 1 + 8 bytes = 63 bytes fit in 64; the eighth does not.
        for i in 0..8 {
            q.update(&g, vec![format!("{i:08}")], Update::GaugeSet(1));
        }
        assert_eq!(dropped(&counters, DropReason::LabelBytes), 1);
        assert_eq!(q.label_bytes.load(Ordering::Relaxed), 63);
    }

    #[test]
    fn only_published_sets_are_served_and_a_new_version_starts_empty() {
        let hub = Arc::new(hub());
        let encode = |hub: &Arc<MetricsHub>| {
            let mut registry = prometheus_client::registry::Registry::default();
            registry.register_collector(Box::new(hub.clone()));
            let mut out = String::new();
            prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
            out
        };
        let v1 = hub.plugin("p", 100, drops().0);
        let f = hub
            .define(&v1, "m", "", vec!["k".into()], Shape::Counter)
            .unwrap();
        v1.update(&f, vec!["a".into()], Update::CounterAdd(1));
        assert!(!encode(&hub).contains("m_total{k=\"a\"}"));
        hub.publish([("p", &v1)]);
        assert!(encode(&hub).contains("m_total{k=\"a\"} 1"));
        // A new version of `p` defines the same metric: its own, empty family (not v1's).
        let v2 = hub.plugin("p", 100, drops().0);
        let f2 = hub
            .define(&v2, "m", "", vec!["k".into()], Shape::Counter)
            .unwrap();
        assert!(!Arc::ptr_eq(&f, &f2));
        hub.publish([("p", &v2)]);
        assert!(!encode(&hub).contains("m_total{"));
        hub.publish([]);
        assert!(hub.plugins.read().unwrap().is_empty());
    }
}
