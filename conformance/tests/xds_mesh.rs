//! The mesh over xDS, end to end: real `weft run` processes without a config file learn workloads, services and
//! policies from a real `weft-control` (or, for what a real control plane never sends, a scripted Delta ADS
//! server) over TLS, with traffic through the nodes checked at every step.
#![allow(clippy::unwrap_used)] // a test panics to fail

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use tokio::io::AsyncReadExt as _;
use weft_conformance::xdsmesh::{
    XdsMesh, echo_once, has_workload, mesh_source, ping, until_dump, xds_flags,
};
use weft_conformance::{Addrs, eventually, mesh_yaml};
use weft_devmesh::{NodeOptions, NodeProcess, socks5, workload};

/// A second echo workload on node B, behind its own service VIP.
fn echo2(a: Addrs) -> (Ipv4Addr, Ipv4Addr) {
    (
        Ipv4Addr::new(127, 0, a.n + 1, 3),
        Ipv4Addr::new(127, 10, a.n, 2),
    )
}

/// The standard mesh plus, if `with_echo2`, workload `echo-2` and service `echo2`; plus `policies`.
fn mesh_text(a: Addrs, with_echo2: bool, policies: &str) -> String {
    let base = mesh_yaml(a, "echo");
    let (ip, vip) = echo2(a);
    let base = if with_echo2 {
        base.replace(
            "services:\n- name: echo\n",
            &format!(
                "- uid: Kubernetes//Pod/default/echo-2\n  name: echo-2\n  namespace: default\n  serviceAccount: echo\n  \
                 workloadIps: [{ip}]\n  protocol: HBONE\n  node: node-b\n  services:\n    \
                 default/echo2.default.svc.cluster.local: {{80: 8080}}\n\
                 services:\n- name: echo2\n  namespace: default\n  hostname: echo2.default.svc.cluster.local\n  \
                 vips: [\"/{vip}\"]\n  ports: {{80: 8080}}\n- name: echo\n"
            ),
        )
    } else {
        base
    };
    format!("{base}{policies}")
}

fn deny_client() -> &'static str {
    "policies:\n- name: deny-client\n  namespace: default\n  scope: Namespace\n  action: Deny\n  rules:\n  \
     - - - principals: [!Exact cluster.local/ns/default/sa/client]\n"
}

async fn open(node: &NodeProcess, a: Addrs, dst: SocketAddr) -> tokio::net::TcpStream {
    let mut s = socks5::connect(node.socks5, Some(IpAddr::V4(a.client())), dst)
        .await
        .unwrap();
    ping(&mut s).await.unwrap();
    s
}

fn all_echo_ips(a: Addrs) -> Vec<IpAddr> {
    vec![
        IpAddr::V4(a.echo()),
        IpAddr::V4(a.legacy()),
        IpAddr::V4(echo2(a).0),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn initial_sync_then_an_added_workload_is_reachable_and_a_removed_one_is_not() {
    let a = Addrs { n: 160 };
    let mesh = XdsMesh::start(a, &mesh_text(a, false, ""), &all_echo_ips(a))
        .await
        .unwrap();
    // Ready means synced: the source's state is in /config_dump, and traffic flows at once.
    for node in [&mesh.a, &mesh.b] {
        let src = mesh_source(node).await.unwrap();
        assert_eq!(src["connected"], true, "{src}");
        assert_eq!(src["synced"], true, "{src}");
        assert_eq!(src["held"]["workloads"], 3, "{src}");
        assert_eq!(src["held"]["services"], 1, "{src}");
        for t in src["types"].as_array().unwrap() {
            assert!(t["acks"].as_u64().unwrap() >= 1, "{t}");
            assert_eq!(t["nacks"], 0, "{t}");
        }
        assert!(
            src["nodeId"]
                .as_str()
                .unwrap()
                .starts_with("ztunnel~1.1.1.1~weft-node-"),
            "{src}"
        );
    }
    let d = mesh.a.config_dump().await.unwrap();
    assert_eq!(d["config"]["loaded"], true, "{d}");
    echo_once(&mesh.a, a, SocketAddr::from((a.vip(), 80)))
        .await
        .unwrap();
    let (ip2, vip2) = echo2(a);
    assert!(
        echo_once(&mesh.a, a, SocketAddr::from((vip2, 80)))
            .await
            .is_err(),
        "echo2's VIP is not in the mesh yet"
    );

    // Added: both nodes learn it (node B opens its HBONE listener), and it is reached over HBONE.
    mesh.write_mesh(&mesh_text(a, true, ""));
    for node in [&mesh.a, &mesh.b] {
        until_dump(node, "echo-2 on both nodes", |d| {
            has_workload(d, "Kubernetes//Pod/default/echo-2")
        })
        .await;
    }
    eventually(Duration::from_secs(30), "echo2 reachable", || async {
        echo_once(&mesh.a, a, SocketAddr::from((vip2, 80)))
            .await
            .ok()
    })
    .await;
    let inbound = eventually(
        Duration::from_secs(30),
        "node B's log of echo-2",
        || async {
            mesh.b
                .access_logs()
                .into_iter()
                .find(|l| l["dst.addr"] == format!("{ip2}:8080"))
        },
    )
    .await;
    assert_eq!(
        inbound["src.identity"], "spiffe://cluster.local/ns/default/sa/client",
        "{inbound}"
    );

    // Removed: gone from both nodes, and its VIP no longer leads anywhere.
    mesh.write_mesh(&mesh_text(a, false, ""));
    for node in [&mesh.a, &mesh.b] {
        until_dump(node, "echo-2 gone", |d| {
            !has_workload(d, "Kubernetes//Pod/default/echo-2")
        })
        .await;
    }
    assert!(
        echo_once(&mesh.a, a, SocketAddr::from((vip2, 80)))
            .await
            .is_err(),
        "a removed workload is unreachable"
    );
    echo_once(&mesh.a, a, SocketAddr::from((a.vip(), 80)))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_authorization_applies_to_the_next_connection_and_rechecks_live_ones() {
    let a = Addrs { n: 162 };
    let mesh = XdsMesh::start(a, &mesh_text(a, false, ""), &all_echo_ips(a))
        .await
        .unwrap();
    let echo = SocketAddr::from((a.echo(), 8080));
    let mut live = open(&mesh.a, a, echo).await;

    mesh.write_mesh(&mesh_text(a, false, deny_client()));
    // The live tunnel is re-checked by node B and closed.
    let mut rest = Vec::new();
    let n = tokio::time::timeout(Duration::from_secs(30), live.read_to_end(&mut rest)).await;
    assert!(
        matches!(n, Ok(Ok(0)) | Ok(Err(_))),
        "the live connection must be closed: {n:?}"
    );
    let l = eventually(Duration::from_secs(30), "re-check log", || async {
        mesh.b
            .access_logs()
            .into_iter()
            .find(|l| l["error"].as_str().is_some_and(|e| e.contains("re-check")))
    })
    .await;
    assert!(
        l["error"].as_str().unwrap().contains("default/deny-client"),
        "{l}"
    );
    // The ACK goes out once the policy is in force (the re-check above ran just before it is counted: wait for
    // it), and the next connection is denied.
    let auth = eventually(
        Duration::from_secs(30),
        "the Authorization ACKed",
        || async {
            let src = mesh_source(&mesh.b).await?;
            src["types"]
                .as_array()?
                .iter()
                .find(|t| t["typeUrl"] == weft_proto::type_url::AUTHORIZATION)
                .filter(|t| t["acks"].as_u64().unwrap_or(0) >= 2)
                .cloned()
        },
    )
    .await;
    assert_eq!(auth["resources"], 1, "{auth}");
    let r = socks5::connect(mesh.a.socks5, Some(IpAddr::V4(a.client())), echo).await;
    assert!(matches!(r, Err(socks5::Socks5Error::Reply(2))), "{r:?}");

    // Removed again: allowed again.
    mesh.write_mesh(&mesh_text(a, false, ""));
    until_dump(&mesh.b, "the policy gone", |d| {
        d["policies"].as_array().is_some_and(|p| p.is_empty())
    })
    .await;
    eventually(Duration::from_secs(30), "allowed again", || async {
        echo_once(&mesh.a, a, echo).await.ok()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_control_plane_restarting_leaves_weft_serving_and_it_resyncs_with_what_it_holds() {
    let a = Addrs { n: 164 };
    let mut mesh = XdsMesh::start(a, &mesh_text(a, false, ""), &all_echo_ips(a))
        .await
        .unwrap();
    let echo = SocketAddr::from((a.echo(), 8080));
    let mut live = open(&mesh.a, a, echo).await;

    mesh.control.kill();
    for node in [&mesh.a, &mesh.b] {
        eventually(Duration::from_secs(30), "the stream lost", || async {
            mesh_source(node)
                .await
                .filter(|s| s["connected"] == false && s["lastDisconnect"].is_object())
        })
        .await;
    }
    // Serving on: still ready, the live connection still echoes, new connections work.
    let (code, body) = mesh
        .a
        .http(mesh.a.readiness, "GET", "/healthz/ready")
        .await
        .unwrap();
    assert_eq!(code, 200, "{body}");
    ping(&mut live).await.unwrap();
    echo_once(&mesh.a, a, SocketAddr::from((a.vip(), 80)))
        .await
        .unwrap();

    // The mesh changes while the control plane is down; it comes back on the same port.
    mesh.write_mesh(&mesh_text(a, true, ""));
    mesh.control.restart().unwrap();
    for node in [&mesh.a, &mesh.b] {
        until_dump(node, "resynced with echo-2", |d| {
            has_workload(d, "Kubernetes//Pod/default/echo-2")
                && d["sources"]["xds"][0]["connected"] == true
                && d["sources"]["xds"][0]["connections"] == 2
        })
        .await;
    }
    // The node said what it held (initial_resource_versions), so only what changed came back.
    let applied: Vec<serde_json::Value> = mesh
        .a
        .log_lines()
        .into_iter()
        .filter(|l| l["message"] == "xDS update applied" && l["kind"] == "Address")
        .collect();
    let first = applied.first().unwrap();
    let last = applied.last().unwrap();
    assert!(first["upserts"].as_u64().unwrap() >= 4, "{first}");
    assert_eq!(last["upserts"], 2, "echo-2 and echo2 only: {last}");
    assert_eq!(last["removals"], 0, "{last}");
    ping(&mut live).await.unwrap();
    let (_, vip2) = echo2(a);
    eventually(Duration::from_secs(30), "echo2 reachable", || async {
        echo_once(&mesh.a, a, SocketAddr::from((vip2, 80)))
            .await
            .ok()
    })
    .await;
}

/// What a real control plane never sends: a batch with malformed resources among good ones, from a scripted
/// server. Each bad one is NACKed by name with its reason, the rest applies, and traffic never stops.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_resource_is_nacked_with_its_reason_and_the_rest_applies_while_traffic_flows() {
    use weft_proto::istio::workload as pb;
    use weft_proto::type_url::{ADDRESS, AUTHORIZATION};
    use weft_xds::testing::{Pki, Server, resource, response};

    let a = Addrs { n: 166 };
    let pki = Pki::new();
    let mut server = Server::start(pki.server_tls(&["localhost"])).await;
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca");
    weft_devmesh::write_dev_ca(&ca, "cluster.local").unwrap();
    let mut echo = Vec::new();
    for ip in all_echo_ips(a) {
        echo.push(
            workload::echo_server(SocketAddr::new(ip, 8080))
                .await
                .unwrap()
                .1,
        );
    }
    // The mesh as resources: what the local file would say, converted as weft-control converts it.
    let cfg = weft_state::local::parse(&mesh_text(a, true, ""), std::path::Path::new("/")).unwrap();
    let good: Vec<_> = cfg
        .workloads
        .iter()
        .filter(|w| w.name != "echo-2")
        .map(|w| {
            let addr = pb::Address {
                r#type: Some(pb::address::Type::Workload(
                    weft_state::xds::encode::workload(w),
                )),
            };
            resource(ADDRESS, &w.uid, "1", &addr)
        })
        .chain(cfg.services.iter().map(|s| {
            let addr = pb::Address {
                r#type: Some(pb::address::Type::Service(
                    weft_state::xds::encode::service(s),
                )),
            };
            resource(ADDRESS, &s.key(), "1", &addr)
        }))
        .collect();
    let echo2_wl = cfg.workloads.iter().find(|w| w.name == "echo-2").unwrap();

    let weft = weft_devmesh::weft_binary().unwrap();
    let mut nodes = Vec::new();
    for (name, ip) in [("node-a", a.node_a()), ("node-b", a.node_b())] {
        let mut o = NodeOptions::loopback(name, ip, std::path::Path::new(""), &ca, dir.path());
        o.extra
            .extend(xds_flags(server.addr, &pki.root, &pki.token, name));
        nodes.push(NodeProcess::spawn(&weft, &o).unwrap());
    }
    let mut conns = Vec::new();
    for _ in 0..2 {
        let mut c = server.accept().await;
        let first = c.next_of(ADDRESS).await;
        c.next_of(AUTHORIZATION).await;
        assert!(first.initial_resource_versions.is_empty());
        c.send(response(ADDRESS, "a1", good.clone(), &[]));
        c.send(response(AUTHORIZATION, "p1", vec![], &[]));
        for _ in 0..2 {
            let ack = c.next().await;
            assert!(ack.error_detail.is_none(), "{ack:?}");
        }
        conns.push(c);
    }
    for n in &mut nodes {
        n.wait_ready(Duration::from_secs(30)).await.unwrap();
    }
    let (node_a, node_b) = (&nodes[0], &nodes[1]);
    let mut live = open(node_a, a, SocketAddr::from((a.vip(), 80))).await;

    // One batch: the good echo-2, a workload with a 3-byte address, a service with an IP family no proto has.
    let bad_wl = pb::Address {
        r#type: Some(pb::address::Type::Workload(pb::Workload {
            uid: "Kubernetes//Pod/default/broken".into(),
            name: "broken".into(),
            namespace: "default".into(),
            addresses: vec![vec![10, 0, 0]],
            ..Default::default()
        })),
    };
    let bad_svc = pb::Address {
        r#type: Some(pb::address::Type::Service(pb::Service {
            name: "bad".into(),
            namespace: "default".into(),
            hostname: "bad.default.svc.cluster.local".into(),
            ip_families: 7,
            ..Default::default()
        })),
    };
    let echo2_addr = pb::Address {
        r#type: Some(pb::address::Type::Workload(
            weft_state::xds::encode::workload(echo2_wl),
        )),
    };
    let batch = vec![
        resource(ADDRESS, &echo2_wl.uid, "2", &echo2_addr),
        resource(ADDRESS, "Kubernetes//Pod/default/broken", "2", &bad_wl),
        resource(
            ADDRESS,
            "default/bad.default.svc.cluster.local",
            "2",
            &bad_svc,
        ),
    ];
    for c in &mut conns {
        c.send(response(ADDRESS, "a2", batch.clone(), &[]));
        let nack = c.next().await;
        assert_eq!(nack.response_nonce, "a2");
        let e = nack.error_detail.unwrap();
        assert_eq!(e.code, weft_xds::NACK_CODE);
        assert_eq!(
            e.message,
            "Kubernetes//Pod/default/broken: workload.addresses[0]: 3 bytes is not an IP address (4 for IPv4, \
             16 for IPv6); default/bad.default.svc.cluster.local: service.ip_families: unknown enum value 7"
        );
    }
    // The good one applied on both nodes; the bad ones are nowhere; the NACK is in /config_dump.
    for node in [node_a, node_b] {
        let d = until_dump(node, "echo-2 applied", |d| {
            has_workload(d, "Kubernetes//Pod/default/echo-2")
        })
        .await;
        assert!(!has_workload(&d, "Kubernetes//Pod/default/broken"));
        let t = &d["sources"]["xds"][0]["types"][0];
        assert_eq!(t["nacks"], 1, "{t}");
        assert!(
            t["lastNack"]["error"]
                .as_str()
                .unwrap()
                .contains("workload.addresses[0]"),
            "{t}"
        );
    }
    // Traffic never stopped: the connection opened before the push still echoes, and echo-2 is reachable.
    ping(&mut live).await.unwrap();
    let (_, vip2) = echo2(a);
    eventually(Duration::from_secs(30), "echo2 reachable", || async {
        echo_once(node_a, a, SocketAddr::from((vip2, 80)))
            .await
            .ok()
    })
    .await;
    for t in echo {
        t.abort();
    }
}
