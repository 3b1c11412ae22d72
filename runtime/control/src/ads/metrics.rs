//! weft control's Prometheus metrics (prometheus-client): streams, responses and resources sent, ACKs and NACKs by
//! type, ACK latency, rollbacks reported by nodes, authentication refusals, and the sources' state.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Label: the xDS type (its short name, e.g. `istio.workload.Address`).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TypeLabel {
    /// Short type name.
    pub r#type: String,
}

impl TypeLabel {
    /// The label of a type URL.
    pub fn of(type_url: &str) -> Self {
        Self {
            r#type: type_url
                .rsplit_once('/')
                .map_or(type_url, |(_, t)| t)
                .to_owned(),
        }
    }
}

/// Label: a plugin.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PluginLabel {
    /// Plugin name.
    pub plugin: String,
}

/// Label: a refusal reason.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    /// Why.
    pub reason: String,
}

/// Label: a source.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SourceLabel {
    /// `mesh` or `plugins`.
    pub source: String,
}

fn ack_latency() -> Histogram {
    // 1 ms .. ~65 s.
    Histogram::new(exponential_buckets(0.001, 2.0, 17))
}

/// Every metric, registered once.
#[derive(Debug)]
pub struct Metrics {
    /// The registry they are encoded from.
    pub registry: Registry,
    /// Streams accepted (authenticated).
    pub streams: Counter,
    /// Nodes connected now.
    pub connected: Gauge,
    /// Responses sent.
    pub responses: Family<TypeLabel, Counter>,
    /// Resources sent (upserts) in responses.
    pub resources_sent: Family<TypeLabel, Counter>,
    /// Removals sent.
    pub removals_sent: Family<TypeLabel, Counter>,
    /// ACKs received.
    pub acks: Family<TypeLabel, Counter>,
    /// NACKs received.
    pub nacks: Family<TypeLabel, Counter>,
    /// Response → ACK (or NACK) time.
    pub ack_latency: Family<TypeLabel, Histogram, fn() -> Histogram>,
    /// Rollbacks reported by nodes.
    pub rollbacks: Family<PluginLabel, Counter>,
    /// Streams refused by authentication or authorization.
    pub refused: Family<ReasonLabel, Counter>,
    /// The served snapshot's version.
    pub snapshot_version: Gauge,
    /// Changes refused by a source (set when scraped).
    pub source_refused: Family<SourceLabel, Gauge>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Register every metric.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("weft_control");
        let m = Self {
            streams: Counter::default(),
            connected: Gauge::default(),
            responses: Family::default(),
            resources_sent: Family::default(),
            removals_sent: Family::default(),
            acks: Family::default(),
            nacks: Family::default(),
            ack_latency: Family::new_with_constructor(ack_latency),
            rollbacks: Family::default(),
            refused: Family::default(),
            snapshot_version: Gauge::default(),
            source_refused: Family::default(),
            registry: Registry::default(),
        };
        registry.register("streams", "Delta ADS streams accepted", m.streams.clone());
        registry.register(
            "connected_nodes",
            "Nodes connected now",
            m.connected.clone(),
        );
        registry.register("responses", "Delta responses sent", m.responses.clone());
        registry.register(
            "resources_sent",
            "Resources sent in delta responses",
            m.resources_sent.clone(),
        );
        registry.register(
            "removals_sent",
            "Resource removals sent in delta responses",
            m.removals_sent.clone(),
        );
        registry.register("acks", "ACKs received", m.acks.clone());
        registry.register("nacks", "NACKs received", m.nacks.clone());
        registry.register(
            "ack_latency_seconds",
            "Time from a response to its ACK or NACK",
            m.ack_latency.clone(),
        );
        registry.register(
            "rollbacks",
            "Plugin versions rolled back by nodes (RollbackReport in a NACK)",
            m.rollbacks.clone(),
        );
        registry.register(
            "streams_refused",
            "Streams refused (authentication, authorization, protocol)",
            m.refused.clone(),
        );
        registry.register(
            "snapshot_version",
            "Version of the snapshot being served",
            m.snapshot_version.clone(),
        );
        registry.register(
            "source_refused_changes",
            "Changes a source refused (bad file); the last good state keeps serving",
            m.source_refused.clone(),
        );
        Self { registry, ..m }
    }

    /// The text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &self.registry) {
            tracing::warn!(error = %e, "encoding metrics");
        }
        out
    }
}
