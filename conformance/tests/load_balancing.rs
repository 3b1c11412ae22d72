//! Locality-aware service load balancing through real weft processes: node A's client reaches a service with one
//! endpoint on its own node and one on node B; FAILOVER keeps it on the local endpoint while that is healthy, fails
//! over to node B when the file marks it unhealthy (edited live), and comes back; STRICT refuses instead.
#![allow(clippy::unwrap_used)] // a test panics to fail

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use weft_conformance::{Addrs, Mesh, eventually};
use weft_devmesh::socks5;

/// The mesh: client and `near` on node A (same region, zone, subzone), `far` on node B (another zone).
fn yaml(a: Addrs, near_status: &str, mode: &str) -> String {
    format!(
        r#"workloads:
- uid: client
  name: client
  namespace: default
  serviceAccount: client
  workloadIps: [{client}]
  protocol: HBONE
  node: node-a
  locality: {{region: r1, zone: z1, subzone: s1}}
- uid: near
  name: near
  namespace: default
  serviceAccount: server
  workloadIps: [{near}]
  protocol: HBONE
  node: node-a
  status: {near_status}
  locality: {{region: r1, zone: z1, subzone: s1}}
  services: {{default/lb.default.svc.cluster.local: {{80: 8080}}}}
- uid: far
  name: far
  namespace: default
  serviceAccount: server
  workloadIps: [{far}]
  protocol: HBONE
  node: node-b
  locality: {{region: r1, zone: z2, subzone: s1}}
  services: {{default/lb.default.svc.cluster.local: {{80: 8080}}}}
services:
- name: lb
  namespace: default
  hostname: lb.default.svc.cluster.local
  vips: ["/{vip}"]
  ports: {{80: 8080}}
  loadBalancer: {{mode: {mode}, routingPreferences: [Region, Zone, Subzone, Node]}}
"#,
        client = a.client(),
        near = near(a),
        far = far(a),
        vip = a.vip(),
    )
}

fn near(a: Addrs) -> Ipv4Addr {
    Ipv4Addr::new(127, 0, a.n, 3)
}

fn far(a: Addrs) -> Ipv4Addr {
    Ipv4Addr::new(127, 0, a.n + 1, 3)
}

/// A server that answers every connection with its name.
async fn name_server(ip: Ipv4Addr, name: &'static str) -> tokio::task::JoinHandle<()> {
    let lis = tokio::net::TcpListener::bind((ip, 8080)).await.unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = lis.accept().await {
            tokio::spawn(async move {
                let _ = s.write_all(name.as_bytes()).await;
                let _ = s.shutdown().await;
            });
        }
    })
}

/// Which endpoint one connection to the service reached (an error if none could be).
async fn who(mesh: &Mesh) -> Result<String, String> {
    let a = mesh.addrs;
    let mut s = socks5::connect(
        mesh.a.socks5,
        Some(IpAddr::V4(a.client())),
        SocketAddr::from((a.vip(), 80)),
    )
    .await
    .map_err(|e| e.to_string())?;
    let mut name = String::new();
    s.read_to_string(&mut name)
        .await
        .map_err(|e| e.to_string())?;
    Ok(name)
}

async fn edit(mesh: &Mesh, text: &str) {
    weft_conformance::edit_mesh_file(&mesh.a, &mesh.config_a, text).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_leaves_an_unhealthy_local_endpoint_and_comes_back() {
    let a = Addrs { n: 200 };
    let healthy = yaml(a, "Healthy", "Failover");
    let mesh = Mesh::start(a, &healthy, &healthy).await.unwrap();
    let _near = name_server(near(a), "near").await;
    let _far = name_server(far(a), "far").await;
    for _ in 0..6 {
        assert_eq!(
            who(&mesh).await.unwrap(),
            "near",
            "the best tier is the local endpoint only"
        );
    }
    // The local endpoint goes unhealthy (node A's file, edited live): traffic fails over to node B.
    edit(&mesh, &yaml(a, "Unhealthy", "Failover")).await;
    for _ in 0..6 {
        assert_eq!(who(&mesh).await.unwrap(), "far", "failed over to node B");
    }
    // Healthy again: back to the local endpoint.
    edit(&mesh, &healthy).await;
    for _ in 0..6 {
        assert_eq!(who(&mesh).await.unwrap(), "near");
    }
    // STRICT: with the local endpoint unhealthy there is no endpoint matching every preference; no failover.
    edit(&mesh, &yaml(a, "Unhealthy", "Strict")).await;
    assert!(who(&mesh).await.is_err(), "STRICT must not fail over");
    eventually(
        Duration::from_secs(30),
        "node A's log names the cause of the refusal",
        || async {
            mesh.a
                .log_lines()
                .iter()
                .any(|l| l.to_string().contains("has no healthy endpoint"))
                .then_some(())
        },
    )
    .await;
    // ALLOW_ALL: the unhealthy local endpoint is picked again.
    edit(
        &mesh,
        &yaml(a, "Unhealthy", "Strict").replace(
            "routingPreferences: [Region, Zone, Subzone, Node]",
            "routingPreferences: [Region, Zone, Subzone, Node], healthPolicy: AllowAll",
        ),
    )
    .await;
    assert_eq!(who(&mesh).await.unwrap(), "near");
}
