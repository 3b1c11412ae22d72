//! Connection setup through two weft nodes with the default plugins (istio-authz with 10, 1,000 and 10,000
//! authorization policies in the mesh, istio-telemetry) versus no plugins, as ratios measured in one run. Same
//! topology as `mesh` (two network namespaces, capture → HBONE → node B). In every mesh, 10 ALLOW policies apply to
//! the server's namespace (the last one allows the client), the rest live in other namespaces.
//!   cargo build --release -p weft && cargo bench -p weft-conformance --bench plugins_setup
//! Environment: BENCH_SECS (window per scenario, default 3), BENCH_CONC (concurrent loops, default 16).
#![allow(clippy::unwrap_used)] // a bench panics to fail

use std::fmt::Write as _;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use weft_conformance::load::{close_server, conn_rate};
use weft_conformance::netmesh::{Layout, NetMesh, yaml};

const CLOSE: u16 = 9002;

fn policies(total: usize) -> String {
    let mut out = String::from("policies:\n");
    for i in 0..total {
        // Ten apply to the server's namespace; only the last of those matches the client.
        let (ns, principal) = match i {
            0..=8 => ("default", format!("cluster.local/ns/other/sa/x{i}")),
            9 => ("default", "cluster.local/ns/default/sa/client".to_owned()),
            _ => ("elsewhere", format!("cluster.local/ns/elsewhere/sa/x{i}")),
        };
        let ns = if ns == "elsewhere" {
            format!("ns-{}", i % 500)
        } else {
            ns.to_owned()
        };
        let _ = write!(
            out,
            "- name: p{i}\n  namespace: {ns}\n  scope: Namespace\n  action: Allow\n  rules:\n  - - - principals: [!Exact {principal}]\n"
        );
    }
    out
}

async fn scenario(
    tag: &str,
    subnet: u8,
    plugins: bool,
    n_policies: usize,
    secs: u64,
    conc: usize,
) -> (f64, u64) {
    let (client, server) = (
        Ipv4Addr::new(10, 248, subnet, 1),
        Ipv4Addr::new(10, 248, subnet, 2),
    );
    let mut layout = Layout::new(client, server, 24);
    if !plugins {
        layout.flags_a = vec!["--default-plugins".into(), "false".into()];
        layout.flags_b = layout.flags_a.clone();
    }
    let mut mesh_yaml = yaml(client, server);
    if n_policies > 0 {
        mesh_yaml.push_str(&policies(n_policies));
    }
    let mut mesh = NetMesh::start_with(tag, &layout, &mesh_yaml, "warn")
        .await
        .expect("netns mesh (root, release weft)");
    let dst = SocketAddr::from((server, CLOSE));
    let _srv = mesh.ns_b.run(move || close_server(dst));
    let r = mesh
        .ns_a
        .run(move || async move {
            tokio::time::sleep(Duration::from_millis(200)).await;
            let _ = conn_rate(dst, false, Duration::from_millis(500), 4).await;
            let (ok, failed, took) = conn_rate(dst, false, Duration::from_secs(secs), conc).await;
            (ok as f64 / took, failed)
        })
        .join()
        .unwrap()
        .unwrap();
    mesh.a.terminate(Duration::from_secs(5)).await;
    mesh.b.terminate(Duration::from_secs(5)).await;
    r
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let secs = std::env::var("BENCH_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let conc = std::env::var("BENCH_CONC")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(16);
    let (base, base_fail) = scenario("p0", 20, false, 0, secs, conc).await;
    println!(
        "connection setup through two nodes, {conc} concurrent, {secs}s per scenario (capture -> HBONE -> node B)"
    );
    println!(
        "  no plugins:                                  {base:8.0} conn/s   ratio 1.000   failed {base_fail}"
    );
    for (i, n) in [10usize, 1_000, 10_000].into_iter().enumerate() {
        let (cps, failed) =
            scenario(&format!("p{}", i + 1), 21 + i as u8, true, n, secs, conc).await;
        println!(
            "  istio-authz ({n:>6} policies) + istio-telemetry: {cps:8.0} conn/s   ratio {:.3}   failed {failed}",
            cps / base
        );
        assert_eq!(failed, 0, "no connection may fail");
    }
}
