//! Throughput, connection rate and latency through two weft nodes, as ratios to direct TCP measured in the same run,
//! in the topology of REFERENCE.md §I: node A and node B are network namespaces joined by a veth pair; the client's
//! connections in node A are captured by iptables to weft's 15001 and tunnelled over mTLS HBONE to node B, whose weft
//! hands them to the server. "Direct" is the same client and server with the capture skipped (marked socket).
//! Client, servers and both proxies share the machine's cores. Needs root and a release build of weft:
//!   cargo build --release -p weft && cargo bench -p weft-conformance --bench mesh
//! Environment: BENCH_MIB (bulk size, default 1024), BENCH_SECS (connection-rate window, default 3), BENCH_CONC
//! (concurrent connectors, default 16), BENCH_BULK_RUNS (default 3), BENCH_ONLY (comma list of `bulk`, `cps`, `lat`:
//! run only those parts, e.g. to profile one of them; default all).
#![allow(clippy::unwrap_used)] // a test panics to fail

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use weft_conformance::netmesh::{NetMesh, connect};

const SINK: u16 = 9000;
const RR: u16 = 9001;

fn env_u64(k: &str, d: u64) -> u64 {
    std::env::var(k)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(d)
}

/// Servers in node B: a sink (reads to EOF, answers with the byte count) and a one-byte request/response server.
async fn servers(ip: std::net::Ipv4Addr) {
    let sink = tokio::net::TcpListener::bind((ip, SINK))
        .await
        .expect("sink");
    let rr = tokio::net::TcpListener::bind((ip, RR)).await.expect("rr");
    tokio::spawn(async move {
        while let Ok((mut s, _)) = sink.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 256 * 1024];
                let mut n = 0u64;
                while let Ok(k) = s.read(&mut buf).await {
                    if k == 0 {
                        break;
                    }
                    n += k as u64;
                }
                let _ = s.write_all(&n.to_be_bytes()).await;
            });
        }
    });
    while let Ok((mut s, _)) = rr.accept().await {
        let _ = s.set_nodelay(true);
        tokio::spawn(async move {
            let mut b = [0u8; 1];
            while let Ok(1) = s.read(&mut b).await {
                if s.write_all(&b).await.is_err() {
                    break;
                }
            }
        });
    }
}

async fn bulk(dst: SocketAddr, bypass: bool, bytes: u64) -> f64 {
    let mut s = connect(dst, bypass).await.expect("connect");
    let buf = vec![0x5au8; 256 * 1024];
    let start = Instant::now();
    let mut left = bytes;
    while left > 0 {
        let n = left.min(buf.len() as u64) as usize;
        s.write_all(&buf[..n]).await.expect("write");
        left -= n as u64;
    }
    s.shutdown().await.expect("shutdown");
    let mut got = [0u8; 8];
    s.read_exact(&mut got).await.expect("count");
    assert_eq!(u64::from_be_bytes(got), bytes, "sink byte count");
    bytes as f64 * 8.0 / start.elapsed().as_secs_f64() / 1e9
}

async fn conn_rate(
    dst: SocketAddr,
    bypass: bool,
    window: Duration,
    concurrency: usize,
) -> (f64, u64) {
    let deadline = Instant::now() + window;
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        tasks.push(tokio::spawn(async move {
            let (mut ok, mut failed) = (0u64, 0u64);
            while Instant::now() < deadline {
                let r = async {
                    let mut s = connect(dst, bypass).await?;
                    s.write_all(b"q").await?;
                    let mut b = [0u8; 1];
                    s.read_exact(&mut b).await?;
                    std::io::Result::Ok(())
                }
                .await;
                if r.is_ok() { ok += 1 } else { failed += 1 }
            }
            (ok, failed)
        }));
    }
    let (mut ok, mut failed) = (0, 0);
    for t in tasks {
        let (o, f) = t.await.expect("task");
        ok += o;
        failed += f;
    }
    (ok as f64 / start.elapsed().as_secs_f64(), failed)
}

async fn latency(dst: SocketAddr, bypass: bool, n: usize) -> Duration {
    let mut s = connect(dst, bypass).await.expect("connect");
    let mut b = [0u8; 1];
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        s.write_all(b"p").await.expect("write");
        s.read_exact(&mut b).await.expect("read");
        samples.push(t.elapsed());
    }
    samples.sort();
    samples[n / 2]
}

/// Whether the part `what` is to run (`BENCH_ONLY` unset: every part).
fn part(what: &str) -> bool {
    std::env::var("BENCH_ONLY").map_or(true, |v| v.split(',').any(|p| p.trim() == what))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    // `cargo bench` passes --bench; nothing to parse.
    let mut mesh = NetMesh::start("m", 9, "warn")
        .await
        .expect("network namespaces (needs root) and a release weft");
    let server_ip = mesh.server_ip;
    let _srv = mesh.ns_b.run(move || servers(server_ip));
    let mib = env_u64("BENCH_MIB", 1024);
    let secs = env_u64("BENCH_SECS", 3);
    let runs = env_u64("BENCH_BULK_RUNS", 3);
    let sink = SocketAddr::from((server_ip, SINK));
    let rr = SocketAddr::from((server_ip, RR));
    let conc = env_u64("BENCH_CONC", 16) as usize;
    let report = mesh
        .ns_a
        .run(move || async move {
            tokio::time::sleep(Duration::from_millis(200)).await;
            // Warm up both paths (certificates, pooled HBONE connection).
            let _ = conn_rate(rr, false, Duration::from_millis(300), 4).await;
            let _ = conn_rate(rr, true, Duration::from_millis(300), 4).await;
            let (mut tp_d, mut tp_m) = (Vec::new(), Vec::new());
            for _ in 0..if part("bulk") { runs } else { 0 } {
                tp_d.push(bulk(sink, true, mib << 20).await);
                tp_m.push(bulk(sink, false, mib << 20).await);
            }
            let (mut cps_d, mut fail_d, mut cps_m, mut fail_m) = (f64::NAN, 0, f64::NAN, 0);
            if part("cps") {
                (cps_d, fail_d) = conn_rate(rr, true, Duration::from_secs(secs), conc).await;
                (cps_m, fail_m) = conn_rate(rr, false, Duration::from_secs(secs), conc).await;
            }
            let (mut lat_d, mut lat_m) = (Duration::ZERO, Duration::ZERO);
            if part("lat") {
                lat_d = latency(rr, true, 5000).await;
                lat_m = latency(rr, false, 5000).await;
            }
            (
                median(tp_d),
                median(tp_m),
                cps_d,
                cps_m,
                fail_d,
                fail_m,
                lat_d,
                lat_m,
            )
        })
        .join()
        .expect("bench thread")
        .expect("netns");
    let (tp_d, tp_m, cps_d, cps_m, fail_d, fail_m, lat_d, lat_m) = report;
    println!(
        "weft mesh bench (two netns nodes, capture -> HBONE/mTLS -> node B; direct = same path, capture skipped)"
    );
    println!(
        "  bulk, 1 flow, {mib} MiB (median of {runs}):  direct {tp_d:6.2} Gb/s   mesh {tp_m:6.2} Gb/s   ratio {:.3}",
        tp_m / tp_d
    );
    println!(
        "  new connections/s, {conc} concurrent, {secs}s: direct {cps_d:8.0}        mesh {cps_m:8.0}        ratio {:.3}   (failed: direct {fail_d}, mesh {fail_m})",
        cps_m / cps_d
    );
    println!(
        "  keep-alive 1-byte RTT (median of 5000): direct {:7.1} us   mesh {:7.1} us   added {:.1} us",
        lat_d.as_secs_f64() * 1e6,
        lat_m.as_secs_f64() * 1e6,
        (lat_m.as_secs_f64() - lat_d.as_secs_f64()) * 1e6
    );
    mesh.a.terminate(Duration::from_secs(5)).await;
    mesh.b.terminate(Duration::from_secs(5)).await;
}
