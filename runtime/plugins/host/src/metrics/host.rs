//! The host's own per-plugin metrics (calls, connections out of a policy plugin's scope, denials, errors by kind, call latency, instances, drops), and their
//! registration, together with the plugin-defined metrics, into a `prometheus_client` registry.

use std::sync::Arc;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::base::error::ErrorKind;
use crate::metrics::plugin::{DropReason, MetricDrops, MetricsHub};

type Labels = Vec<(String, String)>;

/// Labels of the unenforced-policy denial counter: the policy left unenforced.
pub(crate) type PolicyLabel = Vec<(String, String)>;
type HistogramFamily = Family<Labels, Histogram, fn() -> Histogram>;

fn latency_histogram() -> Histogram {
    // 1 µs .. ~262 ms.
    Histogram::new(exponential_buckets(1e-6, 4.0, 10))
}

/// The host's metric families (cheap to clone: shared).
#[derive(Clone, Debug)]
pub(crate) struct HostMetrics {
    calls: Family<Labels, Counter>,
    out_of_scope: Family<Labels, Counter>,
    denials: Family<Labels, Counter>,
    errors: Family<Labels, Counter>,
    latency: HistogramFamily,
    instances: Family<Labels, Gauge>,
    loads: Family<Labels, Counter>,
    rollbacks: Family<Labels, Counter>,
    log_dropped: Family<Labels, Counter>,
    metric_dropped: Family<Labels, Counter>,
    pub(crate) telemetry_dropped: Counter,
    /// Connections denied because an authorization policy applied that no plugin enforces, by policy.
    pub(crate) unenforced_denials: Family<PolicyLabel, Counter>,
    /// Shadow decisions, by plugin, direction, serving verdict and shadow verdict.
    shadow_decisions: Family<Labels, Counter>,
    /// Shadow decisions skipped because the shadow queue was full, by plugin.
    shadow_skipped: Family<Labels, Counter>,
}

impl Default for HostMetrics {
    fn default() -> Self {
        Self {
            calls: Family::default(),
            out_of_scope: Family::default(),
            denials: Family::default(),
            errors: Family::default(),
            latency: Family::new_with_constructor(latency_histogram),
            instances: Family::default(),
            loads: Family::default(),
            rollbacks: Family::default(),
            log_dropped: Family::default(),
            metric_dropped: Family::default(),
            telemetry_dropped: Counter::default(),
            unenforced_denials: Family::default(),
            shadow_decisions: Family::default(),
            shadow_skipped: Family::default(),
        }
    }
}

/// The labels of a shadow-decision series.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct ShadowLabels {
    pub plugin: String,
    pub direction: &'static str,
    pub serving: &'static str,
    pub shadow: &'static str,
}

impl ShadowLabels {
    fn labels(&self) -> Labels {
        vec![
            ("plugin".to_string(), self.plugin.clone()),
            ("direction".to_string(), self.direction.to_string()),
            ("serving".to_string(), self.serving.to_string()),
            ("shadow".to_string(), self.shadow.to_string()),
        ]
    }
}

/// One plugin's series, resolved once per plugin so that a call touches only atomics.
#[derive(Clone, Debug)]
pub(crate) struct PluginCounters {
    pub calls: Counter,
    /// Connections the plugin's spec selected but its `authorize-scope` left out: allowed without a call.
    pub out_of_scope: Counter,
    pub denials: Counter,
    errors: Vec<Counter>,
    pub latency: Histogram,
    pub instances: Gauge,
    pub log_dropped: Counter,
    /// Plugin metric updates dropped, by reason.
    pub series_dropped: MetricDrops,
}

impl PluginCounters {
    pub fn error(&self, kind: ErrorKind) -> &Counter {
        let i = ErrorKind::ALL.iter().position(|k| *k == kind).unwrap_or(0);
        &self.errors[i]
    }
}

impl HostMetrics {
    /// The series of one plugin (by name: they carry on across versions).
    pub fn for_plugin(&self, plugin: &str, kind: &str) -> PluginCounters {
        let p = vec![("plugin".to_string(), plugin.to_string())];
        let with = |k: &str, v: &str| {
            let mut l = p.clone();
            l.push((k.to_string(), v.to_string()));
            l
        };
        PluginCounters {
            calls: self.calls.get_or_create(&with("kind", kind)).clone(),
            out_of_scope: self.out_of_scope.get_or_create(&p).clone(),
            denials: self.denials.get_or_create(&p).clone(),
            errors: ErrorKind::ALL
                .iter()
                .map(|k| self.errors.get_or_create(&with("kind", k.as_str())).clone())
                .collect(),
            latency: self.latency.get_or_create(&p).clone(),
            instances: self.instances.get_or_create(&p).clone(),
            log_dropped: self.log_dropped.get_or_create(&p).clone(),
            series_dropped: MetricDrops::new(
                DropReason::ALL
                    .iter()
                    .map(|r| {
                        self.metric_dropped
                            .get_or_create(&with("reason", r.as_str()))
                            .clone()
                    })
                    .collect(),
            ),
        }
    }

    /// The shadow-decision series of `plugin` for one (direction, serving verdict, shadow verdict).
    pub fn shadow_decisions(&self, labels: &ShadowLabels) -> Counter {
        self.shadow_decisions
            .get_or_create(&labels.labels())
            .clone()
    }

    /// The skipped-shadow-decision series of `plugin`.
    pub fn shadow_skipped(&self, plugin: &str) -> Counter {
        self.shadow_skipped
            .get_or_create(&vec![("plugin".to_string(), plugin.to_string())])
            .clone()
    }

    /// Drops every shadow series of `plugin` (its shadow went): `decisions` are the label sets it created.
    pub fn remove_shadow(&self, plugin: &str, decisions: &[ShadowLabels]) {
        for l in decisions {
            self.shadow_decisions.remove(&l.labels());
        }
        self.shadow_skipped
            .remove(&vec![("plugin".to_string(), plugin.to_string())]);
    }

    /// Counts a load attempt.
    pub fn load(&self, plugin: &str, result: &str) {
        self.loads
            .get_or_create(&vec![
                ("plugin".to_string(), plugin.to_string()),
                ("result".to_string(), result.to_string()),
            ])
            .inc();
    }

    /// Counts an automatic rollback.
    pub fn rollback(&self, plugin: &str) {
        self.rollbacks
            .get_or_create(&vec![("plugin".to_string(), plugin.to_string())])
            .inc();
    }

    /// Registers the host families and the plugin-defined metrics (through a collector) into `registry`.
    pub fn register(&self, registry: &mut Registry, hub: &Arc<MetricsHub>) {
        registry.register(
            "weft_plugin_calls",
            "Plugin calls, by plugin and kind.",
            self.calls.clone(),
        );
        registry.register(
            "weft_plugin_out_of_scope",
            "Connections a policy plugin's spec selected but its declared scope (authorize-scope) left out: allowed \
             without a call.",
            self.out_of_scope.clone(),
        );
        registry.register(
            "weft_plugin_denials",
            "Connections a policy plugin denied.",
            self.denials.clone(),
        );
        registry.register(
            "weft_plugin_errors",
            "Failed plugin calls (the failure policy applied), by kind.",
            self.errors.clone(),
        );
        registry.register(
            "weft_plugin_call_duration_seconds",
            "Plugin call latency.",
            self.latency.clone(),
        );
        registry.register(
            "weft_plugin_instances",
            "Live plugin instances.",
            self.instances.clone(),
        );
        registry.register(
            "weft_plugin_shadow_decisions",
            "Connections decided by a plugin's shadow version beside its serving one (never enforced), by \
             direction, serving verdict (allow, deny) and shadow verdict (allow, deny, error: trapped or timed out).",
            self.shadow_decisions.clone(),
        );
        registry.register(
            "weft_plugin_shadow_skipped",
            "Shadow decisions skipped because the shadow queue was full (the connection was not delayed).",
            self.shadow_skipped.clone(),
        );
        registry.register(
            "weft_plugin_loads",
            "Plugin version loads, by result.",
            self.loads.clone(),
        );
        registry.register(
            "weft_plugin_rollbacks",
            "New plugin versions rolled back automatically on probation (too many traps or timeouts).",
            self.rollbacks.clone(),
        );
        registry.register(
            "weft_plugin_log_dropped",
            "Plugin log lines dropped by the rate limit.",
            self.log_dropped.clone(),
        );
        registry.register(
            "weft_plugin_metric_dropped",
            "Plugin metric updates dropped, by reason (bad_update: unknown handle, wrong type or label count; \
             label_value_too_long; series_cap; label_bytes: the plugin's label-bytes budget is spent).",
            self.metric_dropped.clone(),
        );
        registry.register(
            "weft_plugin_telemetry_events_dropped",
            "Telemetry events dropped because the telemetry queue was full.",
            self.telemetry_dropped.clone(),
        );
        registry.register(
            "weft_plugin_unenforced_policy_denials",
            "Inbound connections denied because an Istio authorization policy applies to the destination and no \
             serving policy plugin enforces Istio's AuthorizationPolicy, by policy (--allow-unenforced-policies \
             opts out).",
            self.unenforced_denials.clone(),
        );
        registry.register_collector(Box::new(hub.clone()));
    }
}
