//! The DNS proxy over real sockets: mesh names (A/AAAA, missing family, headless, wildcards, visibility), short
//! names through the search domains with a real stub resolver (hickory-resolver, ndots 5), misses forwarded to a
//! real upstream and cached by TTL (hand-moved clock), TCP fallback for truncated answers, malformed queries, and
//! clients that are refused.

#![allow(clippy::unwrap_used)]

mod common;

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use common::*;
use hickory_proto::op::{Message, ResponseCode};
use hickory_proto::rr::{RData, RecordType};
use hickory_resolver::config::{ConnectionConfig, NameServerConfig, ResolverConfig};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::proto::rr::Name;
use weft_dns::{Clients, MESH_TTL};

const MESH: &str = r#"
workloads:
- {uid: client-1, name: client-1, namespace: ns1, workloadIps: [127.0.1.1], protocol: HBONE, node: node-a}
- {uid: plain-1, name: plain-1, namespace: ns1, workloadIps: [127.0.1.2], protocol: TCP, node: node-a}
- {uid: remote-1, name: remote-1, namespace: ns1, workloadIps: [127.0.2.1], protocol: HBONE, node: node-b}
- {uid: db-0, name: db-0, namespace: ns1, workloadIps: [10.1.0.1, "fd00::1"], node: node-b,
   services: {ns1/db.ns1.svc.cluster.local: {}, ns1/db4.ns1.svc.cluster.local: {}, ns1/dball.ns1.svc.cluster.local: {}}}
- {uid: db-1, name: db-1, namespace: ns1, workloadIps: [10.1.0.2, "fd00::2"], node: node-b, status: Unhealthy,
   services: {ns1/db.ns1.svc.cluster.local: {}, ns1/db4.ns1.svc.cluster.local: {}, ns1/dball.ns1.svc.cluster.local: {}}}
services:
- {name: echo, namespace: ns1, hostname: echo.ns1.svc.cluster.local, vips: ["/10.96.0.10"], ports: {80: 8080}}
- {name: dual, namespace: ns1, hostname: dual.ns1.svc.cluster.local,
   vips: ["/10.96.0.11", "/fd00:96::11", "net2/10.200.0.11"], ports: {80: 80}}
- {name: other, namespace: ns2, hostname: other.ns2.svc.cluster.local, vips: ["/10.96.0.20"]}
- {name: secret, namespace: ns2, hostname: secret.ns2.svc.cluster.local, vips: ["/10.96.0.21"], visibility: Namespace}
- {name: db, namespace: ns1, hostname: db.ns1.svc.cluster.local}
- {name: db4, namespace: ns1, hostname: db4.ns1.svc.cluster.local, ipFamilies: IPv4}
- {name: dball, namespace: ns1, hostname: dball.ns1.svc.cluster.local, loadBalancer: {healthPolicy: AllowAll}}
- {name: ext, namespace: ns1, hostname: www.example.org}
- {name: wild, namespace: ns1, hostname: "*.wild.example", vips: ["/10.96.0.30"]}
- {name: shared, namespace: ns2, hostname: shared.example, vips: ["/10.96.0.40"]}
- {name: shared, namespace: ns1, hostname: shared.example, vips: ["/10.96.0.41"]}
"#;

const CLIENT: &str = "127.0.1.1";

fn node_a() -> Clients {
    Clients::Node {
        node: "node-a".into(),
    }
}

async fn upstream() -> Upstream {
    let many: Vec<std::net::Ipv4Addr> = (1..=40).map(|i| [192, 0, 2, i].into()).collect();
    Upstream::start(
        ip("127.0.0.1"),
        &[
            ("www.example.org.", 60, vec![[192, 0, 2, 80].into()]),
            ("big.example.org.", 300, many),
        ],
    )
    .await
    .unwrap()
}

#[tokio::test]
async fn mesh_names_are_answered_authoritatively_over_udp_and_tcp() {
    let up = upstream().await;
    let p = Proxy::start(MESH, node_a(), vec![up.addr]).await;
    for via in [Via::Udp, Via::Tcp] {
        let r = ask(
            p.addr,
            ip(CLIENT),
            "echo.ns1.svc.cluster.local.",
            RecordType::A,
            via,
        )
        .await;
        assert_eq!(r.metadata.response_code, ResponseCode::NoError);
        assert!(r.metadata.authoritative, "{via:?}");
        assert!(r.metadata.recursion_available && r.metadata.recursion_desired);
        assert_eq!(ips(&r), [ip("10.96.0.10")]);
        assert_eq!(r.answers[0].ttl, MESH_TTL);
        assert_eq!(r.answers[0].name.to_ascii(), "echo.ns1.svc.cluster.local.");
        // The name exists but has no IPv6 address: NOERROR, no answer, still authoritative.
        let r = ask(
            p.addr,
            ip(CLIENT),
            "echo.ns1.svc.cluster.local.",
            RecordType::AAAA,
            via,
        )
        .await;
        assert_eq!(r.metadata.response_code, ResponseCode::NoError);
        assert!(r.metadata.authoritative && r.answers.is_empty());
        // Dual stack: each family gets its own VIPs, only those on the client's network.
        let r = ask(
            p.addr,
            ip(CLIENT),
            "dual.ns1.svc.cluster.local.",
            RecordType::A,
            via,
        )
        .await;
        assert_eq!(ips(&r), [ip("10.96.0.11")]);
        let r = ask(
            p.addr,
            ip(CLIENT),
            "dual.ns1.svc.cluster.local.",
            RecordType::AAAA,
            via,
        )
        .await;
        assert_eq!(ips(&r), [ip("fd00:96::11")]);
        // Case does not matter; the answer keeps the question's spelling.
        let r = ask(
            p.addr,
            ip(CLIENT),
            "ECHO.ns1.SVC.cluster.local.",
            RecordType::A,
            via,
        )
        .await;
        assert_eq!(ips(&r), [ip("10.96.0.10")]);
        assert_eq!(r.answers[0].name.to_ascii(), "ECHO.ns1.SVC.cluster.local.");
        // A wildcard host answers every name under it.
        let r = ask(p.addr, ip(CLIENT), "a.b.wild.example.", RecordType::A, via).await;
        assert_eq!(ips(&r), [ip("10.96.0.30")]);
        // One hostname in two namespaces: the client's own namespace wins.
        let r = ask(p.addr, ip(CLIENT), "shared.example.", RecordType::A, via).await;
        assert_eq!(ips(&r), [ip("10.96.0.41")]);
    }
    assert_eq!(up.total(), 0, "mesh names never reach the upstream");
    assert_eq!(p.count("udp", "answered"), 6);
    assert_eq!(p.count("tcp", "no_records"), 1);
}

#[tokio::test]
async fn headless_services_answer_their_endpoints_by_family() {
    let up = upstream().await;
    let p = Proxy::start(MESH, node_a(), vec![up.addr]).await;
    let r = ask(
        p.addr,
        ip(CLIENT),
        "db.ns1.svc.cluster.local.",
        RecordType::A,
        Via::Udp,
    )
    .await;
    assert!(r.metadata.authoritative);
    assert_eq!(
        ips(&r),
        [ip("10.1.0.1")],
        "the healthy endpoint only, as ztunnel (db-1 is unhealthy)"
    );
    let r = ask(
        p.addr,
        ip(CLIENT),
        "db.ns1.svc.cluster.local.",
        RecordType::AAAA,
        Via::Udp,
    )
    .await;
    assert_eq!(ips(&r), [ip("fd00::1")]);
    // A health policy of ALLOW_ALL includes the unhealthy endpoint, in DNS as in load balancing.
    for (family, want) in [
        (RecordType::A, [ip("10.1.0.1"), ip("10.1.0.2")]),
        (RecordType::AAAA, [ip("fd00::1"), ip("fd00::2")]),
    ] {
        let r = ask(
            p.addr,
            ip(CLIENT),
            "dball.ns1.svc.cluster.local.",
            family,
            Via::Udp,
        )
        .await;
        assert_eq!(ips(&r), want, "{family}");
    }
    // Declared IPv4-only: dual-stack endpoints get no AAAA.
    let r = ask(
        p.addr,
        ip(CLIENT),
        "db4.ns1.svc.cluster.local.",
        RecordType::AAAA,
        Via::Udp,
    )
    .await;
    assert_eq!(r.metadata.response_code, ResponseCode::NoError);
    assert!(r.metadata.authoritative && r.answers.is_empty());
    let r = ask(
        p.addr,
        ip(CLIENT),
        "db4.ns1.svc.cluster.local.",
        RecordType::A,
        Via::Udp,
    )
    .await;
    assert_eq!(ips(&r), [ip("10.1.0.1")]);
    // A VIP-less service outside the cluster domain is not a headless service: the upstream answers it.
    let r = ask(
        p.addr,
        ip(CLIENT),
        "www.example.org.",
        RecordType::A,
        Via::Udp,
    )
    .await;
    assert!(!r.metadata.authoritative);
    assert_eq!(ips(&r), [ip("192.0.2.80")]);
    assert_eq!(up.asked("www.example.org.", RecordType::A), 1);
}

/// A stub resolver configured as a pod in `ns1` is (search list, ndots 5), sending from the client's address.
fn pod_resolver(proxy: SocketAddr, src: IpAddr) -> hickory_resolver::TokioResolver {
    let mut udp = ConnectionConfig::udp();
    udp.port = proxy.port();
    udp.bind_addr = Some(SocketAddr::new(src, 0));
    let mut tcp = ConnectionConfig::tcp();
    tcp.port = proxy.port();
    tcp.bind_addr = Some(SocketAddr::new(src, 0));
    let mut ns = NameServerConfig::udp_and_tcp(proxy.ip());
    ns.connections = vec![udp, tcp];
    let search = [
        "ns1.svc.cluster.local.",
        "svc.cluster.local.",
        "cluster.local.",
    ]
    .map(|s| Name::from_ascii(s).unwrap())
    .to_vec();
    let cfg = ResolverConfig::from_parts(None, search, vec![ns]);
    let mut b =
        hickory_resolver::Resolver::builder_with_config(cfg, TokioRuntimeProvider::default());
    let o = b.options_mut();
    o.ndots = 5;
    o.cache_size = 0;
    o.timeout = WAIT;
    o.attempts = 1;
    o.use_hosts_file = hickory_resolver::config::ResolveHosts::Never;
    b.build().unwrap()
}

async fn v4s(r: &hickory_resolver::TokioResolver, name: &str) -> Result<Vec<IpAddr>, String> {
    let l = r
        .lookup(name, RecordType::A)
        .await
        .map_err(|e| e.to_string())?;
    let mut v: Vec<IpAddr> = l
        .answers()
        .iter()
        .filter_map(|r| match &r.data {
            RData::A(a) => Some(IpAddr::V4(a.0)),
            _ => None,
        })
        .collect();
    v.sort();
    Ok(v)
}

#[tokio::test]
async fn short_names_resolve_through_the_pods_search_domains() {
    let up = upstream().await;
    let p = Proxy::start(MESH, node_a(), vec![up.addr]).await;
    let r = pod_resolver(p.addr, ip(CLIENT));
    // <svc> in the client's namespace, <svc>.<ns>, <svc>.<ns>.svc, the FQDN.
    assert_eq!(v4s(&r, "echo").await.unwrap(), [ip("10.96.0.10")]);
    assert_eq!(v4s(&r, "other.ns2").await.unwrap(), [ip("10.96.0.20")]);
    assert_eq!(v4s(&r, "other.ns2.svc").await.unwrap(), [ip("10.96.0.20")]);
    assert_eq!(
        v4s(&r, "other.ns2.svc.cluster.local.").await.unwrap(),
        [ip("10.96.0.20")]
    );
    // Another namespace's service by its bare name is not the client's: every search-list form is forwarded
    // and the upstream knows none of them.
    assert!(v4s(&r, "other").await.is_err());
    assert_eq!(up.asked("other.ns1.svc.cluster.local.", RecordType::A), 1);
    // A namespace-scoped service is invisible from another namespace.
    assert!(v4s(&r, "secret.ns2").await.is_err());
    assert!(up.asked("secret.ns2.svc.cluster.local.", RecordType::A) >= 1);
    // What a pod's resolver sends for `other.ns2` first: the name completed with the first search domain. The
    // answer is a CNAME to the name the client meant, then its address, as ztunnel answers.
    let m = ask(
        p.addr,
        ip(CLIENT),
        "other.ns2.ns1.svc.cluster.local.",
        RecordType::A,
        Via::Udp,
    )
    .await;
    assert!(m.metadata.authoritative);
    assert_eq!(m.answers.len(), 2);
    match &m.answers[0].data {
        RData::CNAME(c) => assert_eq!(c.0.to_ascii(), "other.ns2."),
        other => panic!("expected a CNAME, got {other:?}"),
    }
    assert_eq!(m.answers[1].name.to_ascii(), "other.ns2.");
    assert_eq!(ips(&m), [ip("10.96.0.20")]);
}

#[tokio::test]
async fn misses_are_forwarded_and_cached_by_ttl() {
    let up = upstream().await;
    let p = Proxy::start(MESH, node_a(), vec![up.addr]).await;
    let name = "www.example.org.";
    let first = ask(p.addr, ip(CLIENT), name, RecordType::A, Via::Udp).await;
    assert!(
        !first.metadata.authoritative,
        "forwarded answers are not ours"
    );
    assert_eq!(ips(&first), [ip("192.0.2.80")]);
    assert_eq!(first.answers[0].ttl, 60);
    assert_eq!(up.asked(name, RecordType::A), 1);
    // Within the TTL: from the cache (either transport), TTL counted down by the clock.
    p.clock.advance(Duration::from_secs(20));
    let again = ask(p.addr, ip(CLIENT), name, RecordType::A, Via::Tcp).await;
    assert_eq!(ips(&again), [ip("192.0.2.80")]);
    assert_eq!(again.answers[0].ttl, 40);
    assert_eq!(up.asked(name, RecordType::A), 1);
    // Past the TTL: asked again.
    p.clock.advance(Duration::from_secs(40));
    let third = ask(p.addr, ip(CLIENT), name, RecordType::A, Via::Udp).await;
    assert_eq!(third.answers[0].ttl, 60);
    assert_eq!(up.asked(name, RecordType::A), 2);
    // A negative answer is cached for the SOA's negative TTL (45 s) and passed on with its SOA.
    let missing = "nothing.example.";
    let nx = ask(p.addr, ip(CLIENT), missing, RecordType::A, Via::Udp).await;
    assert_eq!(nx.metadata.response_code, ResponseCode::NXDomain);
    assert!(matches!(nx.authorities[0].data, RData::SOA(_)));
    p.clock.advance(Duration::from_secs(44));
    let nx = ask(p.addr, ip(CLIENT), missing, RecordType::A, Via::Udp).await;
    assert_eq!(nx.metadata.response_code, ResponseCode::NXDomain);
    assert_eq!(up.asked(missing, RecordType::A), 1);
    p.clock.advance(Duration::from_secs(1));
    ask(p.addr, ip(CLIENT), missing, RecordType::A, Via::Udp).await;
    assert_eq!(up.asked(missing, RecordType::A), 2);
    // Other record types go upstream too (mesh names answer only A and AAAA).
    let mx = ask(
        p.addr,
        ip(CLIENT),
        "echo.ns1.svc.cluster.local.",
        RecordType::MX,
        Via::Udp,
    )
    .await;
    assert!(!mx.metadata.authoritative);
    assert_eq!(up.asked("echo.ns1.svc.cluster.local.", RecordType::MX), 1);
    assert!(p.metrics.cache_hits.get() >= 2);
}

#[tokio::test]
async fn truncated_answers_are_refetched_over_tcp() {
    let up = upstream().await;
    let p = Proxy::start(MESH, node_a(), vec![up.addr]).await;
    // The upstream truncates this one over UDP: the proxy asks again over TCP and gets all 40.
    let tcp = ask(
        p.addr,
        ip(CLIENT),
        "big.example.org.",
        RecordType::A,
        Via::Tcp,
    )
    .await;
    assert!(!tcp.metadata.truncation);
    assert_eq!(tcp.answers.len(), 40);
    // To a UDP client without EDNS the 40 records do not fit in 512 bytes: TC, so it retries over TCP.
    let udp = ask(
        p.addr,
        ip(CLIENT),
        "big.example.org.",
        RecordType::A,
        Via::Udp,
    )
    .await;
    assert!(udp.metadata.truncation);
    assert!(udp.answers.len() < 40);
    // A real resolver does that retry by itself.
    let r = pod_resolver(p.addr, ip(CLIENT));
    assert_eq!(v4s(&r, "big.example.org.").await.unwrap().len(), 40);
}

#[tokio::test]
async fn malformed_queries_get_formerr_or_nothing_and_the_proxy_keeps_serving() {
    let up = upstream().await;
    let p = Proxy::start(MESH, node_a(), vec![up.addr]).await;
    // A header that promises a question and carries none: FORMERR with the same id, over both transports.
    let bad = [0xab, 0xcd, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0, 0xc0];
    for via in [Via::Udp, Via::Tcp] {
        let r = Message::from_vec(&exchange(p.addr, ip(CLIENT), &bad, via).await).unwrap();
        assert_eq!(r.metadata.id, 0xabcd);
        assert_eq!(r.metadata.response_code, ResponseCode::FormErr, "{via:?}");
    }
    // Two questions: FORMERR.
    let mut two = query("echo.ns1.svc.cluster.local.", RecordType::A, false);
    two.add_query(hickory_proto::op::Query::query(
        Name::from_ascii("x.").unwrap(),
        RecordType::A,
    ));
    let r =
        Message::from_vec(&exchange(p.addr, ip(CLIENT), &two.to_vec().unwrap(), Via::Udp).await)
            .unwrap();
    assert_eq!(r.metadata.response_code, ResponseCode::FormErr);
    // Too short to be DNS, and a response posing as a query: no answer. A valid query sent after them on the same
    // socket gets the first reply, so nothing was sent for the two.
    let s = tokio::net::UdpSocket::bind((ip(CLIENT), 0)).await.unwrap();
    s.send_to(&[1, 2, 3], p.addr).await.unwrap();
    let mut response = query("echo.ns1.svc.cluster.local.", RecordType::A, false);
    response.metadata.message_type = hickory_proto::op::MessageType::Response;
    s.send_to(&response.to_vec().unwrap(), p.addr)
        .await
        .unwrap();
    let good = query("echo.ns1.svc.cluster.local.", RecordType::A, true);
    s.send_to(&good.to_vec().unwrap(), p.addr).await.unwrap();
    let mut buf = vec![0u8; 4096];
    let (n, _) = tokio::time::timeout(WAIT, s.recv_from(&mut buf))
        .await
        .unwrap()
        .unwrap();
    let r = Message::from_vec(&buf[..n]).unwrap();
    assert_eq!(r.metadata.id, good.metadata.id);
    assert_eq!(ips(&r), [ip("10.96.0.10")]);
    assert_eq!(
        r.edns.as_ref().map(|e| e.max_payload()),
        Some(1232),
        "EDNS answered"
    );
    assert_eq!(p.count("udp", "dropped"), 2);
    assert_eq!(p.count("udp", "formerr"), 2);
    // Garbage over TCP: a length prefix with bytes that are no message ends that connection, not the server.
    let mut c = tcp_from(ip(CLIENT), p.addr).await;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    c.write_all(&[0, 3, 9, 9, 9]).await.unwrap();
    let mut rest = Vec::new();
    let n = tokio::time::timeout(WAIT, c.read_to_end(&mut rest))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(n, 0, "closed without a reply");
    let r = ask(
        p.addr,
        ip(CLIENT),
        "echo.ns1.svc.cluster.local.",
        RecordType::A,
        Via::Tcp,
    )
    .await;
    assert_eq!(ips(&r), [ip("10.96.0.10")]);
}

#[tokio::test]
async fn only_captured_workloads_of_this_node_get_answers() {
    let up = upstream().await;
    let p = Proxy::start(MESH, node_a(), vec![up.addr]).await;
    // Not a workload; a workload of this node that is not in the mesh (TCP); a mesh workload of another node.
    for src in ["127.0.9.9", "127.0.1.2", "127.0.2.1"] {
        for via in [Via::Udp, Via::Tcp] {
            for name in ["echo.ns1.svc.cluster.local.", "www.example.org."] {
                let r = ask(p.addr, ip(src), name, RecordType::A, via).await;
                assert_eq!(
                    r.metadata.response_code,
                    ResponseCode::Refused,
                    "{src} {via:?} {name}"
                );
                assert!(r.answers.is_empty() && !r.metadata.authoritative);
            }
        }
    }
    assert_eq!(up.total(), 0, "nothing was forwarded for them");
    assert_eq!(p.count("udp", "refused") + p.count("tcp", "refused"), 12);
    // The state is read per query: a workload that joins the node is served at once.
    let joined = MESH.replace(
        "{uid: plain-1, name: plain-1, namespace: ns1, workloadIps: [127.0.1.2], protocol: TCP, node: node-a}",
        "{uid: plain-1, name: plain-1, namespace: ns1, workloadIps: [127.0.1.2], protocol: HBONE, node: node-a}",
    );
    p.state
        .replace(weft_state::local::parse(&joined, std::path::Path::new("/")).unwrap());
    let r = ask(
        p.addr,
        ip("127.0.1.2"),
        "echo.ns1.svc.cluster.local.",
        RecordType::A,
        Via::Udp,
    )
    .await;
    assert_eq!(ips(&r), [ip("10.96.0.10")]);
}

#[tokio::test]
async fn in_pod_every_query_is_the_pods() {
    let up = upstream().await;
    let p = Proxy::start(
        MESH,
        pod_client("node-b", "remote-1", "remote-1"),
        vec![up.addr],
    )
    .await;
    // Whatever the source address (inside a pod it is the pod's own or loopback), the pod's namespace applies.
    let r = ask(
        p.addr,
        ip("127.0.0.1"),
        "echo.ns1.svc.cluster.local.",
        RecordType::A,
        Via::Udp,
    )
    .await;
    assert_eq!(ips(&r), [ip("10.96.0.10")]);
    let r = pod_resolver(p.addr, ip("127.0.0.1"));
    assert_eq!(v4s(&r, "echo").await.unwrap(), [ip("10.96.0.10")]);
    // The agent names the pod by its Kubernetes uid, istiod by `<cluster>//Pod/<ns>/<name>`: name, namespace and
    // service account find it.
    let k8s = Proxy::start(
        MESH,
        pod_client("node-b", "7f8e1c2a-k8s-uid", "remote-1"),
        vec![up.addr],
    )
    .await;
    let r = ask(
        k8s.addr,
        ip("127.0.0.1"),
        "echo.ns1.svc.cluster.local.",
        RecordType::A,
        Via::Udp,
    )
    .await;
    assert_eq!(ips(&r), [ip("10.96.0.10")]);
    // A pod that left the mesh state is refused, and so is a pod of another node.
    for gone in [
        pod_client("node-b", "gone", "gone"),
        pod_client("node-a", "remote-1", "remote-1"),
    ] {
        let gone = Proxy::start(MESH, gone, vec![up.addr]).await;
        let r = ask(
            gone.addr,
            ip("127.0.0.1"),
            "echo.ns1.svc.cluster.local.",
            RecordType::A,
            Via::Udp,
        )
        .await;
        assert_eq!(r.metadata.response_code, ResponseCode::Refused);
    }
}

/// An in-pod client: pod `name` in `ns1` with uid `uid`, on `node`.
fn pod_client(node: &str, uid: &str, name: &str) -> Clients {
    Clients::Pod {
        node: node.into(),
        pod: weft_state::LocalPod {
            uid: uid.into(),
            name: name.into(),
            namespace: "ns1".into(),
            service_account: "default".into(),
        },
    }
}

#[tokio::test]
async fn an_unreachable_upstream_is_servfail() {
    // A port nothing listens on: the connected UDP socket gets ICMP port unreachable at once.
    let closed = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let dead = closed.local_addr().unwrap();
    drop(closed);
    let p = Proxy::start(MESH, node_a(), vec![dead]).await;
    let r = ask(
        p.addr,
        ip(CLIENT),
        "www.example.org.",
        RecordType::A,
        Via::Udp,
    )
    .await;
    assert_eq!(r.metadata.response_code, ResponseCode::ServFail);
    assert_eq!(p.count("udp", "forward_failed"), 1);
    assert_eq!(p.metrics.upstream_failures.get(), 1);
    // Mesh names do not need the upstream.
    let r = ask(
        p.addr,
        ip(CLIENT),
        "echo.ns1.svc.cluster.local.",
        RecordType::A,
        Via::Udp,
    )
    .await;
    assert_eq!(ips(&r), [ip("10.96.0.10")]);
}
