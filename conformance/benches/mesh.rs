//! Throughput, connection rate and latency through two weft nodes, as ratios to direct TCP measured in the same run,
//! in the topology of REFERENCE.md §I: node A and node B are network namespaces joined by a veth pair; the client's
//! connections in node A are captured by iptables to weft's 15001 and tunnelled over mTLS HBONE to node B, whose weft
//! hands them to the server. "Direct" is the same client and server with the capture skipped (marked socket).
//! Client, servers and both proxies share the machine's cores. Needs root and a release build of weft:
//!   cargo build --release -p weft && cargo bench -p weft-conformance --bench mesh
//! Environment: BENCH_MIB (bulk size, default 1024), BENCH_SECS (connection-rate window, default 3), BENCH_CONC
//! (concurrent connectors, default 16), BENCH_CPS_ROUNDS (connection-rate rounds, alternating which path goes
//! first; default 2), BENCH_BULK_RUNS (default 3), BENCH_ONLY (comma list of `bulk`, `cps`, `lat`:
//! run only those parts, e.g. to profile one of them; default all).
#![allow(clippy::unwrap_used)] // a test panics to fail

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use weft_conformance::load::{close_server, conn_rate, rr_server};
use weft_conformance::netmesh::{NetMesh, connect};

const SINK: u16 = 9000;
const RR: u16 = 9001;
const CLOSE: u16 = 9002;

fn env_u64(k: &str, d: u64) -> u64 {
    std::env::var(k)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(d)
}

/// Servers in node B: a sink (reads to EOF, answers with the byte count), a one-byte request/response server
/// (keep-alive) and a one-request server that closes after its answer, as an HTTP server does for
/// `Connection: close` (so its side, not the client's, holds TIME_WAIT, as with wrk in REFERENCE.md §I: a client
/// that closes first piles up TIME_WAIT on its own ports, and `connect()` then spends its time searching for a
/// free port, which measured the client's kernel, not the path).
async fn servers(ip: std::net::Ipv4Addr) {
    let sink = tokio::net::TcpListener::bind((ip, SINK))
        .await
        .expect("sink");
    tokio::spawn(close_server(SocketAddr::from((ip, CLOSE))));
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
    let _ = rr_server(SocketAddr::from((ip, RR))).await;
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

/// CPU time (ns) used so far by every thread of process `pid` (from `/proc/<pid>/task/*/schedstat`); 0 if unknown.
fn cpu_ns(pid: Option<u32>) -> u64 {
    let Some(pid) = pid else { return 0 };
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

/// CPU both weft nodes use while `f` runs: (node A ns, node B ns, f's result).
async fn with_cpu<T>(
    pids: (Option<u32>, Option<u32>),
    f: impl Future<Output = T>,
) -> (u64, u64, T) {
    let (a0, b0) = (cpu_ns(pids.0), cpu_ns(pids.1));
    let r = f.await;
    (cpu_ns(pids.0) - a0, cpu_ns(pids.1) - b0, r)
}

#[derive(Debug, Default)]
struct Report {
    tp_d: Vec<f64>,
    tp_m: Vec<f64>,
    /// weft CPU (node A, node B) in ns over all mesh bulk runs.
    bulk_cpu: (u64, u64),
    /// (connections, failed, seconds) direct and mesh.
    cps_d: (u64, u64, f64),
    cps_m: (u64, u64, f64),
    /// weft CPU (node A, node B) in ns over the mesh connection-rate windows.
    cps_cpu: (u64, u64),
    lat_d: Duration,
    lat_m: Duration,
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
    let close = SocketAddr::from((server_ip, CLOSE));
    let cps_rounds = env_u64("BENCH_CPS_ROUNDS", 2);
    let conc = env_u64("BENCH_CONC", 16) as usize;
    let pids = (mesh.a.pid(), mesh.b.pid());
    let r = mesh
        .ns_a
        .run(move || async move {
            let mut r = Report::default();
            tokio::time::sleep(Duration::from_millis(200)).await;
            // Warm up both paths (certificates, pooled HBONE connection).
            let _ = conn_rate(close, false, Duration::from_millis(300), 4).await;
            let _ = conn_rate(close, true, Duration::from_millis(300), 4).await;
            for _ in 0..if part("bulk") { runs } else { 0 } {
                r.tp_d.push(bulk(sink, true, mib << 20).await);
                let (a, b, tp) = with_cpu(pids, bulk(sink, false, mib << 20)).await;
                r.tp_m.push(tp);
                r.bulk_cpu = (r.bulk_cpu.0 + a, r.bulk_cpu.1 + b);
            }
            if part("cps") {
                // Alternate which path goes first, so neither always runs on a machine the other warmed or loaded.
                for round in 0..cps_rounds {
                    for bypass in [round % 2 == 0, round % 2 == 1] {
                        let window = Duration::from_secs(secs);
                        let (a, b, c) =
                            with_cpu(pids, conn_rate(close, bypass, window, conc)).await;
                        let t = if bypass {
                            &mut r.cps_d
                        } else {
                            r.cps_cpu = (r.cps_cpu.0 + a, r.cps_cpu.1 + b);
                            &mut r.cps_m
                        };
                        (t.0, t.1, t.2) = (t.0 + c.0, t.1 + c.1, t.2 + c.2);
                    }
                }
            }
            if part("lat") {
                r.lat_d = latency(rr, true, 5000).await;
                r.lat_m = latency(rr, false, 5000).await;
            }
            r
        })
        .join()
        .expect("bench thread")
        .expect("netns");
    println!(
        "weft mesh bench (two netns nodes, capture -> HBONE/mTLS -> node B; direct = same path, capture skipped)"
    );
    let (tp_d, tp_m) = (median(r.tp_d.clone()), median(r.tp_m.clone()));
    let gib = (mib * r.tp_m.len() as u64) as f64 / 1024.0;
    println!(
        "  bulk, 1 flow, {mib} MiB (median of {runs}):  direct {tp_d:6.2} Gb/s   mesh {tp_m:6.2} Gb/s   ratio {:.3}   weft CPU/GiB: A {:.0} ms, B {:.0} ms",
        tp_m / tp_d,
        r.bulk_cpu.0 as f64 / 1e6 / gib,
        r.bulk_cpu.1 as f64 / 1e6 / gib,
    );
    let (cps_d, cps_m) = (r.cps_d.0 as f64 / r.cps_d.2, r.cps_m.0 as f64 / r.cps_m.2);
    let per_conn = |ns: u64| ns as f64 / 1e3 / r.cps_m.0.max(1) as f64;
    println!(
        "  new connections/s (1 byte each way, server closes), {conc} concurrent, {cps_rounds}x{secs}s: direct {cps_d:8.0}   mesh {cps_m:8.0}   ratio {:.3}   (failed: direct {}, mesh {})   weft CPU/conn: A {:.0} us, B {:.0} us",
        cps_m / cps_d,
        r.cps_d.1,
        r.cps_m.1,
        per_conn(r.cps_cpu.0),
        per_conn(r.cps_cpu.1),
    );
    println!(
        "  keep-alive 1-byte RTT (median of 5000): direct {:7.1} us   mesh {:7.1} us   added {:.1} us",
        r.lat_d.as_secs_f64() * 1e6,
        r.lat_m.as_secs_f64() * 1e6,
        (r.lat_m.as_secs_f64() - r.lat_d.as_secs_f64()) * 1e6
    );
    mesh.a.terminate(Duration::from_secs(5)).await;
    mesh.b.terminate(Duration::from_secs(5)).await;
}
