//! `weft demo`: weft's main job on one machine, no Kubernetes. Two weft nodes run as real processes on 127.0.0.x,
//! an echo workload sits behind node B, a client workload on node A sends traffic through node A's SOCKS5
//! listener; node A tunnels it over mutual-TLS HBONE to node B, which checks the client's SPIFFE identity and
//! hands the bytes to the workload. The output shows the bytes and the identities each side verified.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, bail};
use weft_devmesh::{NodeOptions, NodeProcess, socks5, workload};

use crate::cli::DemoArgs;

const CLIENT_IP: Ipv4Addr = Ipv4Addr::new(127, 0, 1, 1);
const ECHO_IP: Ipv4Addr = Ipv4Addr::new(127, 0, 2, 1);
const LEGACY_IP: Ipv4Addr = Ipv4Addr::new(127, 0, 2, 2);
const ECHO_VIP: Ipv4Addr = Ipv4Addr::new(127, 10, 0, 1);

fn mesh_yaml() -> String {
    format!(
        r#"# A two-node mesh on this machine. Format: ztunnel's local config (weft accepts it as is).
workloads:
- uid: Kubernetes//Pod/default/sleep-1
  name: sleep-1
  namespace: default
  serviceAccount: sleep
  workloadName: sleep
  canonicalName: sleep
  workloadIps: [{CLIENT_IP}]
  protocol: HBONE
  node: node-a
  services: {{}}
- uid: Kubernetes//Pod/default/echo-1
  name: echo-1
  namespace: default
  serviceAccount: echo
  workloadName: echo
  canonicalName: echo
  workloadIps: [{ECHO_IP}]
  protocol: HBONE
  node: node-b
  services:
    default/echo.default.svc.cluster.local:
      80: 8080
- uid: Kubernetes//Pod/legacy/db-1
  name: db-1
  namespace: legacy
  workloadIps: [{LEGACY_IP}]
  protocol: TCP
  node: node-b
  services: {{}}
services:
- name: echo
  namespace: default
  hostname: echo.default.svc.cluster.local
  vips: ["/{ECHO_VIP}"]
  ports:
    80: 8080
"#
    )
}

fn field<'a>(v: &'a serde_json::Value, k: &str) -> &'a str {
    v.get(k).and_then(|x| x.as_str()).unwrap_or("")
}

async fn send(node_a: &NodeProcess, dst: SocketAddr, what: &str) -> anyhow::Result<()> {
    let msg = format!("hello {what} from sleep-1");
    let s = socks5::connect(node_a.socks5, Some(IpAddr::V4(CLIENT_IP)), dst)
        .await
        .with_context(|| format!("SOCKS5 connect to {dst} via node-a"))?;
    let back = workload::round_trip(s, msg.as_bytes()).await?;
    if back != msg.as_bytes() {
        bail!(
            "echo mismatch for {dst}: sent {msg:?}, got {:?}",
            String::from_utf8_lossy(&back)
        );
    }
    println!(
        "  sleep-1 ({CLIENT_IP}) -> {dst:<17} {what:<28} echoed {} bytes OK",
        back.len()
    );
    Ok(())
}

async fn demo(args: DemoArgs, dir: &Path) -> anyhow::Result<()> {
    let weft = std::env::current_exe()?;
    let ca = dir.join("ca");
    weft_devmesh::write_dev_ca(&ca, "cluster.local")?;
    let config = dir.join("mesh.yaml");
    std::fs::write(&config, mesh_yaml())?;
    let (_, _echo) = workload::echo_server(SocketAddr::from((ECHO_IP, 8080))).await?;
    let (_, _legacy) = workload::echo_server(SocketAddr::from((LEGACY_IP, 8080))).await?;

    println!(
        "weft demo: two nodes on this machine (files in {})",
        dir.display()
    );
    let mut nodes = Vec::new();
    for (name, ip) in [("node-a", [127, 0, 1, 254]), ("node-b", [127, 0, 2, 254])] {
        let opts = NodeOptions::loopback(name, IpAddr::V4(Ipv4Addr::from(ip)), &config, &ca, dir);
        let mut n = NodeProcess::spawn(&weft, &opts)?;
        n.wait_ready(Duration::from_secs(20))
            .await
            .map_err(anyhow::Error::msg)?;
        println!(
            "  {name}: ready (admin http://{}/config_dump, log {})",
            n.admin,
            n.log_path.display()
        );
        nodes.push(n);
    }
    println!(
        "\ntraffic (client workload on node-a, via node-a's SOCKS5 {}):",
        nodes[0].socks5
    );
    send(
        &nodes[0],
        SocketAddr::from((ECHO_VIP, 80)),
        "service echo (VIP:80)",
    )
    .await?;
    send(
        &nodes[0],
        SocketAddr::from((ECHO_IP, 8080)),
        "workload echo-1",
    )
    .await?;
    send(
        &nodes[0],
        SocketAddr::from((LEGACY_IP, 8080)),
        "plain-TCP workload db-1",
    )
    .await?;
    // Node B logs a connection when it closes, just after the client saw its echo: wait for both HBONE ones.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while nodes[1].access_logs().len() < 2 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    println!("\nwhat node-b saw (inbound, identities verified by mutual TLS):");
    for l in nodes[1].access_logs() {
        println!(
            "  {} -> {}  peer identity {}  served as {}  {} bytes in, {} out",
            field(&l, "src.addr"),
            field(&l, "dst.addr"),
            field(&l, "src.identity"),
            field(&l, "dst.identity"),
            l.get("bytes_sent").cloned().unwrap_or_default(),
            l.get("bytes_recv").cloned().unwrap_or_default(),
        );
    }
    println!("\nwhat node-a did (outbound):");
    for l in nodes[0].access_logs() {
        let via = match field(&l, "dst.hbone_addr") {
            "" => "plain TCP (destination does not speak HBONE)".to_owned(),
            a => format!("HBONE via {a}, server proved {}", field(&l, "dst.identity")),
        };
        println!(
            "  {} -> {}  {}",
            field(&l, "src.addr"),
            field(&l, "dst.addr"),
            via
        );
    }
    println!("\ncertificates (in memory only, one per local identity):");
    for n in &nodes {
        let dump = n.config_dump().await.map_err(anyhow::Error::msg)?;
        for c in dump["certificates"].as_array().cloned().unwrap_or_default() {
            let leaf = &c["certChain"][0];
            println!(
                "  {}: {} {} serial {} expires {}",
                n.name,
                field(&c, "identity"),
                field(&c, "state"),
                field(leaf, "serialNumber"),
                field(leaf, "expirationTime")
            );
        }
    }
    println!("\nplugins (sandboxed Wasm; replace or add them in the mesh file):");
    for n in &nodes {
        let dump = n.config_dump().await.map_err(anyhow::Error::msg)?;
        let plugins: Vec<String> = dump["plugins"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .map(|p| {
                format!(
                    "{} ({}, {})",
                    field(p, "name"),
                    field(p, "kind"),
                    field(p, "state")
                )
            })
            .collect();
        println!("  {}: {}", n.name, plugins.join(", "));
    }
    let scrape = nodes[1].scrape().await.map_err(anyhow::Error::msg)?;
    if let Some(line) = scrape
        .lines()
        .find(|l| l.starts_with("istio_tcp_connections_opened_total{") && l.contains("sa/sleep"))
    {
        println!("  node-b /stats/prometheus: {line}");
    }
    if args.keep {
        println!(
            "\nmesh running; try: curl -s http://{}/config_dump ; Ctrl-C to stop",
            nodes[0].admin
        );
        tokio::signal::ctrl_c().await?;
    }
    for n in &mut nodes {
        let clean = n.terminate(Duration::from_secs(10)).await;
        println!(
            "{}: {}",
            n.name,
            if clean {
                "drained and stopped"
            } else {
                "killed after timeout"
            }
        );
    }
    Ok(())
}

/// Run the demo.
pub fn run(args: DemoArgs) -> anyhow::Result<()> {
    let dir = std::env::temp_dir().join(format!("weft-demo-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let r = rt.block_on(demo(args, &dir));
    if r.is_ok() {
        let _ = std::fs::remove_dir_all(&dir);
    } else {
        eprintln!("demo failed; node logs kept in {}", dir.display());
    }
    r
}
