//! Double HBONE through a network gateway with real weft processes: node A's client (network net1) reaches the echo
//! service whose endpoint is on node B in network net2. Node A opens HBONE to net2's gateway (a weft-hbone
//! stand-in with the gateway's identity, which forwards the tunnel's bytes to the remote node) with the service
//! `hostname:port` as the authority, and inside it a second mutual-TLS HBONE to the endpoint's node: node B sees the
//! client's own identity, from the gateway's address, for the service by hostname.
#![allow(clippy::unwrap_used)] // a test panics to fail

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use weft_conformance::waypoint::{Route, WaypointStandIn};
use weft_conformance::{Addrs, Mesh, eventually};
use weft_devmesh::{socks5, workload};
use weft_identity::SpiffeId;

fn gateway_ip(a: Addrs) -> Ipv4Addr {
    Ipv4Addr::new(127, 0, a.n, 60)
}

fn yaml(a: Addrs, gateway: &str) -> String {
    format!(
        r#"workloads:
- uid: client
  name: client
  namespace: default
  serviceAccount: client
  workloadIps: [{client}]
  protocol: HBONE
  node: node-a
  network: net1
- uid: echo
  name: echo
  namespace: default
  serviceAccount: echo
  workloadIps: [{echo}]
  protocol: HBONE
  node: node-b
  network: net2
  {gateway}
  services: {{default/echo.default.svc.cluster.local: {{80: 8080}}}}
- uid: eastwest
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
        client = a.client(),
        echo = a.echo(),
        gw = gateway_ip(a),
        vip = a.vip(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_on_another_network_is_reached_by_hbone_inside_hbone() {
    let a = Addrs { n: 204 };
    let gw = format!(
        "networkGateway: {{destination: \"net2/{}\", hboneMtlsPort: 15008}}",
        gateway_ip(a)
    );
    let text = yaml(a, &gw);
    let mesh = Mesh::start(a, &text, &text).await.unwrap();
    let authority = "echo.default.svc.cluster.local:80";
    let routes = HashMap::from([(
        authority.to_owned(),
        Route::Raw(SocketAddr::from((a.echo(), 15008))),
    )]);
    let gw_id: SpiffeId = "spiffe://cluster.local/ns/istio-system/sa/eastwest"
        .parse()
        .unwrap();
    let gateway = WaypointStandIn::start(IpAddr::V4(gateway_ip(a)), &mesh.ca_dir(), gw_id, routes)
        .await
        .unwrap();
    let vip = SocketAddr::from((a.vip(), 80));
    let client = IpAddr::V4(a.client());
    for payload in [&b"first"[..], &b"second, a new inner tunnel"[..]] {
        let s = socks5::connect(mesh.a.socks5, Some(client), vip)
            .await
            .unwrap();
        assert_eq!(workload::round_trip(s, payload).await.unwrap(), payload);
    }
    let seen = gateway.seen();
    assert_eq!(seen.len(), 2, "{seen:?}");
    for s in &seen {
        assert_eq!(s.authority, authority, "the outer tunnel names the service");
        assert_eq!(
            s.peer_identity, "spiffe://cluster.local/ns/default/sa/client",
            "the gateway verified the client's node"
        );
    }
    let logs = eventually(Duration::from_secs(30), "node B's inbound logs", || async {
        let l: Vec<_> = mesh
            .b
            .access_logs()
            .into_iter()
            .filter(|l| l["direction"] == "inbound")
            .collect();
        (l.len() >= 2).then_some(l)
    })
    .await;
    for l in &logs {
        assert_eq!(
            l["src.identity"], "spiffe://cluster.local/ns/default/sa/client",
            "the inner TLS is the client's, end to end: {l}"
        );
        assert_eq!(
            l["src.addr"].as_str().unwrap().split(':').next().unwrap(),
            gateway_ip(a).to_string(),
            "{l}"
        );
        assert!(
            l.get("src.workload").is_none(),
            "a source on another network is not looked up: {l}"
        );
        assert_eq!(
            l["dst.service"], "default/echo.default.svc.cluster.local",
            "{l}"
        );
        assert_eq!(l["dst.addr"], format!("{}:8080", a.echo()), "{l}");
    }
    // Without a network gateway the remote endpoint is refused, never dialled across networks.
    let v0 = mesh.a.config_dump().await.unwrap()["version"]
        .as_u64()
        .unwrap();
    weft_conformance::replace_file(&mesh.config_a, yaml(a, "")).unwrap();
    eventually(
        Duration::from_secs(30),
        "node A applies the edit",
        || async {
            let v = mesh.a.config_dump().await.ok()?["version"].as_u64()?;
            (v > v0).then_some(())
        },
    )
    .await;
    let refused = match socks5::connect(mesh.a.socks5, Some(client), vip).await {
        Err(_) => true,
        Ok(s) => workload::round_trip(s, b"x")
            .await
            .map(|b| b.is_empty())
            .unwrap_or(true),
    };
    assert!(refused);
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
    assert_eq!(gateway.seen().len(), 2);
}

/// The echo service's waypoint is on network net2 (behind its gateway): node A opens HBONE to the gateway and,
/// inside it, HBONE to the waypoint (which must prove the waypoint's identity); the waypoint takes it on to echo.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_waypoint_on_another_network_is_reached_through_the_gateway() {
    let a = Addrs { n: 206 };
    let wp_ip = Ipv4Addr::new(127, 0, a.n, 70);
    let text = yaml(a, "").replace(
        "  subjectAltNames: [spiffe://cluster.local/ns/default/sa/echo]\n",
        "  subjectAltNames: [spiffe://cluster.local/ns/default/sa/echo]\n  waypoint: {destination: default/waypoint.default.svc.cluster.local}\n",
    ) + &format!(
        r#"- name: waypoint
  namespace: default
  hostname: waypoint.default.svc.cluster.local
  vips: ["/127.10.{n}.70"]
  ports: {{15008: 15008}}
"#,
        n = a.n
    );
    let text = text.replace(
        "services:\n- name: echo",
        &format!(
            r#"- uid: waypoint
  name: waypoint
  namespace: default
  serviceAccount: waypoint
  workloadIps: [{wp_ip}]
  protocol: HBONE
  node: waypoint-node
  network: net2
  networkGateway: {{destination: "net2/{gw}", hboneMtlsPort: 15008}}
  services: {{default/waypoint.default.svc.cluster.local: {{15008: 15008}}}}
services:
- name: echo"#,
            gw = gateway_ip(a)
        ),
    );
    let mesh = Mesh::start(a, &text, &text).await.unwrap();
    let authority = "echo.default.svc.cluster.local:80";
    let id = |ns: &str, sa: &str| -> SpiffeId {
        format!("spiffe://cluster.local/ns/{ns}/sa/{sa}")
            .parse()
            .unwrap()
    };
    let gateway = WaypointStandIn::start(
        IpAddr::V4(gateway_ip(a)),
        &mesh.ca_dir(),
        id("istio-system", "eastwest"),
        HashMap::from([(
            authority.to_owned(),
            Route::Raw(SocketAddr::from((wp_ip, 15008))),
        )]),
    )
    .await
    .unwrap();
    let waypoint = WaypointStandIn::start(
        IpAddr::V4(wp_ip),
        &mesh.ca_dir(),
        id("default", "waypoint"),
        HashMap::from([(
            authority.to_owned(),
            Route::Hbone(SocketAddr::from((a.echo(), 8080)), id("default", "echo")),
        )]),
    )
    .await
    .unwrap();
    let s = socks5::connect(
        mesh.a.socks5,
        Some(IpAddr::V4(a.client())),
        SocketAddr::from((a.vip(), 80)),
    )
    .await
    .unwrap_or_else(|e| panic!("{e:?}: {}", mesh.a.log_tail(6)));
    assert_eq!(
        workload::round_trip(s, b"across networks via the waypoint")
            .await
            .unwrap(),
        b"across networks via the waypoint"
    );
    let (outer, inner) = (gateway.seen(), waypoint.seen());
    assert_eq!(outer.len(), 1, "{outer:?}");
    assert_eq!(outer[0].authority, authority);
    assert_eq!(inner.len(), 1, "{inner:?}");
    assert_eq!(
        inner[0].authority, authority,
        "the inner tunnel names the service too"
    );
    assert_eq!(
        inner[0].peer_identity, "spiffe://cluster.local/ns/default/sa/client",
        "the waypoint verified the client itself through the gateway"
    );
    assert_eq!(inner[0].peer.ip(), IpAddr::V4(gateway_ip(a)));
}

/// One HBONE CONNECT to node B's echo workload from the client's address, with the client's certificate and
/// `x-forwarded-network: <network>`, relaying `payload` back and forth.
async fn connect_from_network(mesh: &Mesh, network: &str, payload: &[u8]) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let a = mesh.addrs;
    let ca = weft_identity::LocalCa::from_dir(&mesh.ca_dir()).unwrap();
    let certs = weft_identity::SecretManager::new(
        std::sync::Arc::new(ca),
        weft_identity::ManagerConfig::default(),
    );
    let client_id: SpiffeId = "spiffe://cluster.local/ns/default/sa/client"
        .parse()
        .unwrap();
    let cert = certs.fetch(&client_id).await.unwrap();
    let hbone = SocketAddr::from((a.echo(), 15008));
    let echo_id: SpiffeId = "spiffe://cluster.local/ns/default/sa/echo".parse().unwrap();
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.bind(SocketAddr::new(IpAddr::V4(a.client()), 0))
        .unwrap();
    let tcp = sock.connect(hbone).await.unwrap();
    let tls = tokio_rustls::TlsConnector::from(cert.client_config(vec![echo_id]).unwrap())
        .connect(
            rustls::pki_types::ServerName::IpAddress(hbone.ip().into()),
            tcp,
        )
        .await
        .unwrap();
    let c = weft_hbone::handshake(tls, &weft_hbone::H2Config::default())
        .await
        .unwrap();
    let mut headers = http::HeaderMap::new();
    headers.insert(
        "x-forwarded-network",
        http::HeaderValue::from_str(network).unwrap(),
    );
    let req = weft_hbone::ConnectRequest {
        authority: format!("{}:8080", a.echo()),
        headers,
        early_data: Default::default(),
    };
    let (mut s, _) = c.connect(req).await.unwrap();
    s.write_all(payload).await.unwrap();
    let mut back = vec![0; payload.len()];
    s.read_exact(&mut back).await.unwrap();
    assert_eq!(back, payload);
    s.shutdown().await.unwrap();
}

/// The node's own network is `--network` (ztunnel's `NETWORK`), as ztunnel takes it (`src/proxy/inbound.rs`
/// `from_gateway`, github.com/istio/ztunnel at 62d826530e5ce85764e309170205b293efcbc80b): a tunnel whose
/// `x-forwarded-network` names it is from this network, so its source workload is looked up; one naming another
/// network came through that network's gateway, and its source is not looked up. The workloads name no network.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_nodes_network_tells_a_tunnel_from_another_network() {
    let a = Addrs { n: 94 };
    let text = weft_conformance::mesh_yaml(a, "echo");
    let mesh = Mesh::start_with(a, &text, &text, |o| {
        o.extra.extend(["--network".into(), "net-b".into()]);
    })
    .await
    .unwrap();
    for (network, payload) in [("net-b", &b"same network"[..]), ("net-a", &b"other"[..])] {
        connect_from_network(&mesh, network, payload).await;
        let l = eventually(Duration::from_secs(30), "node B's access line", || async {
            mesh.b
                .access_logs()
                .into_iter()
                .find(|l| l["bytes_sent"] == payload.len())
        })
        .await;
        assert_eq!(l["direction"], "inbound", "{l}");
        if network == "net-b" {
            assert_eq!(l["src.workload"], "client", "from this node's network: {l}");
        } else {
            assert!(l.get("src.workload").is_none(), "from another network: {l}");
        }
    }
}
