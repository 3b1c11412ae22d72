//! Waypoints on the data path: outbound hands service traffic to the service's waypoint (after transport policy),
//! and a real data path hosting the waypoint workload accepts the sandwich CONNECT (authority = the service VIP it
//! is the waypoint of) and refuses one for something whose waypoint it is not.
#![allow(clippy::unwrap_used)] // test code: a panic fails the test

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use weft_identity::SecretManager;

use super::*;
use crate::testkit::{self, Recorder};
use crate::{InboundBind, Proxy, ProxyMetrics};

const HBONE_PORT: u16 = 15008;

fn ip(t: u8, last: u8) -> Ipv4Addr {
    Ipv4Addr::new(127, 78, t, last)
}

/// Client on node A; a waypoint workload (.50) on node wp; the echo service (VIP .100:80, endpoint .11 on node b),
/// whose waypoint is the waypoint workload when `svc_waypoint`.
fn yaml(t: u8, svc_waypoint: bool) -> String {
    let wp = if svc_waypoint {
        format!("waypoint: {{destination: \"/{}\"}}", ip(t, 50))
    } else {
        String::new()
    };
    format!(
        r#"workloads:
- {{uid: client, name: client, namespace: default, serviceAccount: client, workloadIps: [{client}], protocol: HBONE, node: node-a}}
- uid: echo
  namespace: default
  serviceAccount: echo
  workloadIps: [{echo}]
  protocol: HBONE
  node: node-b
  services: {{default/echo.default.svc.cluster.local: {{80: 8080}}}}
- {{uid: waypoint, name: waypoint, namespace: default, serviceAccount: waypoint, workloadIps: [{wp_ip}], protocol: HBONE, node: node-wp}}
services:
- name: echo
  namespace: default
  hostname: echo.default.svc.cluster.local
  vips: ["/{vip}"]
  ports: {{80: 8080}}
  {wp}
"#,
        client = ip(t, 1),
        echo = ip(t, 11),
        wp_ip = ip(t, 50),
        vip = ip(t, 100),
    )
}

fn node_a(t: u8, identity: &Arc<SecretManager>) -> (Arc<Inner>, Arc<Recorder>) {
    let hooks = Arc::new(Recorder::default());
    let inner = testkit::inner(
        testkit::config("node-a", HBONE_PORT),
        testkit::state(&yaml(t, true)),
        identity.clone(),
        hooks.clone(),
    );
    (inner, hooks)
}

/// The waypoint's node: a real data path serving HBONE on the waypoint workload's address; the waypoint
/// "application" is an echo server on the service port (80) of its own address.
async fn node_wp(t: u8, identity: &Arc<SecretManager>, knows_waypoint: bool) -> Arc<Proxy> {
    testkit::echo(SocketAddr::from((ip(t, 50), 80))).await;
    let mut cfg = testkit::config("node-wp", HBONE_PORT);
    cfg.inbound = InboundBind::Addr(SocketAddr::from((ip(t, 50), HBONE_PORT)));
    Proxy::start(
        cfg,
        testkit::state(&yaml(t, knows_waypoint)),
        identity.clone(),
        Arc::new(Recorder::default()),
        Arc::new(ProxyMetrics::default()),
    )
    .await
    .unwrap()
}

fn client(t: u8) -> SocketAddr {
    SocketAddr::from((ip(t, 1), 40_000))
}

fn vip(t: u8) -> SocketAddr {
    SocketAddr::from((ip(t, 100), 80))
}

#[tokio::test]
async fn transport_policy_runs_before_the_waypoint_sees_anything() {
    let t = 1;
    let (a, hooks) = node_a(t, &testkit::identity());
    let accepted = Arc::new(AtomicUsize::new(0));
    let lis = tokio::net::TcpListener::bind((ip(t, 50), HBONE_PORT))
        .await
        .unwrap();
    let count = accepted.clone();
    tokio::spawn(async move {
        while lis.accept().await.is_ok() {
            count.fetch_add(1, Ordering::SeqCst);
        }
    });
    hooks.deny_when(|r| {
        r.dst_service.as_deref() == Some("default/echo.default.svc.cluster.local")
            && r.dst == vip(1)
            && r.hbone
    });
    let e = a
        .establish_outbound(client(t), vip(t), None)
        .await
        .err()
        .unwrap();
    assert!(
        matches!(&e, OutboundError::Denied { by, .. } if by == "test"),
        "{e}"
    );
    assert_eq!(a.pool().created_total(), 0);
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        0,
        "nothing reached the waypoint"
    );
}

#[tokio::test]
async fn the_waypoints_node_accepts_the_sandwich_connect_for_its_service() {
    let t = 2;
    let identity = testkit::identity();
    let _wp = node_wp(t, &identity, true).await;
    let (a, hooks) = node_a(t, &identity);
    let est = a.establish_outbound(client(t), vip(t), None).await.unwrap();
    let Upstream::Hbone(_, hbone) = &est.upstream else {
        panic!("a waypoint is reached over HBONE");
    };
    assert_eq!(*hbone, SocketAddr::from((ip(t, 50), HBONE_PORT)));
    assert!(
        est.record.dst_workload.is_none(),
        "the waypoint picks the endpoint"
    );
    // Relay: the waypoint application (echo on its own address, the VIP's port) answers.
    let lis = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut app = tokio::net::TcpStream::connect(lis.local_addr().unwrap())
        .await
        .unwrap();
    let (proxy_side, _) = lis.accept().await.unwrap();
    let me = a.clone();
    let relay = tokio::spawn(async move { me.run_outbound(proxy_side, est).await });
    app.write_all(b"sandwich").await.unwrap();
    app.shutdown().await.unwrap();
    let mut back = Vec::new();
    app.read_to_end(&mut back).await.unwrap();
    assert_eq!(back, b"sandwich");
    relay.await.unwrap();
    assert!(last_error(&hooks).is_none());
}

#[tokio::test]
async fn the_waypoints_node_refuses_a_connect_for_what_it_is_not_the_waypoint_of() {
    let t = 3;
    let identity = testkit::identity();
    // The waypoint's node does not know the service uses it: the authority (the VIP) is not its workload's.
    let _wp = node_wp(t, &identity, false).await;
    let (a, _) = node_a(t, &identity);
    let e = a
        .establish_outbound(client(t), vip(t), None)
        .await
        .err()
        .unwrap();
    assert!(
        matches!(
            &e,
            OutboundError::Connect {
                kind: ConnectFailure::Tunnel,
                ..
            }
        ) && e.to_string().contains("400"),
        "{e}"
    );
}

fn last_error(hooks: &Recorder) -> Option<String> {
    hooks.closes().pop().and_then(|(_, c)| c.error)
}
