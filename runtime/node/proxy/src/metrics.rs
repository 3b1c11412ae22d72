//! The data path's own Prometheus metrics: connections opened, closed and failed (by reason), bytes, live count.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Labels: which way.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DirLabels {
    /// outbound | inbound
    pub direction: &'static str,
    /// hbone | tcp | plaintext
    pub transport: &'static str,
}

/// Labels: which way and why it failed.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FailLabels {
    /// outbound | inbound
    pub direction: &'static str,
    /// Short reason (denied, connect, tls, identity, bad_request, unknown_destination, ...).
    pub reason: &'static str,
}

/// Labels: which listener (`outbound`, `socks5`, `inbound_plaintext`, `inbound_hbone`).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ListenerLabels {
    /// Listener name.
    pub listener: &'static str,
}

/// Data-path metrics.
#[derive(Debug, Default)]
pub struct ProxyMetrics {
    /// Connections established.
    pub opened: Family<DirLabels, Counter>,
    /// Connections closed (after being established).
    pub closed: Family<DirLabels, Counter>,
    /// Connections that failed before or while establishing.
    pub failed: Family<FailLabels, Counter>,
    /// Bytes source → destination.
    pub sent_bytes: Family<DirLabels, Counter>,
    /// Bytes destination → source.
    pub received_bytes: Family<DirLabels, Counter>,
    /// Connections open now.
    pub active: Family<DirLabels, Gauge>,
    /// Live connections closed because a policy change denied them.
    pub rechecks_closed: Counter,
    /// Connections a listener refused because it had its cap of open connections.
    pub listener_refused: Family<ListenerLabels, Counter>,
    /// Connections a listener accepted that are open now (from accept to close, handshakes included).
    pub listener_open: Family<ListenerLabels, Gauge>,
}

impl ProxyMetrics {
    /// Register everything under `weft_`.
    pub fn register(&self, reg: &mut Registry) {
        reg.register(
            "weft_connections_opened",
            "Connections established",
            self.opened.clone(),
        );
        reg.register(
            "weft_connections_closed",
            "Connections closed",
            self.closed.clone(),
        );
        reg.register(
            "weft_connections_failed",
            "Connections that failed, by reason",
            self.failed.clone(),
        );
        reg.register(
            "weft_sent_bytes",
            "Bytes from source to destination",
            self.sent_bytes.clone(),
        );
        reg.register(
            "weft_received_bytes",
            "Bytes from destination to source",
            self.received_bytes.clone(),
        );
        reg.register(
            "weft_connections_active",
            "Connections open now",
            self.active.clone(),
        );
        reg.register(
            "weft_policy_recheck_closed",
            "Live connections closed because a policy change denied them",
            self.rechecks_closed.clone(),
        );
        reg.register(
            "weft_listener_connections_refused",
            "Connections refused because the listener had its cap of open connections",
            self.listener_refused.clone(),
        );
        reg.register(
            "weft_listener_connections",
            "Connections accepted by each listener that are open now",
            self.listener_open.clone(),
        );
    }

    /// Count a failure.
    pub fn fail(&self, direction: &'static str, reason: &'static str) {
        self.failed
            .get_or_create(&FailLabels { direction, reason })
            .inc();
    }
}
