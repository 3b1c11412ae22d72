//! The request headers ztunnel sends on an HBONE CONNECT: `forwarded`, `baggage` (workload metadata) and a
//! random `traceparent`.

use std::net::SocketAddr;

use http::{HeaderMap, HeaderName, HeaderValue};
use weft_hooks::WorkloadMeta;

/// `baggage` describing a workload (the source on a CONNECT, the destination on its 200), as ztunnel writes it:
/// non-empty items only, the workload's own cluster id or else `cluster`, and its name under `k8s.<kind>.name` where
/// the kind is its workload type (`deployment` when unset, or when it is not a plain lowercase word and so cannot be
/// part of a key). Values are written as W3C baggage requires: bytes outside `baggage-octet` (and `%`) are
/// percent-encoded, so a name from config that holds `,`, `=`, `;`, spaces or non-ASCII cannot add, split or hide
/// items (Kubernetes names need no encoding and go out as ztunnel sends them).
pub fn baggage(w: &WorkloadMeta, cluster: &str) -> String {
    let cluster = if w.cluster_id.is_empty() {
        cluster
    } else {
        &w.cluster_id
    };
    let kind = match w.workload_type.as_str() {
        t if !t.is_empty() && t.bytes().all(|b| b.is_ascii_lowercase()) => t,
        _ => "deployment",
    };
    let name_key = format!("k8s.{kind}.name");
    let items = [
        ("k8s.cluster.name", cluster),
        ("k8s.namespace.name", w.namespace.as_str()),
        (name_key.as_str(), w.workload_name.as_str()),
        ("service.name", w.canonical_name.as_str()),
        ("service.version", w.canonical_revision.as_str()),
        ("cloud.region", w.region.as_str()),
        ("cloud.availability_zone", w.zone.as_str()),
    ];
    items
        .iter()
        .filter(|(_, v)| !v.is_empty())
        .map(|(k, v)| format!("{k}={}", baggage_value(v)))
        .collect::<Vec<_>>()
        .join(",")
}

/// A baggage value, percent-encoded outside W3C's `baggage-octet` (and `%` itself).
fn baggage_value(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for b in v.bytes() {
        let plain =
            matches!(b, 0x21 | 0x23..=0x2B | 0x2D..=0x3A | 0x3C..=0x5B | 0x5D..=0x7E) && b != b'%';
        if plain {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Whether `s` is an RFC 9110 token (what `forwarded`'s `host=` may carry unquoted; every DNS name is one).
fn is_token(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
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
    match service_host {
        Some(host) if is_token(host) => {
            fwd.push_str(";host=");
            fwd.push_str(host);
        }
        // Not a hostname a peer could read back (config gave a name with spaces, separators or non-ASCII): leave
        // `host=` out rather than send a header the peer drops whole, losing `for=` too.
        Some(host) => tracing::debug!(
            host,
            "service hostname is not a token; forwarded host= left out"
        ),
        None => {}
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

    /// ztunnel names the workload under its kind: a pod is `k8s.pod.name`, a job `k8s.job.name`.
    #[test]
    fn the_name_key_follows_the_workload_type() {
        let mut w = WorkloadMeta {
            namespace: "default".into(),
            workload_name: "batch-1".into(),
            workload_type: "job".into(),
            cluster_id: "east".into(),
            ..Default::default()
        };
        assert_eq!(
            baggage(&w, "Kubernetes"),
            "k8s.cluster.name=east,k8s.namespace.name=default,k8s.job.name=batch-1"
        );
        w.workload_type = "pod".into();
        assert!(baggage(&w, "Kubernetes").contains(",k8s.pod.name=batch-1"));
        w.workload_type = "Evil,x=y".into();
        assert!(baggage(&w, "Kubernetes").contains(",k8s.deployment.name=batch-1"));
    }

    #[test]
    fn names_from_config_cannot_break_the_headers() {
        let src = WorkloadMeta {
            namespace: "a,k8s.cluster.name=evil".into(),
            workload_name: "caf\u{e9} 1".into(),
            canonical_name: "x;y%z".into(),
            ..Default::default()
        };
        let h = connect_headers(
            "10.0.0.1:4000".parse().unwrap(),
            Some(&src),
            Some("caf\u{e9}.default.svc"),
            "Kubernetes",
        );
        // for= survives a hostname that is not a token; host= is left out.
        assert_eq!(h["forwarded"], "for=\"10.0.0.1:4000\"");
        // Separators and non-ASCII are percent-encoded: still five items, each value decodable.
        assert_eq!(
            h["baggage"],
            "k8s.cluster.name=Kubernetes,k8s.namespace.name=a%2Ck8s.cluster.name=evil,\
             k8s.deployment.name=caf%C3%A9%201,service.name=x%3By%25z"
        );
    }
}
