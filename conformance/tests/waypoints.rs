//! Waypoints through real weft processes and a real waypoint stand-in (weft-hbone: terminates HBONE, records what
//! it saw, re-originates with its own identity). Node A's client reaches node B's echo workload: service-addressed
//! traffic through a service-attached waypoint, workload-addressed traffic through a workload-attached one, each
//! with the original destination as the CONNECT authority and the client's identity verified by the waypoint; the
//! other kind of traffic goes direct. An unknown waypoint fails the connection; traffic bypassing the waypoint is
//! refused by the destination's policy (as istiod's allow-from-waypoint policy makes ztunnel refuse it).
#![allow(clippy::unwrap_used)] // a test panics to fail

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use weft_conformance::waypoint::{Route, WaypointStandIn};
use weft_conformance::{Addrs, Mesh, eventually};
use weft_devmesh::{socks5, workload};
use weft_identity::SpiffeId;

fn waypoint_ip(a: Addrs) -> Ipv4Addr {
    Ipv4Addr::new(127, 0, a.n, 50)
}

/// The mesh; `svc_wp` / `wl_wp` are the echo service's and the echo workload's `waypoint:` lines (or empty),
/// `policies` what node B enforces on echo.
fn yaml(a: Addrs, svc_wp: &str, wl_wp: &str, echo_policies: &str) -> String {
    format!(
        r#"workloads:
- uid: client
  name: client
  namespace: default
  serviceAccount: client
  workloadIps: [{client}]
  protocol: HBONE
  node: node-a
- uid: echo
  name: echo
  namespace: default
  serviceAccount: echo
  workloadIps: [{echo}]
  protocol: HBONE
  node: node-b
  services: {{default/echo.default.svc.cluster.local: {{80: 8080}}}}
  authorizationPolicies: [{echo_policies}]
  {wl_wp}
- uid: waypoint
  name: waypoint
  namespace: default
  serviceAccount: waypoint
  workloadIps: [{wp}]
  protocol: HBONE
  node: waypoint-node
  services: {{default/waypoint.default.svc.cluster.local: {{15008: 15008}}}}
services:
- name: echo
  namespace: default
  hostname: echo.default.svc.cluster.local
  vips: ["/{vip}"]
  ports: {{80: 8080}}
  {svc_wp}
- name: waypoint
  namespace: default
  hostname: waypoint.default.svc.cluster.local
  vips: ["/127.10.{n}.50"]
  ports: {{15008: 15008}}
policies:
- name: allow-from-waypoint
  namespace: default
  scope: WorkloadSelector
  action: Allow
  rules:
  - - - principals: [!Exact cluster.local/ns/default/sa/waypoint]
"#,
        client = a.client(),
        echo = a.echo(),
        wp = waypoint_ip(a),
        vip = a.vip(),
        n = a.n,
    )
}

const SVC_WP: &str = "waypoint: {destination: default/waypoint.default.svc.cluster.local}";

fn id(sa: &str) -> SpiffeId {
    format!("spiffe://cluster.local/ns/default/sa/{sa}")
        .parse()
        .unwrap()
}

async fn echo_via(mesh: &Mesh, dst: SocketAddr, what: &[u8]) -> Result<Vec<u8>, String> {
    let s = socks5::connect(mesh.a.socks5, Some(IpAddr::V4(mesh.addrs.client())), dst)
        .await
        .map_err(|e| e.to_string())?;
    let back = workload::round_trip(s, what)
        .await
        .map_err(|e| e.to_string())?;
    if back.is_empty() {
        return Err("connection closed without an answer".into());
    }
    Ok(back)
}

async fn edit(mesh: &Mesh, node_a: bool, text: &str) {
    let (node, path) = if node_a {
        (&mesh.a, &mesh.config_a)
    } else {
        (&mesh.b, &mesh.config_b)
    };
    weft_conformance::edit_mesh_file(node, path, text).await;
}

/// Node B's inbound access log lines so far, by source identity.
fn inbound_from(mesh: &Mesh, sa: &str) -> usize {
    let want = id(sa).to_string();
    mesh.b
        .access_logs()
        .iter()
        .filter(|l| l["direction"] == "inbound" && l["src.identity"] == want.as_str())
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn traffic_goes_through_the_waypoint_its_destination_names() {
    let a = Addrs { n: 202 };
    let service_attached = yaml(a, SVC_WP, "", "");
    let mesh = Mesh::start(a, &service_attached, &service_attached)
        .await
        .unwrap();
    let vip = SocketAddr::from((a.vip(), 80));
    let echo = SocketAddr::from((a.echo(), 8080));
    let routes = HashMap::from([
        (vip.to_string(), Route::Hbone(echo, id("echo"))),
        (echo.to_string(), Route::Hbone(echo, id("echo"))),
    ]);
    let wp = WaypointStandIn::start(
        IpAddr::V4(waypoint_ip(a)),
        &mesh.ca_dir(),
        id("waypoint"),
        routes,
    )
    .await
    .unwrap();

    // Service-attached waypoint: service-addressed traffic goes through it, authority = the VIP as dialled.
    assert_eq!(
        echo_via(&mesh, vip, b"to the service").await.unwrap(),
        b"to the service"
    );
    let seen = wp.seen();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].authority, vip.to_string());
    assert_eq!(seen[0].peer_identity, id("client").to_string());
    assert_eq!(
        seen[0].peer.ip(),
        IpAddr::V4(a.client()),
        "node A binds the client's address"
    );
    let fwd = seen[0].forwarded.clone().unwrap();
    assert!(
        fwd.contains(&format!("for=\"{}:", a.client()))
            && fwd.contains("host=echo.default.svc.cluster.local"),
        "{fwd}"
    );
    eventually(
        Duration::from_secs(30),
        "node B logs the waypoint as the source",
        || async { (inbound_from(&mesh, "waypoint") == 1).then_some(()) },
    )
    .await;
    let hbone = format!("{}:15008", waypoint_ip(a));
    eventually(
        Duration::from_secs(30),
        "node A's access log names the waypoint as the HBONE address",
        || async {
            mesh.a
                .access_logs()
                .iter()
                .any(|l| l["dst.hbone_addr"] == hbone.as_str())
                .then_some(())
        },
    )
    .await;
    // ... but workload-addressed traffic does not (the waypoint is for the service's traffic).
    assert_eq!(
        echo_via(&mesh, echo, b"to the pod").await.unwrap(),
        b"to the pod"
    );
    assert_eq!(wp.seen().len(), 1);
    eventually(
        Duration::from_secs(30),
        "node B logs the client as the source",
        || async { (inbound_from(&mesh, "client") == 1).then_some(()) },
    )
    .await;

    // Workload-attached waypoint (node A's file edited live): the other way round.
    let wl_wp = format!(
        "waypoint: {{destination: \"/{}\", hboneMtlsPort: 15008}}",
        waypoint_ip(a)
    );
    edit(&mesh, true, &yaml(a, "", &wl_wp, "")).await;
    assert_eq!(
        echo_via(&mesh, echo, b"pod via wp").await.unwrap(),
        b"pod via wp"
    );
    let seen = wp.seen();
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert_eq!(
        seen[1].authority,
        echo.to_string(),
        "authority: the workload address as dialled"
    );
    assert_eq!(seen[1].peer_identity, id("client").to_string());
    assert_eq!(
        echo_via(&mesh, vip, b"svc direct").await.unwrap(),
        b"svc direct"
    );
    assert_eq!(
        wp.seen().len(),
        2,
        "service-addressed traffic ignores the workload's waypoint"
    );

    // An unknown waypoint: the connection fails (no silent bypass).
    edit(
        &mesh,
        true,
        &yaml(a, "", "waypoint: {destination: \"/127.0.202.99\"}", ""),
    )
    .await;
    assert!(echo_via(&mesh, echo, b"x").await.is_err());
    eventually(
        Duration::from_secs(30),
        "node A's log names the unknown waypoint",
        || async {
            mesh.a
                .log_lines()
                .iter()
                .any(|l| l.to_string().contains("unknown waypoint /127.0.202.99"))
                .then_some(())
        },
    )
    .await;
    assert_eq!(wp.seen().len(), 2);

    // Node B allows echo's traffic only from the waypoint (istiod's allow-from-waypoint policy). A client node
    // that bypasses the waypoint (node A's file has none) is refused; through the waypoint it passes.
    edit(
        &mesh,
        false,
        &yaml(a, SVC_WP, &wl_wp, "default/allow-from-waypoint"),
    )
    .await;
    edit(&mesh, true, &yaml(a, "", "", "")).await;
    assert!(
        echo_via(&mesh, echo, b"bypass").await.is_err(),
        "bypassing the waypoint is refused"
    );
    let client = id("client").to_string();
    eventually(Duration::from_secs(30), "node B's denial", || async {
        mesh.b
            .access_logs()
            .iter()
            .any(|l| {
                l["src.identity"] == client.as_str()
                    && l["error"]
                        .as_str()
                        .is_some_and(|e| e.contains("none allowed"))
            })
            .then_some(())
    })
    .await;
    edit(&mesh, true, &yaml(a, SVC_WP, &wl_wp, "")).await;
    assert_eq!(echo_via(&mesh, echo, b"via wp").await.unwrap(), b"via wp");
    assert_eq!(
        echo_via(&mesh, vip, b"svc via wp").await.unwrap(),
        b"svc via wp"
    );
    assert_eq!(wp.seen().len(), 4);
}

/// Transport policy runs before traffic is handed to the waypoint, as the Istio waypoint design says: an egress
/// (outbound) policy plugin on the client's node, real Wasm built from `plugins/port-allowlist`, refuses a
/// connection to a service with a waypoint before any byte of it reaches the waypoint, and once it allows the
/// port, the same connection goes through the waypoint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_egress_policy_plugin_decides_before_the_waypoint() {
    let a = Addrs { n: 212 };
    let allowlist = weft_plugin_host::testing::build_plugin("plugins/port-allowlist")
        .unwrap_or_else(|e| panic!("building port-allowlist: {e}"));
    let base = yaml(a, SVC_WP, "", "");
    let with_egress = |ports: &str| {
        format!(
            "{base}plugins:\n- name: egress\n  kind: policy\n  path: {}\n  directions: [outbound]\n  \
             config: {{\"ports\": [{ports}], \"deny_message\": \"egress port not allowed\"}}\n",
            allowlist.display()
        )
    };
    let mesh = Mesh::start(a, &with_egress("9"), &base).await.unwrap();
    let vip = SocketAddr::from((a.vip(), 80));
    let echo = SocketAddr::from((a.echo(), 8080));
    let routes = HashMap::from([(vip.to_string(), Route::Hbone(echo, id("echo")))]);
    let wp = WaypointStandIn::start(
        IpAddr::V4(waypoint_ip(a)),
        &mesh.ca_dir(),
        id("waypoint"),
        routes,
    )
    .await
    .unwrap();
    eventually(
        Duration::from_secs(30),
        "the egress plugin serving on node A",
        || async {
            let d = mesh.a.config_dump().await.ok()?;
            d["plugins"]
                .as_array()?
                .iter()
                .any(|p| p["name"] == "egress" && p["state"] == "serving")
                .then_some(())
        },
    )
    .await;

    // Denied on node A: the waypoint never sees the connection.
    assert!(echo_via(&mesh, vip, b"denied").await.is_err());
    eventually(
        Duration::from_secs(30),
        "node A logs the plugin's denial",
        || async {
            mesh.a
                .log_lines()
                .iter()
                .any(|l| l.to_string().contains("egress port not allowed"))
                .then_some(())
        },
    )
    .await;
    assert_eq!(
        wp.seen().len(),
        0,
        "a denied connection reached the waypoint"
    );

    // Allowed (the service port as dialled, and the target port): through the waypoint, as without the plugin.
    edit(&mesh, true, &with_egress("80, 8080")).await;
    let back = eventually(
        Duration::from_secs(30),
        "the allowed connection",
        || async { echo_via(&mesh, vip, b"allowed").await.ok() },
    )
    .await;
    assert_eq!(back, b"allowed");
    let seen = wp.seen();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].authority, vip.to_string());
    assert_eq!(seen[0].peer_identity, id("client").to_string());
}
