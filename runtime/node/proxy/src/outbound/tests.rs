//! Outbound resolution, policy, pooling and failure classification against real sockets, real TLS and a real
//! in-process HBONE server (a second data path playing node B).
#![allow(clippy::unwrap_used)] // test code: a panic fails the test

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use weft_identity::{SecretManager, SpiffeId};

use super::*;
use crate::testkit::{self, Recorder};
use crate::{InboundBind, Proxy, ProxyMetrics};

/// Each test owns the subnet 127.77.T.0/24: client .1 on node A, echo (HBONE) .11 and db (TCP) .12 on node B,
/// service VIP .100 (port 80 → 8080, with an extra SAN).
#[derive(Clone, Copy)]
struct Net(u8);

impl Net {
    fn ip(self, last: u8) -> Ipv4Addr {
        Ipv4Addr::new(127, 77, self.0, last)
    }
    fn client(self) -> SocketAddr {
        SocketAddr::from((self.ip(1), 40_000))
    }
    fn echo(self) -> SocketAddr {
        SocketAddr::from((self.ip(11), 8080))
    }
    fn db(self) -> SocketAddr {
        SocketAddr::from((self.ip(12), 8080))
    }
    fn vip(self) -> SocketAddr {
        SocketAddr::from((self.ip(100), 80))
    }
    fn hbone(self) -> SocketAddr {
        SocketAddr::from((self.ip(11), HBONE_PORT))
    }
}

const HBONE_PORT: u16 = 15008;
const SVC_SAN: &str = "spiffe://cluster.local/ns/default/sa/echo-svc";

fn yaml(n: Net, echo_sa: &str) -> String {
    format!(
        r#"workloads:
- uid: Kubernetes//Pod/default/client
  name: client
  namespace: default
  serviceAccount: client
  workloadIps: [{client}]
  protocol: HBONE
  node: node-a
- uid: Kubernetes//Pod/default/echo
  name: echo
  namespace: default
  serviceAccount: {echo_sa}
  workloadIps: [{echo}]
  protocol: HBONE
  node: node-b
  services:
    default/echo.default.svc.cluster.local: {{80: 8080}}
- uid: Kubernetes//Pod/legacy/db
  name: db
  namespace: legacy
  workloadIps: [{db}]
  protocol: TCP
  node: node-b
services:
- name: echo
  namespace: default
  hostname: echo.default.svc.cluster.local
  vips: ["/{vip}"]
  ports: {{80: 8080}}
  subjectAltNames: ["{SVC_SAN}"]
"#,
        client = n.client().ip(),
        echo = n.echo().ip(),
        db = n.db().ip(),
        vip = n.vip().ip(),
    )
}

/// Node A's data path (no listeners) over the standard mesh.
fn node_a(n: Net, identity: &Arc<SecretManager>) -> (Arc<Inner>, Arc<Recorder>) {
    let hooks = Arc::new(Recorder::default());
    let inner = testkit::inner(
        testkit::config("node-a", HBONE_PORT),
        testkit::state(&yaml(n, "echo")),
        identity.clone(),
        hooks.clone(),
    );
    (inner, hooks)
}

/// Node B: a real data path serving inbound HBONE on the echo workload's address, with the echo workload itself.
/// `echo_sa` is the service account node B's mesh file gives the echo workload (the identity it presents).
async fn node_b(n: Net, identity: &Arc<SecretManager>, echo_sa: &str) -> Arc<Proxy> {
    testkit::echo(n.echo()).await;
    let mut cfg = testkit::config("node-b", HBONE_PORT);
    cfg.inbound = InboundBind::Addr(n.hbone());
    Proxy::start(
        cfg,
        testkit::state(&yaml(n, echo_sa)),
        identity.clone(),
        Arc::new(Recorder::default()),
        Arc::new(ProxyMetrics::default()),
    )
    .await
    .unwrap()
}

/// Relay an established outbound connection for an in-process client and check an echo round trip.
async fn round_trip(inner: &Arc<Inner>, est: Established, payload: &[u8]) {
    let lis = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut app = tokio::net::TcpStream::connect(lis.local_addr().unwrap())
        .await
        .unwrap();
    let (proxy_side, _) = lis.accept().await.unwrap();
    let me = inner.clone();
    let relay = tokio::spawn(async move { me.run_outbound(proxy_side, est).await });
    app.write_all(payload).await.unwrap();
    app.shutdown().await.unwrap();
    let mut back = Vec::new();
    app.read_to_end(&mut back).await.unwrap();
    assert_eq!(back, payload);
    relay.await.unwrap();
}

fn last_close(hooks: &Recorder) -> weft_hooks::CloseRecord {
    hooks.closes().pop().expect("a close was reported").1
}

fn failed(inner: &Inner, reason: &'static str) -> u64 {
    inner
        .metrics
        .failed
        .get_or_create(&crate::metrics::FailLabels {
            direction: "outbound",
            reason,
        })
        .get()
}

#[tokio::test]
async fn service_vip_resolves_to_its_endpoint_over_hbone() {
    let n = Net(1);
    let id = testkit::identity();
    let _b = node_b(n, &id, "echo").await;
    let (a, _) = node_a(n, &id);
    let est = a
        .establish_outbound(n.client(), n.vip(), None)
        .await
        .unwrap();
    assert!(matches!(est.upstream, Upstream::Hbone(_, addr) if addr == n.hbone()));
    assert_eq!(
        est.record.dst_service.as_deref(),
        Some("default/echo.default.svc.cluster.local")
    );
    assert_eq!(est.record.dst_workload.as_ref().unwrap().name, "echo");
    assert_eq!(
        est.record.peer_identity.as_deref(),
        Some("spiffe://cluster.local/ns/default/sa/client")
    );
    round_trip(&a, est, b"through the VIP").await;
}

#[tokio::test]
async fn tcp_workload_is_dialled_directly() {
    let n = Net(2);
    let id = testkit::identity();
    testkit::echo(n.db()).await;
    let (a, _) = node_a(n, &id);
    let est = a
        .establish_outbound(n.client(), n.db(), None)
        .await
        .unwrap();
    assert!(matches!(&est.upstream, Upstream::Tcp(s) if s.peer_addr().unwrap() == n.db()));
    assert!(!est.record.hbone);
    round_trip(&a, est, b"plain tcp").await;
    assert_eq!(a.pool().created_total(), 0);
}

#[tokio::test]
async fn unknown_service_port_is_unroutable() {
    let n = Net(3);
    let (a, hooks) = node_a(n, &testkit::identity());
    let e = a
        .establish_outbound(n.client(), SocketAddr::new(n.vip().ip(), 81), None)
        .await
        .err()
        .unwrap();
    assert!(
        matches!(&e, OutboundError::Unroutable(m) if m.contains("no port 81")),
        "{e}"
    );
    assert_eq!(failed(&a, "unknown_destination"), 1);
    assert_eq!(last_close(&hooks).response_flags, "-");
}

#[tokio::test]
async fn weft_ports_of_workloads_are_refused() {
    let n = Net(4);
    let (a, _) = node_a(n, &testkit::identity());
    let e = a
        .establish_outbound(n.client(), n.hbone(), None)
        .await
        .err()
        .unwrap();
    assert!(matches!(e, OutboundError::Unroutable(_)), "{e}");
    assert_eq!(failed(&a, "self_call"), 1);
}

#[tokio::test]
async fn egress_policy_denial_stops_before_any_connection() {
    let n = Net(5);
    let (a, hooks) = node_a(n, &testkit::identity());
    hooks.deny_when(|r| r.dst.port() == 80);
    let e = a
        .establish_outbound(n.client(), n.vip(), None)
        .await
        .err()
        .unwrap();
    assert!(
        matches!(&e, OutboundError::Denied { by, .. } if by == "test"),
        "{e}"
    );
    assert_eq!(last_close(&hooks).response_flags, "DENY");
    assert_eq!(failed(&a, "denied"), 1);
    assert_eq!(a.pool().created_total(), 0);
}

#[tokio::test]
async fn a_source_that_is_no_local_workload_gets_no_identity() {
    let n = Net(6);
    let (a, hooks) = node_a(n, &testkit::identity());
    let stranger = SocketAddr::from((n.ip(99), 40_000));
    let e = a
        .establish_outbound(stranger, n.echo(), None)
        .await
        .err()
        .unwrap();
    assert!(matches!(e, OutboundError::Identity(_)), "{e}");
    assert_eq!(last_close(&hooks).response_flags, "IDENTITY_ERROR");
}

/// A hostNetwork pod's address is the node's, shared by every process there: it is no workload's address (as in
/// ztunnel), so a connection from it gets no identity, not the pod's.
#[tokio::test]
async fn a_host_network_pods_address_is_no_source_workload() {
    let n = Net(13);
    let node_ip = n.ip(3);
    let mesh = yaml(n, "echo").replace(
        "\nservices:\n",
        &format!(
            "\n- uid: Kubernetes//Pod/default/host-agent
  name: host-agent
  namespace: default
  serviceAccount: agent
  workloadIps: [{node_ip}]
  protocol: HBONE
  networkMode: HostNetwork
  node: node-a
services:\n"
        ),
    );
    let hooks = Arc::new(Recorder::default());
    let a = testkit::inner(
        testkit::config("node-a", HBONE_PORT),
        testkit::state(&mesh),
        testkit::identity(),
        hooks.clone(),
    );
    let e = a
        .establish_outbound(SocketAddr::from((node_ip, 40_000)), n.echo(), None)
        .await
        .err()
        .unwrap();
    assert!(matches!(e, OutboundError::Identity(_)), "{e}");
    let (record, _) = hooks.closes().pop().expect("a close was reported");
    assert!(record.src_workload.is_none() && record.peer_identity.is_none());
}

/// Hole 4: a connection verified against {workload identity, service SAN} (a request to the VIP) must not be
/// reused for a request to the workload address, which accepts the workload identity only.
#[tokio::test]
async fn a_wider_identity_set_is_not_reused_for_a_narrower_one() {
    let n = Net(7);
    let id = testkit::identity();
    let _b = node_b(n, &id, "echo").await;
    let (a, _) = node_a(n, &id);

    let via_vip = a
        .establish_outbound(n.client(), n.vip(), None)
        .await
        .unwrap();
    assert_eq!(a.pool().created_total(), 1);
    let direct = a
        .establish_outbound(n.client(), n.echo(), None)
        .await
        .unwrap();
    assert_eq!(
        a.pool().created_total(),
        2,
        "the request accepting only the workload identity reused the VIP's connection"
    );
    // Same sets still share.
    let via_vip_again = a
        .establish_outbound(n.client(), n.vip(), None)
        .await
        .unwrap();
    let direct_again = a
        .establish_outbound(n.client(), n.echo(), None)
        .await
        .unwrap();
    assert_eq!(a.pool().created_total(), 2);
    for est in [via_vip, direct, via_vip_again, direct_again] {
        round_trip(&a, est, b"pooled").await;
    }
}

#[test]
fn pool_keys_hold_the_accepted_identity_set() {
    let id = |s: &str| s.parse::<SpiffeId>().unwrap();
    let (wl, svc) = (id("spiffe://cluster.local/ns/default/sa/echo"), id(SVC_SAN));
    let src = id("spiffe://cluster.local/ns/default/sa/client");
    let dst: SocketAddr = "127.0.0.1:15008".parse().unwrap();
    let ip = Some(IpAddr::from([127, 0, 0, 1]));
    let wide = PoolKey::new(src.clone(), vec![wl.clone(), svc.clone()], ip, dst);
    let narrow = PoolKey::new(src.clone(), vec![wl.clone()], ip, dst);
    assert_ne!(wide, narrow);
    // Order and duplicates do not matter.
    let same = PoolKey::new(src, vec![svc, wl.clone(), wl], ip, dst);
    assert_eq!(wide, same);
    assert_eq!(wide.dst_ids.len(), 2);
}

#[tokio::test]
async fn refused_tcp_is_a_tcp_failure() {
    let n = Net(8);
    let (a, hooks) = node_a(n, &testkit::identity());
    // Nothing listens on the echo workload's HBONE port.
    let e = a
        .establish_outbound(n.client(), n.echo(), None)
        .await
        .err()
        .unwrap();
    assert!(
        matches!(
            e,
            OutboundError::Connect {
                kind: ConnectFailure::Tcp,
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(last_close(&hooks).response_flags, "CONNECT");
    assert_eq!(failed(&a, "connect"), 1);
}

#[tokio::test]
async fn a_peer_that_is_not_tls_is_a_tls_failure() {
    let n = Net(9);
    let (a, hooks) = node_a(n, &testkit::identity());
    let lis = tokio::net::TcpListener::bind(n.hbone()).await.unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = lis.accept().await {
            let _ = s.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n").await;
        }
    });
    let e = a
        .establish_outbound(n.client(), n.echo(), None)
        .await
        .err()
        .unwrap();
    assert!(
        matches!(
            e,
            OutboundError::Connect {
                kind: ConnectFailure::Tls,
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(last_close(&hooks).response_flags, "TLS_FAILURE");
}

#[tokio::test]
async fn a_peer_with_another_identity_is_a_tls_failure() {
    let n = Net(10);
    let id = testkit::identity();
    // Node B's mesh file gives the echo workload another service account: it presents that identity.
    let _b = node_b(n, &id, "impostor").await;
    let (a, hooks) = node_a(n, &id);
    let e = a
        .establish_outbound(n.client(), n.echo(), None)
        .await
        .err()
        .unwrap();
    assert!(
        matches!(
            e,
            OutboundError::Connect {
                kind: ConnectFailure::Tls,
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(last_close(&hooks).response_flags, "TLS_FAILURE");
    assert_eq!(a.pool().connections(), 0);
}

#[tokio::test]
async fn a_silent_peer_times_out() {
    let n = Net(11);
    let id = testkit::identity();
    let (a, hooks) = node_a(n, &id);
    // The certificate is issued before the clock is paused (signing is real work, not waiting).
    id.fetch(
        &"spiffe://cluster.local/ns/default/sa/client"
            .parse()
            .unwrap(),
    )
    .await
    .unwrap();
    // Accepts TCP, never answers the TLS handshake.
    let lis = tokio::net::TcpListener::bind(n.hbone()).await.unwrap();
    let held = tokio::spawn(async move {
        let mut conns = Vec::new();
        while let Ok((s, _)) = lis.accept().await {
            conns.push(s);
        }
    });
    tokio::time::pause();
    let e = a
        .establish_outbound(n.client(), n.echo(), None)
        .await
        .err()
        .unwrap();
    assert!(
        matches!(
            e,
            OutboundError::Connect {
                kind: ConnectFailure::Timeout,
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(last_close(&hooks).response_flags, "CONNECT");
    held.abort();
}

/// A NAMESPACE service is a service only to clients of its own namespace: from another namespace its VIP is no
/// service (as in ztunnel), so the connection goes to the VIP as dialled instead of to the service's endpoint.
#[tokio::test]
async fn a_namespace_service_vip_is_no_service_from_another_namespace() {
    let n = Net(12);
    let own_client = SocketAddr::from((n.ip(2), 40_000));
    let endpoint = SocketAddr::from((n.ip(21), 8080));
    let vip = SocketAddr::from((n.ip(101), 8080));
    testkit::echo(endpoint).await;
    // Stands in for whatever answers at the VIP outside the mesh.
    testkit::echo(vip).await;
    let mesh = format!(
        r#"workloads:
- uid: Kubernetes//Pod/default/client
  name: client
  namespace: default
  workloadIps: [{client}]
  node: node-a
- uid: Kubernetes//Pod/legacy/client
  name: client
  namespace: legacy
  workloadIps: [{own_client}]
  node: node-a
- uid: Kubernetes//Pod/legacy/store
  name: store
  namespace: legacy
  workloadIps: [{endpoint}]
  protocol: TCP
  node: node-b
  services:
    legacy/store.legacy.svc.cluster.local: {{8080: 8080}}
services:
- name: store
  namespace: legacy
  hostname: store.legacy.svc.cluster.local
  vips: ["/{vip}"]
  ports: {{8080: 8080}}
  visibility: Namespace
"#,
        client = n.client().ip(),
        own_client = own_client.ip(),
        endpoint = endpoint.ip(),
        vip = vip.ip(),
    );
    let a = testkit::inner(
        testkit::config("node-a", HBONE_PORT),
        testkit::state(&mesh),
        testkit::identity(),
        Arc::new(Recorder::default()),
    );
    let est = a.establish_outbound(own_client, vip, None).await.unwrap();
    assert!(matches!(&est.upstream, Upstream::Tcp(s) if s.peer_addr().unwrap() == endpoint));
    assert_eq!(
        est.record.dst_service.as_deref(),
        Some("legacy/store.legacy.svc.cluster.local")
    );
    round_trip(&a, est, b"from its own namespace").await;
    let est = a.establish_outbound(n.client(), vip, None).await.unwrap();
    assert!(matches!(&est.upstream, Upstream::Tcp(s) if s.peer_addr().unwrap() == vip));
    assert!(est.record.dst_service.is_none() && est.record.dst_workload.is_none());
    round_trip(&a, est, b"from another namespace").await;
}

/// What a long-lived connection's task holds is the relay, not its setup: resolving, policy and the HBONE connect
/// run boxed, so the captured-connection future is smaller than the setup future it awaits (inline, it would be at
/// least as large). And it holds the relay once: no layer keeps its arguments twice (as an `async fn` does) or
/// stores the two directions twice (as an `async` block that pins what it captured does); either made it over
/// 3 KiB, where it is now about 1.4 KiB.
#[tokio::test]
async fn a_captured_connection_holds_its_setup_only_while_it_runs() {
    let n = Net(40);
    let identity = testkit::identity();
    let (inner, _) = node_a(n, &identity);
    let (_peer, ours) = testkit::tcp_pair().await;
    let setup = inner.establish_outbound(n.client(), n.echo(), None);
    let setup_size = std::mem::size_of_val(&setup);
    drop(setup);
    let whole = inner.clone().handle_captured(ours, n.client());
    let whole_size = std::mem::size_of_val(&whole);
    assert!(
        whole_size < setup_size,
        "a captured connection's future is {whole_size} bytes, its setup's {setup_size}: the setup is held inline \
         for the connection's whole life"
    );
    assert!(
        whole_size <= MAX_CAPTURED_FUTURE,
        "a captured connection's future is {whole_size} bytes (at most {MAX_CAPTURED_FUTURE}): something in it is \
         held twice"
    );
}

/// A SOCKS5 client's connection is held the same way: its setup runs boxed and the relay is held once (about
/// 1.6 KiB in a debug build; the relay held twice, or the setup inline, would take it past 3 KiB).
#[tokio::test]
async fn a_socks5_connection_is_held_as_small_as_a_captured_one() {
    let n = Net(41);
    let identity = testkit::identity();
    let (inner, _) = node_a(n, &identity);
    let (_peer, ours) = testkit::tcp_pair().await;
    let whole = inner.clone().handle_socks5(ours, n.client());
    let whole_size = std::mem::size_of_val(&whole);
    assert!(
        whole_size <= MAX_CAPTURED_FUTURE,
        "a SOCKS5 connection's future is {whole_size} bytes (at most {MAX_CAPTURED_FUTURE}): something in it is \
         held twice"
    );
}

/// The most a captured connection's future may take (see above).
const MAX_CAPTURED_FUTURE: usize = 2048;
