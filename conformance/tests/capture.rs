//! Traffic capture as on a cluster (see `weft_conformance::netmesh`): an unmodified client in node A's namespace is
//! redirected to weft's 15001 and tunnelled over HBONE to node B; a non-mesh client's plaintext reaches node B's
//! 15006. Needs root (CI runs as root).
#![allow(clippy::unwrap_used)] // a test panics to fail

use std::time::Duration;

use weft_conformance::netmesh::{NetMesh, connect, echo_through_capture};
use weft_conformance::{eventually, metric_sum};
use weft_devmesh::workload;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn captured_traffic_goes_through_hbone_and_plaintext_inbound_works() {
    let mut mesh = NetMesh::start("c", 7, "info")
        .await
        .expect("network namespaces (needs root)");
    let dst = mesh.server();
    let _echo = mesh.spawn_echo();
    let mut data: Vec<u8> = (0..1_000_000u32).map(|i| (i % 253) as u8).collect();
    data.push(7);

    // 1. An unmodified client dials the server; capture sends it through weft and HBONE.
    let back = echo_through_capture(&mesh.ns_a, dst, &data).await;
    assert!(
        back == data,
        "captured echo corrupted: {} bytes back",
        back.len()
    );
    let inbound = eventually(
        Duration::from_secs(5),
        "node B inbound HBONE log",
        || async {
            mesh.b
                .access_logs()
                .into_iter()
                .find(|l| l["src.identity"].is_string())
        },
    )
    .await;
    assert_eq!(
        inbound["src.identity"], "spiffe://cluster.local/ns/default/sa/client",
        "{inbound}"
    );
    assert_eq!(inbound["dst.addr"], dst.to_string());
    assert_eq!(inbound["bytes_sent"], data.len());
    let outbound = eventually(Duration::from_secs(30), "node A outbound log", || async {
        mesh.a
            .access_logs()
            .into_iter()
            .find(|l| l["bytes_sent"] == data.len())
    })
    .await;
    assert_eq!(
        outbound["dst.hbone_addr"],
        format!("{}:15008", mesh.server_ip),
        "{outbound}"
    );
    assert_eq!(outbound["direction"], "outbound");

    // 2. A non-mesh client (socket marked, so node A's capture skips it) reaches node B in plaintext via 15006.
    let back = mesh
        .ns_a
        .run(move || async move {
            workload::round_trip(connect(dst, true).await?, b"plaintext hello").await
        })
        .join()
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(back, b"plaintext hello");
    let m = eventually(
        Duration::from_secs(5),
        "plaintext inbound metric",
        || async {
            let m = mesh.b.scrape().await.ok()?;
            (metric_sum(
                &m,
                "weft_connections_closed_total{direction=\"inbound\",transport=\"plaintext\"}",
            ) == 1.0)
                .then_some(m)
        },
    )
    .await;
    assert!(
        metric_sum(
            &m,
            "weft_connections_opened_total{direction=\"inbound\",transport=\"hbone\"}"
        ) >= 1.0,
        "{m}"
    );
    let plain = mesh
        .b
        .access_logs()
        .into_iter()
        .find(|l| l.get("src.identity").is_none())
        .unwrap();
    assert_eq!(plain["bytes_sent"], 15);
    assert!(mesh.a.terminate(Duration::from_secs(10)).await);
    assert!(mesh.b.terminate(Duration::from_secs(10)).await);
}

/// One dual-stack capture listener (`[::]:15001`) takes IPv4 and IPv6 connections alike: an IPv4 client arrives as
/// an IPv4-mapped address and must still be matched to its workload and its original destination.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dual_stack_capture_listener_serves_both_families() {
    use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
    use weft_conformance::netmesh::Layout;
    let (c4, s4) = (Ipv4Addr::new(10, 248, 12, 1), Ipv4Addr::new(10, 248, 12, 2));
    let (c6, s6) = (
        Ipv6Addr::new(0xfd00, 0, 0, 12, 0, 0, 0, 1),
        Ipv6Addr::new(0xfd00, 0, 0, 12, 0, 0, 0, 2),
    );
    let mut layout = Layout::new(c4, s4, 24);
    layout.extra_a.push(format!("{c6}/64"));
    layout.extra_b.push(format!("{s6}/64"));
    layout.capture_ipv6 = true;
    layout
        .flags_a
        .extend(["--outbound".into(), "[::]:15001".into()]);
    layout
        .flags_b
        .extend(["--hbone".into(), "workloads".into()]);
    let yaml = weft_conformance::netmesh::yaml(c4, s4)
        .replace(&format!("[{c4}]"), &format!("[{c4}, \"{c6}\"]"))
        .replace(&format!("[{s4}]"), &format!("[{s4}, \"{s6}\"]"));
    let mesh = NetMesh::start_with("d", &layout, &yaml, "info")
        .await
        .expect("network namespaces (needs root)");
    let dsts = [SocketAddr::from((s4, 8080)), SocketAddr::from((s6, 8080))];
    let (tx, rx) = std::sync::mpsc::channel();
    let _echo = mesh.ns_b.run(move || async move {
        let mut tasks = Vec::new();
        for d in dsts {
            tasks.push(workload::echo_server(d).await.unwrap().1);
        }
        tx.send(()).unwrap();
        for t in tasks {
            let _ = t.await;
        }
    });
    rx.recv_timeout(Duration::from_secs(30)).unwrap();
    for dst in dsts {
        let back = mesh
            .ns_a
            .run(move || async move {
                workload::round_trip(connect(dst, false).await?, b"dual stack").await
            })
            .join()
            .unwrap()
            .unwrap()
            .unwrap_or_else(|e| panic!("{dst}: {e}"));
        assert_eq!(back, b"dual stack", "{dst}");
    }
    let logs = eventually(
        Duration::from_secs(30),
        "two inbound HBONE logs",
        || async {
            let l = mesh.b.access_logs();
            (l.len() >= 2).then_some(l)
        },
    )
    .await;
    for l in &logs {
        assert_eq!(
            l["src.identity"], "spiffe://cluster.local/ns/default/sa/client",
            "{l}"
        );
    }
    let srcs: Vec<String> = logs
        .iter()
        .map(|l| l["src.addr"].as_str().unwrap().to_owned())
        .collect();
    assert!(
        srcs.iter().any(|s| s.starts_with(&c4.to_string())),
        "{srcs:?}"
    );
    assert!(
        srcs.iter().any(|s| s.starts_with(&format!("[{c6}]"))),
        "{srcs:?}"
    );
}

/// The peer the application on node B sees for a connection from node A's client through capture and HBONE: in
/// node mode weft dials it from node B's own address unless `--original-source true`; with it, from the client's
/// address, where node B's capture routes the replies back to weft (here as istio-cni's pod rules do: weft's
/// marked connections set connmark 0x111, replies carrying it are routed to the local table).
async fn peer_seen_by_the_app(tag: &str, subnet: u8, original_source: bool) -> (String, NetMesh) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use weft_conformance::netmesh::{Layout, yaml};
    let (c, s) = (
        std::net::Ipv4Addr::new(10, 248, subnet, 1),
        std::net::Ipv4Addr::new(10, 248, subnet, 2),
    );
    let mut layout = Layout::new(c, s, 24);
    if original_source {
        layout.flags_b = vec!["--original-source".into(), "true".into()];
    }
    let mesh = NetMesh::start_with(tag, &layout, &yaml(c, s), "info")
        .await
        .expect("network namespaces (needs root)");
    for rule in [
        "iptables -t mangle -A PREROUTING -m mark --mark 0x539/0xfff -j CONNMARK --set-xmark 0x111/0xfff",
        "iptables -t mangle -A OUTPUT -m connmark --mark 0x111/0xfff -j CONNMARK --restore-mark --nfmask \
         0xffffffff --ctmask 0xffffffff",
        "ip rule add fwmark 0x111/0xfff pref 32764 lookup 100",
        "ip route add local 0.0.0.0/0 dev lo table 100",
    ] {
        let words: Vec<&str> = rule.split_whitespace().collect();
        mesh.ns_b.exec(words[0], &words[1..]).unwrap();
    }
    // A server on the captured port that writes the peer it sees and closes.
    let dst = mesh.server();
    let (tx, rx) = std::sync::mpsc::channel();
    let _server = mesh.ns_b.run(move || async move {
        let l = tokio::net::TcpListener::bind(dst).await.unwrap();
        tx.send(()).unwrap();
        while let Ok((mut s, peer)) = l.accept().await {
            let _ = s.write_all(peer.ip().to_string().as_bytes()).await;
        }
    });
    rx.recv_timeout(Duration::from_secs(30)).unwrap();
    let h = mesh.ns_a.run(move || async move {
        let mut s = connect(dst, false).await?;
        let mut seen = String::new();
        s.read_to_string(&mut seen).await?;
        Ok::<String, std::io::Error>(seen)
    });
    let seen = tokio::task::spawn_blocking(move || h.join())
        .await
        .unwrap()
        .unwrap()
        .unwrap()
        .unwrap();
    (seen, mesh)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_mode_keeps_the_client_address_only_when_asked() {
    let (seen, mesh) = peer_seen_by_the_app("os", 13, true).await;
    assert_eq!(seen, mesh.client_ip.to_string());
    let (seen, mesh) = peer_seen_by_the_app("od", 14, false).await;
    assert_eq!(seen, mesh.server_ip.to_string());
}
