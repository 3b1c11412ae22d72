//! `connect_headers`: the CONNECT request headers weft writes for an outbound tunnel (`forwarded`, `baggage`,
//! `traceparent`, from the source workload's metadata and the targeted service, which come from config) and reads
//! on an inbound one (`forwarded` as any peer may write it). Input: a structured value (`arbitrary`).
//!
//! Invariants: `traceparent` is W3C-shaped (`00-<32 hex>-<16 hex>-00`); `forwarded` is always sent and reads back
//! (`for=` is the source address; `host=` the service hostname when it is a token, absent otherwise); `baggage`
//! reads back item by item, values percent-decoded, whatever the names from config hold.
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

    // forwarded: always sent, always readable, for= always the source.
    let fwd = h.get("forwarded").expect("forwarded is always sent");
    assert!(fwd.to_str().is_ok(), "forwarded {fwd:?} is not readable");
    assert_eq!(
        weft_proxy::fuzzing::forwarded_for(&h),
        Some(src_addr),
        "for= does not read back"
    );
    let want_host = host.filter(|h| is_token(h));
    assert_eq!(
        weft_proxy::fuzzing::forwarded_host(&h),
        want_host,
        "host= does not read back"
    );

    // baggage: every non-empty item, in order, values percent-decoded.
    if let Some(m) = &meta {
        let cluster = if m.cluster_id.is_empty() {
            input.cluster.as_str()
        } else {
            m.cluster_id.as_str()
        };
        let want: Vec<(&str, Vec<u8>)> = [
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
        .map(|(k, v)| (k, v.as_bytes().to_vec()))
        .collect();
        let got = h
            .get("baggage")
            .map(|v| v.to_str().expect("baggage is always readable").to_owned())
            .unwrap_or_default();
        let items: Vec<(&str, Vec<u8>)> = if got.is_empty() {
            Vec::new()
        } else {
            got.split(',')
                .map(|kv| {
                    let (k, v) = kv.split_once('=').expect("item is key=value");
                    (k, percent_decode(v))
                })
                .collect()
        };
        assert_eq!(items, want, "baggage {got:?} does not read back");
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

/// An RFC 9110 token (what `host=` may carry unquoted).
fn is_token(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// Decodes `%XX` escapes (the writer escapes every byte outside W3C's baggage-octet, and `%`).
fn percent_decode(v: &str) -> Vec<u8> {
    let b = v.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = std::str::from_utf8(&b[i + 1..i + 3]).expect("escape is ASCII");
            out.push(u8::from_str_radix(hex, 16).expect("escape is hex"));
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    out
}
