//! The DNS proxy's Prometheus metrics: requests by outcome, upstream requests and failures, cache hits.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

/// Labels of a request.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// `udp` | `tcp`
    pub transport: &'static str,
    /// `answered` (a mesh name with records), `no_records` (a mesh name without records of the type),
    /// `forwarded`, `forward_failed`, `refused` (not a mesh client), `formerr`, `notimp`, `dropped`.
    pub result: &'static str,
}

/// DNS proxy metrics.
#[derive(Debug, Default)]
pub struct DnsMetrics {
    /// Requests by outcome.
    pub requests: Family<RequestLabels, Counter>,
    /// Queries sent to upstream resolvers.
    pub upstream_requests: Counter,
    /// Upstream queries that failed (timeout, socket error, SERVFAIL/REFUSED/NOTIMP/FORMERR answer).
    pub upstream_failures: Counter,
    /// Forwarded questions answered from the cache.
    pub cache_hits: Counter,
}

impl DnsMetrics {
    /// Register everything under `weft_dns_`.
    pub fn register(&self, reg: &mut Registry) {
        reg.register(
            "weft_dns_requests",
            "DNS requests by transport and outcome",
            self.requests.clone(),
        );
        reg.register(
            "weft_dns_upstream_requests",
            "Queries sent to upstream resolvers",
            self.upstream_requests.clone(),
        );
        reg.register(
            "weft_dns_upstream_failures",
            "Upstream queries that failed or were answered SERVFAIL, REFUSED, NOTIMP or FORMERR",
            self.upstream_failures.clone(),
        );
        reg.register(
            "weft_dns_cache_hits",
            "Forwarded questions answered from the cache",
            self.cache_hits.clone(),
        );
    }

    pub(crate) fn count(&self, transport: &'static str, result: &'static str) {
        self.requests
            .get_or_create(&RequestLabels { transport, result })
            .inc();
    }
}
