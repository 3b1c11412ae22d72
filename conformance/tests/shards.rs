//! `weft run --shards`: connections carried by single-threaded shards (the default), each with its own HBONE pool,
//! or by the worker threads (`--shards 0`). Captured traffic through two nodes in network namespaces arrives intact
//! either way, each shard's connections ride its own HBONE connection (a node without shards keeps one), and the
//! nodes drain and exit on SIGTERM. Needs root (CI runs as root).
#![allow(clippy::unwrap_used)] // a test panics to fail

use std::net::Ipv4Addr;
use std::time::Duration;

use weft_conformance::eventually;
use weft_conformance::netmesh::{Layout, NetMesh, connect, echo_through_capture, yaml};
use weft_devmesh::workload;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sharded_nodes_carry_captured_traffic_on_one_hbone_connection_per_shard() {
    // Connections one after another stay on the capture listener's home shard (one that ends late may push the
    // next past the spill margin): each shard opens at most one HBONE connection, and reuses it.
    carry_six_exchanges("sh", 13, "2", 2, 1..=2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_without_shards_carry_captured_traffic_on_the_worker_threads() {
    // One pool for the node: one HBONE connection for all six.
    carry_six_exchanges("ns", 14, "0", 0, 1..=1).await;
}

/// Two nodes with `--shards <shards>` (in 10.248.<net>.0/24): six captured 200 KB echoes arrive intact and are
/// logged whole on both nodes, node A made `hbone` HBONE connections, node B's start line says `logged` shards, and
/// both drain and exit on SIGTERM.
async fn carry_six_exchanges(
    name: &str,
    net: u8,
    shards: &str,
    logged: u64,
    hbone: std::ops::RangeInclusive<u64>,
) {
    let (c, s) = (
        Ipv4Addr::new(10, 248, net, 1),
        Ipv4Addr::new(10, 248, net, 2),
    );
    let mut layout = Layout::new(c, s, 24);
    layout.flags_a.extend(["--shards".into(), shards.into()]);
    layout.flags_b.extend(["--shards".into(), shards.into()]);
    let mut mesh = NetMesh::start_with(name, &layout, &yaml(c, s), "info")
        .await
        .expect("network namespaces (needs root)");
    let dst = mesh.server();
    let _echo = mesh.spawn_echo();
    let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();

    // The first exchange waits for the echo server; then five more, one connection each.
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
    let dump = mesh.a.config_dump().await.unwrap();
    let created = dump["connections"]["hboneCreated"].as_u64();
    assert!(
        created.is_some_and(|n| hbone.contains(&n)),
        "HBONE connections created: {} (expected {hbone:?})",
        dump["connections"]
    );
    let starting = mesh
        .b
        .log_lines()
        .into_iter()
        .find(|l| l["message"] == "weft starting")
        .expect("node B's start line");
    assert_eq!(starting["shards"], logged, "{starting}");
    // With shards the worker threads only keep the books (one); without, `auto` gives at least two.
    let workers = starting["worker_threads"].as_u64().unwrap_or(0);
    assert!(
        if logged > 0 {
            workers == 1
        } else {
            workers >= 2
        },
        "{starting}"
    );

    // SIGTERM: both nodes drain and exit by themselves.
    assert!(
        mesh.a.terminate(Duration::from_secs(20)).await,
        "node A did not exit on SIGTERM"
    );
    assert!(
        mesh.b.terminate(Duration::from_secs(20)).await,
        "node B did not exit on SIGTERM"
    );
}
