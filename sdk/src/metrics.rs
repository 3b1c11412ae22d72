//! Typed handles for plugin-defined metrics. Define them in `configure`, then update them by label values; they
//! are served on the proxy's `/stats/prometheus` with exactly the names and labels given here. The host caps the
//! number of series per plugin (and counts what it drops), so keep label values bounded.
//!
//! ```no_run
//! use weft_plugin_sdk::metrics::Counter;
//! let opened = Counter::define("my_connections_opened_total", "Connections seen.", &["direction"])?;
//! opened.inc(&["inbound"]);
//! # Ok::<(), String>(())
//! ```
//!
//! A counter's name is kept as given: name it with the `_total` suffix Prometheus expects.
//!
//! Updating by label values copies every value into the host on each call. A plugin that updates per connection
//! should bind a label set once with `series` and update through the handle, which passes no strings:
//!
//! ```no_run
//! use weft_plugin_sdk::metrics::Counter;
//! let opened = Counter::define("my_connections_opened_total", "Connections seen.", &["direction"])?;
//! let inbound = opened.series(&["inbound"])?; // once per label set
//! inbound.inc(); // per event
//! # Ok::<(), String>(())
//! ```

use crate::bindings::weft::plugin::metrics as host;

/// A monotonically increasing counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counter(u32);

/// A value that goes up and down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gauge(u32);

/// A distribution of observed values in fixed buckets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Histogram(u32);

/// One series of a [`Counter`] (its label values bound once).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CounterSeries(u32);

/// One series of a [`Gauge`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GaugeSeries(u32);

/// One series of a [`Histogram`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HistogramSeries(u32);

fn names(labels: &[&str]) -> Vec<String> {
    labels.iter().map(|s| (*s).to_string()).collect()
}

fn values(labels: &[&str]) -> Vec<String> {
    names(labels)
}

impl Counter {
    /// Defines a counter with the given label names (a new plugin version may define it again with the same
    /// shape and keeps counting from where the previous version was).
    pub fn define(name: &str, help: &str, label_names: &[&str]) -> Result<Self, String> {
        host::define_counter(name, help, &names(label_names)).map(Counter)
    }
    /// Adds `value`.
    pub fn add(&self, label_values: &[&str], value: u64) {
        host::counter_add(self.0, &values(label_values), value);
    }
    /// Adds one.
    pub fn inc(&self, label_values: &[&str]) {
        self.add(label_values, 1);
    }
    /// The series with these label values (registered once; the same values give the same handle). Fails for the
    /// wrong number of values, an over-long value or a full series cap.
    pub fn series(&self, label_values: &[&str]) -> Result<CounterSeries, String> {
        host::series(self.0, &values(label_values)).map(CounterSeries)
    }
}

impl CounterSeries {
    /// Adds `value`.
    pub fn add(&self, value: u64) {
        host::series_counter_add(self.0, value);
    }
    /// Adds one.
    pub fn inc(&self) {
        self.add(1);
    }
}

impl Gauge {
    /// Defines a gauge with the given label names.
    pub fn define(name: &str, help: &str, label_names: &[&str]) -> Result<Self, String> {
        host::define_gauge(name, help, &names(label_names)).map(Gauge)
    }
    /// Sets the value.
    pub fn set(&self, label_values: &[&str], value: i64) {
        host::gauge_set(self.0, &values(label_values), value);
    }
    /// Adds `delta` (may be negative).
    pub fn add(&self, label_values: &[&str], delta: i64) {
        host::gauge_add(self.0, &values(label_values), delta);
    }
    /// The series with these label values (see [`Counter::series`]).
    pub fn series(&self, label_values: &[&str]) -> Result<GaugeSeries, String> {
        host::series(self.0, &values(label_values)).map(GaugeSeries)
    }
}

impl GaugeSeries {
    /// Sets the value.
    pub fn set(&self, value: i64) {
        host::series_gauge_set(self.0, value);
    }
    /// Adds `delta` (may be negative).
    pub fn add(&self, delta: i64) {
        host::series_gauge_add(self.0, delta);
    }
}

impl Histogram {
    /// Defines a histogram with the given label names and bucket upper bounds (ascending).
    pub fn define(
        name: &str,
        help: &str,
        label_names: &[&str],
        buckets: &[f64],
    ) -> Result<Self, String> {
        host::define_histogram(name, help, &names(label_names), buckets).map(Histogram)
    }
    /// Records one observation.
    pub fn observe(&self, label_values: &[&str], value: f64) {
        host::histogram_observe(self.0, &values(label_values), value);
    }
    /// The series with these label values (see [`Counter::series`]).
    pub fn series(&self, label_values: &[&str]) -> Result<HistogramSeries, String> {
        host::series(self.0, &values(label_values)).map(HistogramSeries)
    }
}

impl HistogramSeries {
    /// Records one observation.
    pub fn observe(&self, value: f64) {
        host::series_histogram_observe(self.0, value);
    }
}

/// Monotonic nanoseconds since an arbitrary point, the same for every plugin of one proxy process.
pub fn monotonic_now_ns() -> u64 {
    crate::bindings::weft::plugin::clock::monotonic_now()
}
