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

/// Labels of ztunnel's `istio_dns_requests_total` (its `DnsLabels`): the query type and protocol in lower case, the
/// source workload's canonical service and revision (`unknown` when not known or empty).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct IstioDnsLabels {
    /// `a`, `aaaa`, ... (lower case, as ztunnel writes it).
    pub request_query_type: String,
    /// `udp` | `tcp`
    pub request_protocol: &'static str,
    /// The source workload's canonical service.
    pub source_canonical_service: String,
    /// The source workload's canonical revision.
    pub source_canonical_revision: String,
}

/// ztunnel's `unknown` for an absent or empty label value.
fn or_unknown(s: Option<&str>) -> String {
    match s {
        Some(s) if !s.is_empty() => s.to_owned(),
        _ => "unknown".to_owned(),
    }
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
    /// ztunnel's `istio_dns_requests_total`: every decoded query, by query type, protocol and source.
    pub istio_requests: Family<IstioDnsLabels, Counter>,
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
        // ztunnel's name and labels (Istio's ztunnel dashboard reads it).
        reg.register(
            "istio_dns_requests",
            "Total number of DNS requests (unstable)",
            self.istio_requests.clone(),
        );
    }

    /// Count a decoded query in ztunnel's `istio_dns_requests_total`; `source` is the client workload's canonical
    /// service and revision, when the client is a known workload.
    pub(crate) fn count_istio(
        &self,
        query_type: hickory_proto::rr::RecordType,
        transport: &'static str,
        source: Option<(&str, &str)>,
    ) {
        self.istio_requests
            .get_or_create(&IstioDnsLabels {
                request_query_type: query_type.to_string().to_lowercase(),
                request_protocol: transport,
                source_canonical_service: or_unknown(source.map(|s| s.0)),
                source_canonical_revision: or_unknown(source.map(|s| s.1)),
            })
            .inc();
    }

    pub(crate) fn count(&self, transport: &'static str, result: &'static str) {
        self.requests
            .get_or_create(&RequestLabels { transport, result })
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn istio_dns_requests_has_ztunnels_name_and_labels() {
        let m = DnsMetrics::default();
        let mut reg = Registry::default();
        m.register(&mut reg);
        m.count_istio(
            hickory_proto::rr::RecordType::AAAA,
            "udp",
            Some(("sleep", "v1")),
        );
        m.count_istio(hickory_proto::rr::RecordType::A, "tcp", None);
        m.count_istio(hickory_proto::rr::RecordType::A, "tcp", Some(("", "")));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &reg).unwrap();
        assert!(text.contains("# TYPE istio_dns_requests counter"), "{text}");
        assert!(
            text.contains(
                "istio_dns_requests_total{request_query_type=\"aaaa\",request_protocol=\"udp\",\
                 source_canonical_service=\"sleep\",source_canonical_revision=\"v1\"} 1"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "istio_dns_requests_total{request_query_type=\"a\",request_protocol=\"tcp\",\
                 source_canonical_service=\"unknown\",source_canonical_revision=\"unknown\"} 2"
            ),
            "{text}"
        );
    }
}
