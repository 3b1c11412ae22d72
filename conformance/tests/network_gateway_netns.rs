//! Double HBONE through a network gateway across two real networks (see `weft_conformance::gatewaymesh`): node A on
//! net1 and node B on net2 are separate network namespaces that share no link and no route, and the gateway's
//! namespace, on both links, does not forward IP. An unmodified client in A's namespace dials the echo service's VIP
//! (its only endpoint is on B); capture hands it to weft, which opens HBONE to net2's gateway (a weft-hbone stand-in
//! with the gateway's identity, on its net1 address) and inside it a second mutual-TLS HBONE that the gateway
//! relays, from its net2 address, to node B. Needs root.
#![allow(clippy::unwrap_used)] // a test panics to fail

use std::collections::HashMap;
use std::io::ErrorKind;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use weft_conformance::gatewaymesh::{GatewayMesh, TwoNetworks};
use weft_conformance::netmesh::connect;
use weft_conformance::waypoint::{Route, WaypointStandIn};
use weft_conformance::{eventually, metric_sum};
use weft_devmesh::workload;
use weft_identity::SpiffeId;

const CLIENT_ID: &str = "spiffe://cluster.local/ns/default/sa/client";
const AUTHORITY: &str = "echo.default.svc.cluster.local:80";

fn yaml(n: TwoNetworks, gateway: &str) -> String {
    format!(
        r#"workloads:
- uid: Kubernetes//Pod/default/client
  name: client
  namespace: default
  serviceAccount: client
  workloadIps: [{client}]
  protocol: HBONE
  node: node-a
  network: net1
- uid: Kubernetes//Pod/default/echo
  name: echo
  namespace: default
  serviceAccount: echo
  workloadIps: [{echo}]
  protocol: HBONE
  node: node-b
  network: net2
  {gateway}
  services: {{default/echo.default.svc.cluster.local: {{80: 8080}}}}
- uid: Kubernetes//Pod/istio-system/eastwest
  name: eastwest
  namespace: istio-system
  serviceAccount: eastwest
  workloadIps: [{gw}]
  protocol: HBONE
  node: gateway-node
  network: net2
services:
- name: echo
  namespace: default
  hostname: echo.default.svc.cluster.local
  vips: ["/{vip}"]
  ports: {{80: 8080}}
  subjectAltNames: [spiffe://cluster.local/ns/default/sa/echo]
"#,
        client = n.client(),
        echo = n.server(),
        gw = n.gateway_net1(),
        vip = n.vip(),
    )
}

fn network_gateway(n: TwoNetworks) -> String {
    format!(
        "networkGateway: {{destination: \"net2/{}\", hboneMtlsPort: 15008}}",
        n.gateway_net1()
    )
}

/// One round trip from an unmodified client in node A's namespace (captured to weft); empty if weft closed it.
async fn client_round_trip(mesh: &GatewayMesh, dst: SocketAddr, payload: &[u8]) -> Vec<u8> {
    let payload = payload.to_vec();
    mesh.ns_a
        .within(
            move || async move { workload::round_trip(connect(dst, false).await?, &payload).await },
        )
        .await
        .unwrap()
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_on_net1_reaches_a_service_on_net2_only_through_the_gateway() {
    let n = TwoNetworks { net: 251 };
    let mesh = GatewayMesh::start("n", n, &yaml(n, &network_gateway(n)), "info")
        .await
        .expect("network namespaces (needs root)");
    let gw_id: SpiffeId = "spiffe://cluster.local/ns/istio-system/sa/eastwest"
        .parse()
        .unwrap();
    let gateway = WaypointStandIn::start_in(
        &mesh.ns_gw,
        IpAddr::V4(n.gateway_net1()),
        IpAddr::V4(n.gateway_net2()),
        &mesh.ca_dir(),
        gw_id,
        HashMap::from([(
            AUTHORITY.to_owned(),
            Route::Raw(SocketAddr::from((n.server(), 15008))),
        )]),
    )
    .await
    .unwrap();

    // Control: the networks are separate. A has no route to B (even past capture), and the gateway forwards nothing.
    let direct = SocketAddr::from((n.server(), 8080));
    let err = mesh
        .ns_a
        .within(move || async move { connect(direct, true).await.map(|_| ()) })
        .await
        .unwrap()
        .expect_err("node A must not reach node B directly");
    assert_eq!(err.kind(), ErrorKind::NetworkUnreachable, "{err}");
    assert_eq!(
        mesh.ns_gw
            .output("sysctl", &["-n", "net.ipv4.ip_forward"])
            .unwrap(),
        "0"
    );

    // Through weft and the gateway: each connection a new inner tunnel inside the (pooled) outer one.
    let vip = SocketAddr::from((n.vip(), 80));
    for payload in [&b"first"[..], &b"second, a new inner tunnel"[..]] {
        let back = client_round_trip(&mesh, vip, payload).await;
        assert_eq!(
            back,
            payload,
            "round trip through the gateway failed; node A: {}\nnode B: {}",
            mesh.a.log_tail(8),
            mesh.b.log_tail(8)
        );
    }
    let seen = gateway.seen();
    assert_eq!(seen.len(), 2, "{seen:?}");
    for s in &seen {
        assert_eq!(s.authority, AUTHORITY, "the outer tunnel names the service");
        assert_eq!(
            s.peer_identity, CLIENT_ID,
            "the gateway verified the client's node"
        );
        assert_eq!(s.peer.ip(), IpAddr::V4(n.client()), "from net1: {s:?}");
        let fwd = s.forwarded.as_deref().unwrap_or_default();
        assert!(
            fwd.starts_with(&format!("for=\"{}:", n.client()))
                && fwd.ends_with(";host=echo.default.svc.cluster.local"),
            "the client's own address and the service: {s:?}"
        );
    }
    let outbound = eventually(
        Duration::from_secs(30),
        "node A's outbound logs",
        || async {
            let l: Vec<_> = mesh
                .a
                .access_logs()
                .into_iter()
                .filter(|l| l["direction"] == "outbound")
                .collect();
            (l.len() >= 2).then_some(l)
        },
    )
    .await;
    for l in &outbound {
        assert_eq!(
            l["dst.hbone_addr"],
            format!("{}:15008", n.gateway_net1()),
            "node A dialled the gateway: {l}"
        );
        assert_eq!(
            l["dst.service"], "default/echo.default.svc.cluster.local",
            "{l}"
        );
    }
    let inbound = eventually(Duration::from_secs(30), "node B's inbound logs", || async {
        let l: Vec<_> = mesh
            .b
            .access_logs()
            .into_iter()
            .filter(|l| l["direction"] == "inbound")
            .collect();
        (l.len() >= 2).then_some(l)
    })
    .await;
    for l in &inbound {
        assert_eq!(
            l["src.identity"], CLIENT_ID,
            "the inner TLS is the client's, end to end: {l}"
        );
        assert_eq!(
            l["src.addr"].as_str().unwrap().split(':').next().unwrap(),
            n.gateway_net2().to_string(),
            "node B is reached from the gateway's net2 address: {l}"
        );
        assert!(
            l.get("src.workload").is_none(),
            "a source on another network is not looked up: {l}"
        );
        assert_eq!(
            l["dst.service"], "default/echo.default.svc.cluster.local",
            "{l}"
        );
        assert_eq!(l["dst.addr"], format!("{}:8080", n.server()), "{l}");
    }
    let m = mesh.b.scrape().await.unwrap();
    assert!(
        metric_sum(
            &m,
            "weft_connections_opened_total{direction=\"inbound\",transport=\"hbone\"}"
        ) >= 2.0,
        "{m}"
    );

    // Without the network gateway the endpoint on net2 is refused, never dialled.
    weft_conformance::edit_mesh_file(&mesh.a, &mesh.config_path(), &yaml(n, "")).await;
    assert_eq!(client_round_trip(&mesh, vip, b"x").await, b"");
    eventually(
        Duration::from_secs(30),
        "node A's log names the missing gateway",
        || async {
            mesh.a
                .log_lines()
                .iter()
                .any(|l| l.to_string().contains("has no network gateway"))
                .then_some(())
        },
    )
    .await;
    assert_eq!(gateway.seen().len(), 2, "the gateway was not dialled again");
    assert_eq!(
        mesh.b
            .access_logs()
            .iter()
            .filter(|l| l["direction"] == "inbound")
            .count(),
        inbound.len(),
        "node B saw nothing more"
    );
}
