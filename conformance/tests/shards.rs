//! `weft run --shards`: connections carried by single-threaded shards, each with its own HBONE pool. Captured
//! traffic through two sharded nodes in network namespaces arrives intact, alternate connections ride each shard's
//! own HBONE connection, and a sharded node drains and exits on SIGTERM. Needs root (CI runs as root).
#![allow(clippy::unwrap_used)] // a test panics to fail

use std::net::Ipv4Addr;
use std::time::Duration;

use weft_conformance::eventually;
use weft_conformance::netmesh::{Layout, NetMesh, connect, echo_through_capture, yaml};
use weft_devmesh::workload;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sharded_nodes_carry_captured_traffic_on_one_hbone_connection_per_shard() {
    let (c, s) = (Ipv4Addr::new(10, 248, 13, 1), Ipv4Addr::new(10, 248, 13, 2));
    let mut layout = Layout::new(c, s, 24);
    layout.flags_a.extend(["--shards".into(), "2".into()]);
    layout.flags_b.extend(["--shards".into(), "2".into()]);
    let mut mesh = NetMesh::start_with("sh", &layout, &yaml(c, s), "info")
        .await
        .expect("network namespaces (needs root)");
    let dst = mesh.server();
    let _echo = mesh.spawn_echo();
    let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();

    // The first exchange waits for the echo server; then five more, one connection each, in turn on both shards.
    let first = echo_through_capture(&mesh.ns_a, dst, &data).await;
    assert!(first == data, "echo corrupted: {} bytes back", first.len());
    for i in 0..5 {
        let sent = data.clone();
        let back =
            mesh.ns_a
                .run(move || async move {
                    workload::round_trip(connect(dst, false).await?, &sent).await
                })
                .join()
                .unwrap()
                .unwrap()
                .unwrap_or_else(|e| panic!("exchange {i}: {e}"));
        assert!(back == data, "exchange {i}: {} bytes back", back.len());
    }
    // Every exchange is logged whole on both nodes (an attempt before the echo server was up is logged too, with
    // nothing sent).
    let whole = |lines: Vec<serde_json::Value>| {
        lines
            .iter()
            .filter(|l| l["bytes_sent"] == 200_000 && l["bytes_recv"] == 200_000)
            .count()
    };
    eventually(
        Duration::from_secs(10),
        "six whole exchanges logged on each node",
        || async {
            (whole(mesh.a.access_logs()) == 6 && whole(mesh.b.access_logs()) == 6).then_some(())
        },
    )
    .await;
    // Six connections handed to two shards in turn: each shard opened one HBONE connection of its own and reused
    // it (one shared pool would have made one).
    let dump = mesh.a.config_dump().await.unwrap();
    assert_eq!(
        dump["connections"]["hboneCreated"], 2,
        "{}",
        dump["connections"]
    );
    let starting = mesh
        .b
        .log_lines()
        .into_iter()
        .find(|l| l["message"] == "weft starting")
        .expect("node B's start line");
    assert_eq!(starting["shards"], 2, "{starting}");

    // SIGTERM: both sharded nodes drain and exit by themselves.
    assert!(
        mesh.a.terminate(Duration::from_secs(20)).await,
        "node A did not exit on SIGTERM"
    );
    assert!(
        mesh.b.terminate(Duration::from_secs(20)).await,
        "node B did not exit on SIGTERM"
    );
}
