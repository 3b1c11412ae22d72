//! The sources' metrics, from their status: weft's own (`weft_xds_*`, per source and type) and ztunnel's names and
//! labels (`istio_xds_*`, summed over the sources; Istio's ztunnel dashboard reads them).

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

use crate::XdsHandle;

/// A per-source metric: name, help, type, and its value in a status.
type SourceMetric = (
    &'static str,
    &'static str,
    MetricType,
    fn(&crate::SourceStatus) -> u64,
);
/// A per-type counter: name, help, and its value in a type's status.
type TypeCounter = (&'static str, &'static str, fn(&crate::TypeStatus) -> u64);

/// xDS counters and gauges per source and type.
#[derive(Debug)]
pub struct XdsCollector(pub Vec<XdsHandle>);

impl Collector for XdsCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let statuses: Vec<_> = self.0.iter().map(XdsHandle::status).collect();
        let per_source: [SourceMetric; 3] = [
            (
                "weft_xds_connected",
                "Whether the source's stream is open",
                MetricType::Gauge,
                |s| u64::from(s.connected),
            ),
            (
                "weft_xds_connections",
                "Streams opened to the source",
                MetricType::Counter,
                |s| s.connections,
            ),
            (
                "weft_xds_connect_failures",
                "Attempts to reach the source that failed before a stream opened",
                MetricType::Counter,
                |s| s.connect_failures,
            ),
        ];
        for (name, help, kind, f) in per_source {
            let mut family = enc.encode_descriptor(name, help, None, kind)?;
            for s in &statuses {
                let labels = [("source", s.name.as_str())];
                let m = family.encode_family(&labels)?;
                match kind {
                    MetricType::Gauge => {
                        ConstGauge::new(i64::try_from(f(s)).unwrap_or(i64::MAX)).encode(m)?
                    }
                    _ => ConstCounter::new(f(s)).encode(m)?,
                }
            }
        }
        let per_type: [TypeCounter; 3] = [
            ("weft_xds_responses", "Responses received", |t| t.responses),
            ("weft_xds_acks", "ACKs sent", |t| t.acks),
            ("weft_xds_nacks", "NACKs sent", |t| t.nacks),
        ];
        for (name, help, f) in per_type {
            let mut family = enc.encode_descriptor(name, help, None, MetricType::Counter)?;
            for s in &statuses {
                for t in &s.types {
                    let labels = [
                        ("source", s.name.as_str()),
                        ("type_url", t.type_url.as_str()),
                    ];
                    ConstCounter::new(f(t)).encode(family.encode_family(&labels)?)?;
                }
            }
        }
        let mut family = enc.encode_descriptor(
            "weft_xds_resources",
            "Resources held from the source",
            None,
            MetricType::Gauge,
        )?;
        for s in &statuses {
            for t in &s.types {
                let labels = [
                    ("source", s.name.as_str()),
                    ("type_url", t.type_url.as_str()),
                ];
                ConstGauge::new(i64::try_from(t.resources).unwrap_or(i64::MAX))
                    .encode(family.encode_family(&labels)?)?;
            }
        }
        encode_istio(&statuses, &mut enc)
    }
}

/// ztunnel's xDS metrics (its names and labels; Istio's ztunnel dashboard reads them), summed over the sources:
/// `istio_xds_connection_terminations_total{reason}`, `istio_xds_message_total{url}` (responses received) and
/// `istio_xds_message_bytes_total{url}` (bytes of the resources they carried). With no xDS source, no series.
fn encode_istio(
    statuses: &[crate::SourceStatus],
    enc: &mut DescriptorEncoder,
) -> Result<(), std::fmt::Error> {
    use std::collections::BTreeMap;
    let mut family = enc.encode_descriptor(
        "istio_xds_connection_terminations",
        "The total number of completed connections to xds server (unstable)",
        None,
        MetricType::Counter,
    )?;
    if !statuses.is_empty() {
        let mut by_reason: BTreeMap<&str, u64> = BTreeMap::new();
        for s in statuses {
            for (reason, n) in s.terminations.by_reason() {
                *by_reason.entry(reason).or_default() += n;
            }
        }
        for (reason, n) in by_reason {
            ConstCounter::new(n).encode(family.encode_family(&[("reason", reason)])?)?;
        }
    }
    let mut per_url: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
    for t in statuses.iter().flat_map(|s| &s.types) {
        let e = per_url.entry(t.type_url.as_str()).or_default();
        e.0 += t.responses;
        e.1 += t.received_bytes;
    }
    let mut family = enc.encode_descriptor(
        "istio_xds_message",
        "Total number of messages received (unstable)",
        None,
        MetricType::Counter,
    )?;
    for (url, (n, _)) in &per_url {
        ConstCounter::new(*n).encode(family.encode_family(&[("url", *url)])?)?;
    }
    let mut family = enc.encode_descriptor(
        "istio_xds_message",
        "Total number of bytes received (unstable)",
        Some(&prometheus_client::registry::Unit::Bytes),
        MetricType::Counter,
    )?;
    for (url, (_, b)) in &per_url {
        ConstCounter::new(*b).encode(family.encode_family(&[("url", *url)])?)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test code: a panic fails the test

    use super::*;
    use prometheus_client::registry::Registry;
    use weft_proto::type_url::{ADDRESS, AUTHORIZATION};

    fn status(name: &str, types: &[(&str, u64, u64)]) -> crate::SourceStatus {
        crate::SourceStatus {
            name: name.into(),
            address: "https://istiod:15012".into(),
            node_id: "n".into(),
            connected: true,
            connections: 1,
            connect_failures: 0,
            connected_since: None,
            last_disconnect: None,
            last_connect_error: None,
            synced: true,
            types: types
                .iter()
                .map(|(url, responses, bytes)| crate::TypeStatus {
                    type_url: (*url).into(),
                    synced: true,
                    resources: 0,
                    responses: *responses,
                    acks: 0,
                    nacks: 0,
                    received_bytes: *bytes,
                    queued: 0,
                    last_ack: None,
                    last_nack: None,
                })
                .collect(),
            terminations: crate::Terminations {
                reconnect: 2,
                ..Default::default()
            },
        }
    }

    #[derive(Debug)]
    struct Fixed(Vec<crate::SourceStatus>);
    impl Collector for Fixed {
        fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
            encode_istio(&self.0, &mut enc)
        }
    }

    #[test]
    fn istio_xds_metrics_have_ztunnels_names_and_labels() {
        let mut reg = Registry::default();
        reg.register_collector(Box::new(Fixed(vec![
            status("mesh", &[(ADDRESS, 3, 300), (AUTHORIZATION, 1, 10)]),
            status("plugins", &[("type.googleapis.com/weft.Plugin", 1, 5)]),
        ])));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &reg).unwrap();
        for line in [
            "istio_xds_connection_terminations_total{reason=\"Reconnect\"} 4".to_owned(),
            "istio_xds_connection_terminations_total{reason=\"ConnectionError\"} 0".to_owned(),
            "istio_xds_connection_terminations_total{reason=\"Complete\"} 0".to_owned(),
            "istio_xds_connection_terminations_total{reason=\"Error\"} 0".to_owned(),
            format!("istio_xds_message_total{{url=\"{ADDRESS}\"}} 3"),
            format!("istio_xds_message_total{{url=\"{AUTHORIZATION}\"}} 1"),
            format!("istio_xds_message_bytes_total{{url=\"{ADDRESS}\"}} 300"),
            "istio_xds_message_bytes_total{url=\"type.googleapis.com/weft.Plugin\"} 5".to_owned(),
        ] {
            assert!(text.lines().any(|l| l == line), "{line} not in\n{text}");
        }
        // No source: the families are there, empty.
        let mut reg = Registry::default();
        reg.register_collector(Box::new(Fixed(Vec::new())));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &reg).unwrap();
        assert!(
            !text.contains("istio_xds_connection_terminations_total{"),
            "{text}"
        );
    }
}
