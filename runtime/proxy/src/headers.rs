//! The request headers ztunnel sends on an HBONE CONNECT: `forwarded`, `baggage` (workload metadata) and a
//! random `traceparent`.

use std::net::SocketAddr;

use http::{HeaderMap, HeaderName, HeaderValue};
use weft_hooks::WorkloadMeta;

/// `baggage` describing the source workload (non-empty items only).
pub fn baggage(src: &WorkloadMeta, cluster: &str) -> String {
    let cluster = if src.cluster_id.is_empty() {
        cluster
    } else {
        &src.cluster_id
    };
    let items = [
        ("k8s.cluster.name", cluster),
        ("k8s.namespace.name", src.namespace.as_str()),
        ("k8s.deployment.name", src.workload_name.as_str()),
        ("service.name", src.canonical_name.as_str()),
        ("service.version", src.canonical_revision.as_str()),
        ("cloud.region", src.region.as_str()),
        ("cloud.availability_zone", src.zone.as_str()),
    ];
    items
        .iter()
        .filter(|(_, v)| !v.is_empty())
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// `traceparent` with random trace and span ids (W3C trace context, not sampled).
pub fn traceparent() -> String {
    format!(
        "00-{}-{}-00",
        hex::encode(rand::random::<[u8; 16]>()),
        hex::encode(rand::random::<[u8; 8]>())
    )
}

/// The full header set for a CONNECT from `src_addr` (optionally for a service hostname).
pub fn connect_headers(
    src_addr: SocketAddr,
    src: Option<&WorkloadMeta>,
    service_host: Option<&str>,
    cluster: &str,
) -> HeaderMap {
    let mut h = HeaderMap::new();
    let mut fwd = format!("for=\"{src_addr}\"");
    if let Some(host) = service_host {
        fwd.push_str(";host=");
        fwd.push_str(host);
    }
    if let Ok(v) = HeaderValue::from_str(&fwd) {
        h.insert(HeaderName::from_static("forwarded"), v);
    }
    if let Some(src) = src {
        let b = baggage(src, cluster);
        if !b.is_empty()
            && let Ok(v) = HeaderValue::from_str(&b)
        {
            h.insert(HeaderName::from_static("baggage"), v);
        }
    }
    if let Ok(v) = HeaderValue::from_str(&traceparent()) {
        h.insert(HeaderName::from_static("traceparent"), v);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_have_ztunnel_shape() {
        let src = WorkloadMeta {
            namespace: "default".into(),
            workload_name: "sleep".into(),
            canonical_name: "sleep".into(),
            canonical_revision: "v1".into(),
            ..Default::default()
        };
        let h = connect_headers(
            "10.0.0.1:4000".parse().unwrap(),
            Some(&src),
            Some("echo.default.svc.cluster.local"),
            "Kubernetes",
        );
        assert_eq!(
            h["forwarded"],
            "for=\"10.0.0.1:4000\";host=echo.default.svc.cluster.local"
        );
        assert_eq!(
            h["baggage"],
            "k8s.cluster.name=Kubernetes,k8s.namespace.name=default,k8s.deployment.name=sleep,service.name=sleep,service.version=v1"
        );
        let tp = h["traceparent"].to_str().unwrap();
        let parts: Vec<&str> = tp.split('-').collect();
        assert_eq!(parts.len(), 4);
        assert_eq!(
            (parts[0], parts[1].len(), parts[2].len(), parts[3]),
            ("00", 32, 16, "00")
        );
    }
}
