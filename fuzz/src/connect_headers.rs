//! `connect_headers`: the CONNECT request headers weft writes for an outbound tunnel (`forwarded`, `baggage`,
//! `traceparent`, from the source workload's metadata and the targeted service, which come from config) and reads
//! on an inbound one (`forwarded` as any peer may write it). Input: a structured value (`arbitrary`).
//!
//! Invariants: `traceparent` is W3C-shaped (`00-<32 hex>-<16 hex>-00`); `forwarded` reads back (`for=` is the
//! source address, `host=` the service hostname when it is a DNS name); `baggage` reads back item by item when
//! every value is a Kubernetes-style name; a header is never present with a value that does not read back.
//! For arbitrary peer-written `forwarded` values, the inbound parser's output is checked as in `hbone_connect`.
//!
//! Byte 0 = 0: the rest is a header block as a peer sends it (`name: value` lines; the seeds' form).

use std::net::{IpAddr, SocketAddr};

use arbitrary::{Arbitrary, Unstructured};
use http::{HeaderMap, HeaderValue};
use weft_hooks::WorkloadMeta;

#[derive(Debug, Arbitrary)]
enum Ip {
    V4([u8; 4]),
    V6([u8; 16]),
}

#[derive(Debug, Arbitrary)]
struct Meta {
    namespace: String,
    workload_name: String,
    canonical_name: String,
    canonical_revision: String,
    cluster_id: String,
    region: String,
    zone: String,
}

#[derive(Debug, Arbitrary)]
struct Input {
    ip: Ip,
    port: u16,
    src: Option<Meta>,
    service_host: Option<String>,
    cluster: String,
    /// A `forwarded` value as a peer may send it.
    peer_forwarded: Vec<u8>,
}

/// A value the control plane would give: a DNS label/subdomain, or a Kubernetes label value.
fn is_name(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'))
}

/// Feed one input: byte 0 = 0 means the rest is a header block as a peer sends it (`name: value` lines, the
/// seeds' form), checked as inbound reads it; otherwise the rest is a structured input.
pub fn run(data: &[u8]) {
    let input = match data.split_first() {
        None => return,
        Some((0, rest)) => return peer_headers(rest),
        Some((_, rest)) => match Input::arbitrary_take_rest(Unstructured::new(rest)) {
            Ok(input) => input,
            Err(_) => return,
        },
    };
    let ip = match input.ip {
        Ip::V4(b) => IpAddr::from(b),
        Ip::V6(b) => IpAddr::from(b),
    };
    let src_addr = SocketAddr::new(ip, input.port);
    let meta = input.src.map(|m| WorkloadMeta {
        namespace: m.namespace,
        workload_name: m.workload_name,
        canonical_name: m.canonical_name,
        canonical_revision: m.canonical_revision,
        cluster_id: m.cluster_id,
        region: m.region,
        zone: m.zone,
        ..Default::default()
    });
    let host = input.service_host.as_deref();
    let h = weft_proxy::headers::connect_headers(src_addr, meta.as_ref(), host, &input.cluster);

    // traceparent
    let tp = h
        .get("traceparent")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let parts: Vec<&str> = tp.split('-').collect();
    let hex = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_hexdigit());
    assert!(
        parts.len() == 4
            && parts[0] == "00"
            && hex(parts[1], 32)
            && hex(parts[2], 16)
            && parts[3] == "00",
        "traceparent {tp:?}"
    );

    // forwarded
    match h.get("forwarded") {
        // A value with bytes outside visible ASCII (a non-ASCII hostname from config) is sent, but a reader's
        // `to_str` refuses it whole, so neither element reads back; see README "Findings".
        Some(v) if v.to_str().is_err() => assert!(host.is_some_and(|h| !h.is_ascii())),
        Some(_) => {
            assert_eq!(
                weft_proxy::fuzzing::forwarded_for(&h),
                Some(src_addr),
                "for= does not read back"
            );
            match host {
                None => assert_eq!(weft_proxy::fuzzing::forwarded_host(&h), None),
                Some(host) if is_name(host) => {
                    assert_eq!(
                        weft_proxy::fuzzing::forwarded_host(&h),
                        Some(host),
                        "host= does not read back"
                    )
                }
                Some(_) => {}
            }
        }
        None => assert!(
            host.is_some_and(|h| !is_name(h)),
            "no forwarded header for {src_addr} host {host:?}"
        ),
    }

    // baggage
    if let Some(m) = &meta {
        let cluster = if m.cluster_id.is_empty() {
            input.cluster.as_str()
        } else {
            m.cluster_id.as_str()
        };
        let want: Vec<(&str, &str)> = [
            ("k8s.cluster.name", cluster),
            ("k8s.namespace.name", m.namespace.as_str()),
            ("k8s.deployment.name", m.workload_name.as_str()),
            ("service.name", m.canonical_name.as_str()),
            ("service.version", m.canonical_revision.as_str()),
            ("cloud.region", m.region.as_str()),
            ("cloud.availability_zone", m.zone.as_str()),
        ]
        .into_iter()
        .filter(|(_, v)| !v.is_empty())
        .collect();
        if want.iter().all(|(_, v)| is_name(v)) {
            let got = h
                .get("baggage")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default();
            let items: Vec<(&str, &str)> = if got.is_empty() {
                Vec::new()
            } else {
                got.split(',').filter_map(|kv| kv.split_once('=')).collect()
            };
            assert_eq!(items, want, "baggage {got:?} does not read back");
        }
    } else {
        assert!(h.get("baggage").is_none());
    }

    // What a peer may write.
    if let Ok(v) = HeaderValue::from_bytes(&input.peer_forwarded) {
        let mut peer = HeaderMap::new();
        peer.insert("forwarded", v);
        crate::hbone_connect::check_forwarded(&peer);
    }
}

/// A header block a peer wrote, one `name: value` per line.
fn peer_headers(block: &[u8]) {
    let mut h = HeaderMap::new();
    for line in block.split(|b| *b == b'\n') {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let Some(colon) = line.iter().position(|b| *b == b':') else {
            continue;
        };
        let (name, value) = (&line[..colon], &line[colon + 1..]);
        let value = value.strip_prefix(b" ").unwrap_or(value);
        if let (Ok(n), Ok(v)) = (
            http::HeaderName::from_bytes(name),
            HeaderValue::from_bytes(value),
        ) {
            h.append(n, v);
        }
    }
    crate::hbone_connect::check_forwarded(&h);
}
