//! weft control's Prometheus metrics (prometheus-client): streams, responses and resources sent, ACKs and NACKs by
//! type, ACK latency, rollbacks reported by nodes, authentication refusals, the sources' state, and each staged
//! rollout's stage, state and figures.

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
    /// Per plugin with a staged rollout: its stage (1-based).
    pub rollout_stage: Family<PluginLabel, Gauge>,
    /// Per plugin and rollout state (`progressing`, `complete`, `aborted`): 1 for the state it is in.
    pub rollout_state: Family<RolloutStateLabel, Gauge>,
    /// Per plugin: the nodes its rollout put the version on so far.
    pub rollout_nodes: Family<PluginLabel, Gauge>,
    /// Per plugin: the shadow decisions of its rollout's version that diverged, and all of them.
    pub rollout_divergences: Family<PluginLabel, Gauge>,
    /// See `rollout_divergences`.
    pub rollout_decisions: Family<PluginLabel, Gauge>,
}

/// Labels: a plugin and a rollout state.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RolloutStateLabel {
    /// The plugin.
    pub plugin: String,
    /// `progressing`, `complete` or `aborted`.
    pub state: String,
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
            rollout_stage: Family::default(),
            rollout_state: Family::default(),
            rollout_nodes: Family::default(),
            rollout_divergences: Family::default(),
            rollout_decisions: Family::default(),
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
        registry.register(
            "rollout_stage",
            "The stage a plugin's staged rollout is at (1-based)",
            m.rollout_stage.clone(),
        );
        registry.register(
            "rollout_state",
            "1 for the state a plugin's staged rollout is in (progressing, complete, aborted)",
            m.rollout_state.clone(),
        );
        registry.register(
            "rollout_nodes",
            "Nodes a plugin's staged rollout put its version on so far",
            m.rollout_nodes.clone(),
        );
        registry.register(
            "rollout_shadow_divergences",
            "Shadow decisions of a staged version that differed from the serving version's",
            m.rollout_divergences.clone(),
        );
        registry.register(
            "rollout_shadow_decisions",
            "Shadow decisions of a staged version",
            m.rollout_decisions.clone(),
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
