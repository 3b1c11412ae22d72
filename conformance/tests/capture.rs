//! Traffic capture as on a cluster: two network namespaces joined by a veth pair stand for two nodes. On node A an
//! iptables REDIRECT sends the client's connections to weft's 15001 (weft's own sockets carry mark 0x539 and are
//! skipped); node A tunnels them over HBONE to node B. On node B a non-mesh client's plaintext connection is
//! redirected to 15006. Needs root (CI runs as root).

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use weft_conformance::{eventually, metric_sum};
use weft_devmesh::netns::{Netns, link};
use weft_devmesh::{NodeOptions, NodeProcess, workload};

const MARK: &str = "0x539";

fn yaml(client: Ipv4Addr, server: Ipv4Addr) -> String {
    format!(
        r#"workloads:
- uid: Kubernetes//Pod/default/client
  name: client
  namespace: default
  serviceAccount: client
  workloadIps: [{client}]
  protocol: HBONE
  node: node-a
  services: {{}}
- uid: Kubernetes//Pod/default/echo
  name: echo
  namespace: default
  serviceAccount: echo
  workloadIps: [{server}]
  protocol: HBONE
  node: node-b
  services: {{}}
"#
    )
}

fn node(name: &str, ns: &Netns, config: &std::path::Path, ca: &std::path::Path, dir: &std::path::Path, extra: &[&str]) -> NodeOptions {
    NodeOptions {
        name: name.into(),
        control_ip: "127.0.0.1".parse().unwrap(),
        config: config.into(),
        ca_dir: ca.into(),
        log_path: dir.join(format!("{name}.log")),
        netns: Some(ns.name.clone()),
        extra: extra.iter().map(|s| s.to_string()).collect(),
        log: "info".into(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn captured_traffic_goes_through_hbone_and_plaintext_inbound_works() {
    let id = std::process::id() % 100_000;
    let ns_a = Netns::create(&format!("weft-a-{id}")).expect("creating a network namespace (needs root)");
    let ns_b = Netns::create(&format!("weft-b-{id}")).unwrap();
    let (client_ip, server_ip) = (Ipv4Addr::new(10, 248, 7, 1), Ipv4Addr::new(10, 248, 7, 2));
    link(&ns_a, "wva", &format!("{client_ip}/24"), &ns_b, "wvb", &format!("{server_ip}/24")).unwrap();
    // Node A: capture every TCP connection leaving through the veth, except weft's own (marked).
    ns_a.exec(
        "iptables",
        &["-t", "nat", "-A", "OUTPUT", "-p", "tcp", "-o", "wva", "-m", "mark", "!", "--mark", MARK, "-j", "REDIRECT", "--to-ports", "15001"],
    )
    .expect("iptables in the namespace");
    // Node B: plaintext arriving for the workload port goes to weft's inbound plaintext listener.
    ns_b.exec(
        "iptables",
        &["-t", "nat", "-A", "PREROUTING", "-p", "tcp", "-i", "wvb", "--dport", "8080", "-j", "REDIRECT", "--to-ports", "15006"],
    )
    .unwrap();

    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca");
    weft_devmesh::write_dev_ca(&ca, "cluster.local").unwrap();
    let config = dir.path().join("mesh.yaml");
    std::fs::write(&config, yaml(client_ip, server_ip)).unwrap();
    let weft = weft_devmesh::weft_binary().unwrap();
    let common = ["--mark", MARK, "--socks5", "off"];
    let mut a = NodeProcess::spawn(
        &weft,
        &node("node-a", &ns_a, &config, &ca, dir.path(), &[&common[..], &["--inbound-plaintext", "off", "--hbone", "0.0.0.0:15008"]].concat()),
    )
    .unwrap();
    let mut b = NodeProcess::spawn(
        &weft,
        &node("node-b", &ns_b, &config, &ca, dir.path(), &[&common[..], &["--outbound", "off", "--hbone", "0.0.0.0:15008"]].concat()),
    )
    .unwrap();
    // The echo workload lives in node B's namespace.
    let _echo = ns_b.run(move || async move {
        let (_, t) = workload::echo_server(SocketAddr::from((server_ip, 8080))).await.unwrap();
        let _ = t.await;
    });
    a.wait_ready(Duration::from_secs(30)).await.unwrap();
    b.wait_ready(Duration::from_secs(30)).await.unwrap();

    // 1. An unmodified client in node A's namespace dials the server directly; capture sends it through weft.
    let dst = SocketAddr::from((server_ip, 8080));
    let data: Vec<u8> = (0..1_000_000u32).map(|i| (i % 253) as u8).collect();
    let sent = data.clone();
    let back = ns_a
        .run(move || async move {
            let s = tokio::net::TcpStream::connect(dst).await?;
            workload::round_trip(s, &sent).await
        })
        .join()
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(back == data, "captured echo corrupted: {} bytes back", back.len());
    let inbound = eventually(Duration::from_secs(5), "node B inbound HBONE log", || async {
        b.access_logs().into_iter().find(|l| l["src.identity"] != "")
    })
    .await;
    assert_eq!(inbound["src.identity"], "spiffe://cluster.local/ns/default/sa/client", "{inbound}");
    assert_eq!(inbound["dst.addr"], dst.to_string());
    let outbound = eventually(Duration::from_secs(5), "node A outbound log", || async { a.access_logs().into_iter().next() }).await;
    assert_eq!(outbound["dst.hbone_addr"], format!("{server_ip}:15008"), "{outbound}");
    assert_eq!(outbound["direction"], "outbound");

    // 2. A non-mesh client (its socket marked, so node A's capture skips it) reaches node B in plaintext: node B's
    //    15006 takes it, with no identity.
    let back = ns_a
        .run(move || async move {
            let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
            sock.set_mark(0x539)?;
            sock.set_nonblocking(true)?;
            let tcp = tokio::net::TcpSocket::from_std_stream(std::net::TcpStream::from(sock));
            let s = tcp.connect(dst).await?;
            workload::round_trip(s, b"plaintext hello").await
        })
        .join()
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(back, b"plaintext hello");
    let m = eventually(Duration::from_secs(5), "plaintext inbound metric", || async {
        let m = b.scrape().await.ok()?;
        (metric_sum(&m, "weft_connections_closed_total{direction=\"inbound\",transport=\"plaintext\"}") == 1.0).then_some(m)
    })
    .await;
    assert_eq!(metric_sum(&m, "weft_connections_opened_total{direction=\"inbound\",transport=\"hbone\"}"), 1.0, "{m}");
    let plain = b.access_logs().into_iter().find(|l| l["src.identity"] == "").unwrap();
    assert_eq!(plain["bytes_sent"], 15);
    assert!(a.terminate(Duration::from_secs(10)).await);
    assert!(b.terminate(Duration::from_secs(10)).await);
}
