//! weft control with 500 simulated nodes: the server runs as its own process (the release `weft-control`
//! binary), each node is a real TLS gRPC stream from this process subscribed to Address, Authorization and
//! TypedExtensionConfig, and ACKs every response at once. Measures the server's memory (RSS idle, with every node
//! synced, peak) and the push fan-out: a plugin file edited → every node has received and ACKed the new version
//! (median and p99 over repeated pushes; the edit's detection by the directory poll is included), and the spread
//! from the first node to the last.
//!   cargo bench -p weft-control --bench fanout
//! Environment: BENCH_NODES (default 500), BENCH_PUSHES (default 30), BENCH_CODE_KIB (inline plugin code size,
//! default 64), BENCH_WORKLOADS (workloads in the mesh file, default 100).
#![allow(clippy::unwrap_used)] // a bench panics to fail

#[path = "../tests/common/client.rs"]
mod client;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use client::{AdsClient, channel, node};
use tokio::sync::mpsc;
use weft_proto::type_url::{ADDRESS, AUTHORIZATION, EXTENSION_CONFIG};

fn env_usize(k: &str, d: usize) -> usize {
    std::env::var(k)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(d)
}

fn free_port() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

fn write_atomic(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp-write");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

fn plugin(round: usize) -> String {
    format!(
        "kind: WeftPlugin\nmetadata: {{name: bench}}\nspec:\n  url: file://bench.wasm\n  kind: policy\n  \
         pluginConfig: {{round: {round}}}\n"
    )
}

fn rss_kib(pid: u32, key: &str) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

fn pct(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i.min(v.len() - 1)]
}

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// What a node saw of the bench plugin: (node, version, when).
type Seen = (usize, String, Instant);

async fn run_node(
    i: usize,
    addr: SocketAddr,
    root: String,
    seen: mpsc::UnboundedSender<Seen>,
    synced: mpsc::UnboundedSender<usize>,
    permit: tokio::sync::OwnedSemaphorePermit,
) {
    // The permit bounds the connects in flight; it goes once this node is synced (held for the node's whole life,
    // only the first permits' worth of nodes would ever connect).
    let mut permit = Some(permit);
    let name = format!("node-{i}");
    let mut c = AdsClient::open(
        channel(addr, &root),
        Some(&format!("token-{name}")),
        node(&name),
    )
    .await
    .unwrap();
    for t in [ADDRESS, AUTHORIZATION, EXTENSION_CONFIG] {
        c.subscribe(t, HashMap::new()).await;
    }
    let mut answered = 0;
    loop {
        let Some(r) = c.next().await else { return };
        let now = Instant::now();
        c.ack(&r).await;
        if r.type_url == EXTENSION_CONFIG {
            for res in &r.resources {
                let _ = seen.send((i, res.version.clone(), now));
            }
        }
        answered += 1;
        if answered == 3 {
            let _ = synced.send(i);
            permit.take();
        }
    }
}

fn main() {
    let nodes = env_usize("BENCH_NODES", 500);
    let pushes = env_usize("BENCH_PUSHES", 30);
    let code_kib = env_usize("BENCH_CODE_KIB", 64);
    let workloads = env_usize("BENCH_WORKLOADS", 100);
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    weft_identity::ca::write_root(&d.join("ca"), "cluster.local", Duration::from_secs(86400))
        .unwrap();
    let root = std::fs::read_to_string(d.join("ca/root-cert.pem")).unwrap();
    let mut tokens = String::from("tokens:\n");
    for i in 0..nodes {
        tokens.push_str(&format!(
            "- {{token: token-node-{i}, node: node-{i}, identity: spiffe://cluster.local/ns/weft-system/sa/weft}}\n"
        ));
    }
    std::fs::write(d.join("tokens.yaml"), tokens).unwrap();
    let mut mesh = String::from("workloads:\n");
    for w in 0..workloads {
        mesh.push_str(&format!(
            "- uid: Kubernetes//Pod/default/w-{w}\n  name: w-{w}\n  namespace: default\n  workloadIps: [10.1.{}.{}]\n  \
             protocol: HBONE\n  node: node-{}\n",
            w / 250,
            w % 250 + 1,
            w % nodes.max(1)
        ));
    }
    std::fs::write(d.join("mesh.yaml"), mesh).unwrap();
    std::fs::create_dir(d.join("plugins")).unwrap();
    let code: Vec<u8> = (0..code_kib * 1024).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(d.join("plugins/bench.wasm"), code).unwrap();
    write_atomic(&d.join("plugins/bench.yaml"), &plugin(0));

    let addr = free_port();
    let server = Server(
        Command::new(env!("CARGO_BIN_EXE_weft-control"))
            .args([
                "--listen",
                &addr.to_string(),
                "--status",
                "off",
                "--metrics",
                "off",
            ])
            .args(["--poll", "10ms", "--log", "warn"])
            .arg("--ca-dir")
            .arg(d.join("ca"))
            .arg("--tokens")
            .arg(d.join("tokens.yaml"))
            .arg("--mesh")
            .arg(d.join("mesh.yaml"))
            .arg("--plugins-dir")
            .arg(d.join("plugins"))
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let pid = server.0.id();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        // Wait for the listener.
        let deadline = Instant::now() + Duration::from_secs(60);
        while tokio::net::TcpStream::connect(addr).await.is_err() {
            assert!(Instant::now() < deadline, "weft-control did not start");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let idle = rss_kib(pid, "VmRSS:");
        let (seen_tx, mut seen) = mpsc::unbounded_channel();
        let (synced_tx, mut synced) = mpsc::unbounded_channel();
        let started = Instant::now();
        let gate = Arc::new(tokio::sync::Semaphore::new(32));
        for i in 0..nodes {
            let (root, seen_tx, synced_tx, gate) =
                (root.clone(), seen_tx.clone(), synced_tx.clone(), gate.clone());
            let permit = gate.acquire_owned().await.unwrap();
            tokio::spawn(run_node(i, addr, root, seen_tx, synced_tx, permit));
        }
        for _ in 0..nodes {
            tokio::time::timeout(Duration::from_secs(120), synced.recv())
                .await
                .expect("nodes synced")
                .unwrap();
        }
        let connect_time = started.elapsed();
        let loaded = rss_kib(pid, "VmRSS:");
        while seen.try_recv().is_ok() {}
        let mut fanout = Vec::new();
        let mut spread = Vec::new();
        for round in 1..=pushes {
            let t0 = Instant::now();
            write_atomic(&d.join("plugins/bench.yaml"), &plugin(round));
            let mut version: Option<String> = None;
            let mut got = vec![false; nodes];
            let (mut n, mut first, mut last) = (0, None, t0);
            while n < nodes {
                let (i, v, at) = tokio::time::timeout(Duration::from_secs(120), seen.recv())
                    .await
                    .expect("push reached every node")
                    .unwrap();
                let want = version.get_or_insert_with(|| v.clone());
                if *want != v || got[i] {
                    continue;
                }
                got[i] = true;
                n += 1;
                first.get_or_insert(at);
                last = last.max(at);
            }
            fanout.push(last - t0);
            spread.push(last - first.unwrap_or(t0));
        }
        let peak = rss_kib(pid, "VmHWM:");
        let ms = |d: Duration| format!("{:.1} ms", d.as_secs_f64() * 1e3);
        println!(
            "weft control fan-out: {nodes} nodes (real TLS gRPC streams, 3 types each), {workloads} workloads, \
             {pushes} pushes of a {code_kib} KiB inline plugin"
        );
        println!(
            "  server RSS: idle {}, {nodes} nodes synced {} (+{:.0} KiB/node), peak {}",
            mib(idle),
            mib(loaded),
            loaded.saturating_sub(idle) as f64 / nodes.max(1) as f64,
            mib(peak)
        );
        println!("  {nodes} nodes connected and synced in {}", ms(connect_time));
        println!(
            "  edit -> all {nodes} ACKed: median {}, p99 {} (includes the 10 ms directory poll)",
            ms(pct(&mut fanout, 0.5)),
            ms(pct(&mut fanout, 0.99))
        );
        println!(
            "  first -> last node: median {}, p99 {}",
            ms(pct(&mut spread, 0.5)),
            ms(pct(&mut spread, 0.99))
        );
    });
    drop(server);
}
