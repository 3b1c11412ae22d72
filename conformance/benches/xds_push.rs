//! Push-to-effect over xDS, end to end: a real `weft-control` serving two real `weft run` nodes. Each push is a
//! file write (the mesh file for a policy, a WeftPlugin file for a plugin); its effect is the first connection
//! through the nodes whose verdict flipped. The time includes weft-control's file poll (`--poll 20ms` here, so up
//! to 20 ms of it is the poll), the Delta ADS push, the node's conversion (for a plugin: compile, pre-warm,
//! configure, swap) and the connection itself. Prints median and p99 of each over BENCH_PUSHES pushes (default 40).
//!   cargo bench -p weft-conformance --bench xds_push
#![allow(clippy::unwrap_used)] // a bench panics to fail

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::time::{Duration, Instant};

use weft_conformance::xdsmesh::{MeshOptions, XdsMesh};
use weft_conformance::{Addrs, mesh_yaml};
use weft_devmesh::{NodeProcess, socks5, workload};

async fn passes(node: &NodeProcess, a: Addrs, dst: SocketAddr) -> bool {
    let Ok(s) = socks5::connect(node.socks5, Some(IpAddr::V4(a.client())), dst).await else {
        return false;
    };
    workload::round_trip(s, b"ping")
        .await
        .is_ok_and(|b| b == b"ping")
}

/// Write, then probe until a connection's verdict is `want`; the time from the write.
async fn push(
    node: &NodeProcess,
    a: Addrs,
    dst: SocketAddr,
    want: bool,
    write: impl FnOnce(),
) -> Duration {
    let start = Instant::now();
    write();
    loop {
        if passes(node, a, dst).await == want {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "push without effect after 60 s"
        );
    }
}

fn put(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

fn summary(what: &str, mut v: Vec<Duration>) {
    v.sort();
    let pct = |p: f64| v[((v.len() as f64 - 1.0) * p).round() as usize];
    println!(
        "{what:<34} pushes {:>3}  median {:>9.2?}  p99 {:>9.2?}  min {:>9.2?}  max {:>9.2?}",
        v.len(),
        pct(0.5),
        pct(0.99),
        v[0],
        v[v.len() - 1]
    );
}

fn main() {
    let pushes: usize = std::env::var("BENCH_PUSHES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(40);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let a = Addrs { n: 178 };
        let allow = weft_plugin_host::testing::build_plugin("plugins/port-allowlist").unwrap();
        let plugins = tempfile::tempdir().unwrap();
        std::fs::copy(&allow, plugins.path().join("allowlist.wasm")).unwrap();
        let base = mesh_yaml(a, "echo");
        let mesh = XdsMesh::start_with(
            a,
            &base,
            &[IpAddr::V4(a.echo())],
            MeshOptions {
                plugins_dir: Some(plugins.path().to_path_buf()),
                node_extra: vec![],
            },
        )
        .await
        .unwrap();
        let echo = SocketAddr::new(IpAddr::V4(a.echo()), 8080);
        assert!(passes(&mesh.a, a, echo).await);

        // A policy: an Istio AuthorizationPolicy denying the client, added and removed.
        let deny = format!(
            "{base}policies:\n- name: deny-client\n  namespace: default\n  scope: Namespace\n  action: Deny\n  \
             rules:\n  - - - principals: [!Exact cluster.local/ns/default/sa/client]\n"
        );
        let mut policy = Vec::new();
        for i in 0..pushes {
            let add = i % 2 == 0;
            let text = if add { deny.clone() } else { base.clone() };
            policy.push(push(&mesh.a, a, echo, !add, || put(&mesh.mesh_file, &text)).await);
        }
        if pushes % 2 == 1 {
            push(&mesh.a, a, echo, true, || put(&mesh.mesh_file, &base)).await;
        }

        // A plugin: port-allowlist's configuration flipped between denying and allowing 8080 (each push a new
        // version: compiled from the cache, instances pre-warmed and configured, the chain swapped).
        let file = plugins.path().join("allowlist.yaml");
        let doc = |ports: &str| {
            format!(
                "apiVersion: weft.dev/v1alpha1\nkind: WeftPlugin\nmetadata:\n  name: allowlist\nspec:\n  \
                 url: file://allowlist.wasm\n  pluginConfig: {{ports: [{ports}]}}\n  kind: policy\n  \
                 directions: [inbound]\n"
            )
        };
        let mut plugin = Vec::new();
        for i in 0..pushes {
            let deny = i % 2 == 0;
            let text = doc(if deny { "9999" } else { "8080" });
            plugin.push(push(&mesh.a, a, echo, !deny, || put(&file, &text)).await);
        }
        println!("push-to-effect over xDS (weft-control -> 2 nodes; includes the control plane's 20 ms file poll)");
        summary("policy (AuthorizationPolicy)", policy);
        summary("plugin (new WeftPlugin version)", plugin);
    });
}
