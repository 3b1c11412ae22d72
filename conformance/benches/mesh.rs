//! weft side by side with Istio's ztunnel, in the topology of REFERENCE.md §I: each proxy pair runs on its own two
//! network namespaces joined by a veth pair; the client's connections in node A are captured by iptables to the
//! proxy's 15001 and tunnelled over mTLS HBONE to node B, whose proxy hands them to the server. "direct" is the same
//! client and server with the capture skipped (a marked socket): the baseline. Client, servers and every proxy
//! share the machine's cores.
//!
//! Pairs: `weft` (its default plugins, istio-authz and istio-telemetry; no authorization policy, so istio-authz's
//! declared scope leaves every connection out and it is never called), `weft-pol` (the same with a namespace DENY
//! policy on the server's namespace that never matches: istio-authz decides every connection), `weft-np`
//! (`--default-plugins false`),
//! `weft-base` when `WEFT_BASE_BIN` names another weft build (default plugins; before and after a change, in one
//! run; with `BENCH_BASE_POLICY=1` it gets `weft-pol`'s policy, to compare a change to the decision path), and
//! `ztunnel` when `ZTUNNEL_BIN` names a ztunnel binary built from its public source ([`weft_conformance::ztunnel`];
//! without it the bench says why and runs the weft figures only: CI has no ztunnel and never needs one), and
//! `relay`, the yardstick: the same capture and hop carried by a plain TCP relay on each node
//! ([`weft_conformance::relay`]: no TLS, no HTTP/2, no policy; this bench binary again, one process a node), the
//! least work per byte any userspace node proxy could do on this path, so `relay / ztunnel` bounds what a proxy's
//! one-flow throughput and keep-alive latency against ztunnel's can be on this machine (kernel TLS, which would let a
//! proxy splice the encrypted side too, is not offered by every kernel: `/proc/sys/net/ipv4/tcp_available_ulp`; this
//! one offers none). Its connection rate and memory are no yardstick: each connection takes two 256 KiB buffers and a
//! task per node, and it is left out of the memory case. Every
//! pair stays up for the whole run (an idle pair's own background work lands on every measurement alike) and the
//! measurements alternate: each round measures every pair once, in an order rotated per round, so no pair always
//! runs on a machine another one has just warmed or loaded. Reported: the median over rounds with the spread
//! (min–max), and ratios taken per round (paired: the same figure of two pairs in the same round) with theirs.
//!
//! Figures: one-flow bulk throughput, client to server (upload) and server to client (download, `bulk down`); new
//! connections/s (1 byte each way, the server closes first, as an HTTP server does for `Connection: close`); keep-alive
//! 1-byte request latency p50/p99; a new connection's time to first byte p50/p99 (it includes the HBONE CONNECT round
//! trip); the CPU both proxies of a pair spend per GiB (of the upload) and per connection
//! (`/proc/<pid>/task/*/schedstat`); the machine's idle share during the upload (`/proc/stat`: a one-flow pipeline that
//! leaves cores idle is bound by its stages waiting on each other as well as by CPU); and, first, on fresh processes
//! after one warm-up, the CPU an idle pair uses by itself (ms per second, over 2 s), idle RSS (and its anonymous part,
//! the process's own memory) and RSS per connection while `BENCH_IDLE` idle connections are held open through each pair
//! (the bench raises RLIMIT_NOFILE for itself, the servers and the proxies, which inherit it). Only ratios mean
//! anything, and only on a quiet machine; nothing here asserts a time.
//!
//! Run for figures (root, release builds; ztunnel's certificates come from `weft-ca`, found next to `weft`):
//!   cargo build --release --workspace --bins
//!   ZTUNNEL_BIN=/path/to/ztunnel cargo bench --workspace --bench mesh
//! or build the bench in the test profile and point it at the release weft (much less to compile; the `--config`
//! optimises this crate, whose code the relay pair runs, as the dependencies already are in the test profile):
//!   WEFT_BIN=target/release/weft ZTUNNEL_BIN=... BENCH_FULL=1 cargo test -p weft-conformance --bench mesh \
//!     --config 'profile.dev.package.weft-conformance.opt-level=3'
//! Without `--bench` on its command line (`cargo test --bench mesh`) and without `BENCH_FULL=1` it is a smoke run:
//! one round of tiny sizes, every code path once. (`cargo test --workspace` alone does not build or run benches.)
//! Environment (defaults full / smoke): BENCH_ROUNDS (5 / 1), BENCH_MIB bulk size per round (2048 / 8; a transfer of a
//! few seconds, so a round is not one scheduling accident), BENCH_SECS connection-rate window per round, fractional
//! allowed (3 / 0.3), BENCH_CONC concurrent connectors (16), BENCH_LAT_N latency samples per round (5000 / 200),
//! BENCH_IDLE idle connections for the memory case, 0 skips it (10000 / 100), BENCH_LOG both proxies' log filter
//! (`info`, both proxies' default), BENCH_ONLY comma list of `mem`, `bulk`, `cps`, `lat` (run only those parts; default
//! all), BENCH_PAIRS comma list of pairs to start (default all available).
#![allow(clippy::unwrap_used)] // a bench panics to fail

use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use weft_conformance::load::{close_server, conn_rate, rr_server};
use weft_conformance::netmesh::{Layout, NetMesh, Topology, connect, yaml};
use weft_conformance::relay;
use weft_conformance::ztunnel::{NsProcess, ZtunnelMesh, ztunnel_binary};
use weft_devmesh::netns::Netns;

const SINK: u16 = 9000;
/// The server that sends: reads a byte count (8 bytes, big-endian), sends that many bytes, closes.
const SOURCE: u16 = 9003;
/// How long an idle pair's own CPU use is measured for (the memory case).
const IDLE_CPU_WINDOW: Duration = Duration::from_secs(2);
const RR: u16 = 9001;
const CLOSE: u16 = 9002;

/// The `weft-pol` pair's policy: a DENY on the server's namespace for a port nothing uses, so every connection to
/// the server is in istio-authz's scope, decided by the plugin, and allowed.
const POLICY_NEVER_MATCHING: &str = r#"policies:
- name: deny-port-1
  namespace: default
  scope: Namespace
  action: Deny
  rules:
  - - - destinationPorts: [1]
"#;

/// Sizes of one run.
#[derive(Debug, Clone, Copy)]
struct Sizes {
    rounds: usize,
    mib: u64,
    window: Duration,
    conc: usize,
    lat_n: usize,
    idle: usize,
}

impl Sizes {
    /// Full sizes under `cargo bench` (which passes `--bench`) or with `BENCH_FULL=1`, a smoke run otherwise; each
    /// overridden by its variable.
    fn from_env() -> (Self, bool) {
        let full = std::env::args().any(|a| a == "--bench")
            || std::env::var("BENCH_FULL").is_ok_and(|v| v == "1");
        let pick = |full_v: f64, smoke_v: f64| if full { full_v } else { smoke_v };
        let num = |k: &str, d: f64| {
            std::env::var(k)
                .ok()
                .and_then(|v| v.parse::<f64>().ok())
                .filter(|v| v.is_finite() && *v >= 0.0)
                .unwrap_or(d)
        };
        let sizes = Self {
            rounds: (num("BENCH_ROUNDS", pick(5.0, 1.0)) as usize).max(1),
            mib: (num("BENCH_MIB", pick(2048.0, 8.0)) as u64).max(1),
            window: Duration::from_secs_f64(num("BENCH_SECS", pick(3.0, 0.3))),
            conc: (num("BENCH_CONC", 16.0) as usize).max(1),
            lat_n: (num("BENCH_LAT_N", pick(5000.0, 200.0)) as usize).max(10),
            idle: num("BENCH_IDLE", pick(10_000.0, 100.0)) as usize,
        };
        (sizes, full)
    }
}

/// Whether the part `what` is to run (`BENCH_ONLY` unset: every part).
fn part(what: &str) -> bool {
    std::env::var("BENCH_ONLY").map_or(true, |v| v.split(',').any(|p| p.trim() == what))
}

/// Whether the pair `name` is to start (`BENCH_PAIRS` unset: every available one).
fn wanted(name: &str) -> bool {
    std::env::var("BENCH_PAIRS").map_or(true, |v| v.split(',').any(|p| p.trim() == name))
}

/// Servers in node B: a sink (reads to EOF, answers with the byte count), a one-byte request/response server
/// (keep-alive) and a one-request server that closes after its answer (so its side, not the client's, holds
/// TIME_WAIT: a client that closes first piles up TIME_WAIT on its own ports and `connect()` then measures the
/// client's port search, not the path).
async fn servers(ip: Ipv4Addr) {
    let sink = tokio::net::TcpListener::bind((ip, SINK))
        .await
        .expect("sink");
    let source = tokio::net::TcpListener::bind((ip, SOURCE))
        .await
        .expect("source");
    tokio::spawn(async move {
        while let Ok((mut s, _)) = source.accept().await {
            tokio::spawn(async move {
                let mut n = [0u8; 8];
                if s.read_exact(&mut n).await.is_err() {
                    return;
                }
                let buf = vec![0xa5u8; 256 * 1024];
                let mut left = u64::from_be_bytes(n);
                while left > 0 {
                    let k = left.min(buf.len() as u64) as usize;
                    if s.write_all(&buf[..k]).await.is_err() {
                        return;
                    }
                    left -= k as u64;
                }
                let _ = s.shutdown().await;
            });
        }
    });
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
    rr_server(SocketAddr::from((ip, RR)))
        .await
        .expect("rr server");
}

/// The servers as a child process in node B's namespace (this bench binary again, with `BENCH_SERVE`), so their
/// sockets count against their own open-file limit, not the client's; killed on drop.
struct Servers(std::process::Child);

impl Servers {
    fn spawn(ns: &str, ip: Ipv4Addr) -> Self {
        let me = std::env::current_exe().expect("bench executable");
        let child = std::process::Command::new("ip")
            .args(["netns", "exec", ns])
            .arg(me)
            .env("BENCH_SERVE", ip.to_string())
            .stdin(std::process::Stdio::null())
            .spawn()
            .expect("servers");
        Self(child)
    }
}

impl Drop for Servers {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
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

/// One flow the other way: asks the source for `bytes` and reads them to the end; Gb/s.
async fn bulk_down(dst: SocketAddr, bypass: bool, bytes: u64) -> f64 {
    let mut s = connect(dst, bypass).await.expect("connect");
    let start = Instant::now();
    s.write_all(&bytes.to_be_bytes()).await.expect("ask");
    let mut buf = vec![0u8; 256 * 1024];
    let mut got = 0u64;
    loop {
        let k = s.read(&mut buf).await.expect("read");
        if k == 0 {
            break;
        }
        got += k as u64;
    }
    assert_eq!(got, bytes, "bytes from the source");
    bytes as f64 * 8.0 / start.elapsed().as_secs_f64() / 1e9
}

/// The `p`-th percentile of sorted `v` (nearest rank).
fn pct(v: &[f64], p: usize) -> f64 {
    v[(v.len() * p / 100).min(v.len() - 1)]
}

/// `n` keep-alive 1-byte round trips on one connection: (p50, p99) in µs.
async fn latency(dst: SocketAddr, bypass: bool, n: usize) -> (f64, f64) {
    let mut s = connect(dst, bypass).await.expect("connect");
    let mut b = [0u8; 1];
    // One round trip first, so the tunnel is up end to end before the samples.
    s.write_all(b"w").await.expect("write");
    s.read_exact(&mut b).await.expect("read");
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        s.write_all(b"p").await.expect("write");
        s.read_exact(&mut b).await.expect("read");
        samples.push(t.elapsed().as_secs_f64() * 1e6);
    }
    samples.sort_by(f64::total_cmp);
    (pct(&samples, 50), pct(&samples, 99))
}

/// `n` new connections one after the other (connect, one byte each way, the server closes): the time from
/// `connect()` to the first byte back, (p50, p99) in µs. Over a mesh this includes the HBONE CONNECT round trip
/// the client's first bytes wait for (what sending them before the 200 would save, #13 step 3).
async fn setup_latency(dst: SocketAddr, bypass: bool, n: usize) -> (f64, f64) {
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let mut s = connect(dst, bypass).await.expect("connect");
        s.write_all(b"q").await.expect("write");
        let mut b = [0u8; 1];
        s.read_exact(&mut b).await.expect("read");
        samples.push(t.elapsed().as_secs_f64() * 1e6);
        let _ = s.read(&mut b).await;
    }
    samples.sort_by(f64::total_cmp);
    (pct(&samples, 50), pct(&samples, 99))
}

/// Opens `n` connections through the pair (64 at a time), each with one byte echoed so the tunnel is up end to
/// end, reads both proxies' RSS while all are held, then resets them (no TIME_WAIT left behind for the later
/// parts): (RSS A, RSS B) in KiB.
async fn hold_idle(dst: SocketAddr, n: usize, pids: (Option<u32>, Option<u32>)) -> (u64, u64) {
    let mut held = Vec::with_capacity(n);
    while held.len() < n {
        let batch = (n - held.len()).min(64);
        let tasks: Vec<_> = (0..batch)
            .map(|_| {
                tokio::spawn(async move {
                    let mut s = connect(dst, false).await?;
                    s.write_all(b"i").await?;
                    let mut b = [0u8; 1];
                    s.read_exact(&mut b).await?;
                    std::io::Result::Ok(s)
                })
            })
            .collect();
        for t in tasks {
            held.push(t.await.expect("task").expect("idle connection"));
        }
    }
    // Both proxies have seen every connection's byte; give them no further event and read.
    let rss = (rss_kib(pids.0), rss_kib(pids.1));
    for s in &held {
        let _ = socket2::SockRef::from(s).set_linger(Some(Duration::ZERO));
    }
    drop(held);
    rss
}

/// VmRSS of `pid` in KiB (0 if unknown).
fn rss_kib(pid: Option<u32>) -> u64 {
    status_kib(pid, "VmRSS:")
}

/// RssAnon of `pid` in KiB (0 if unknown): the process's private memory, without the pages of its binary and
/// libraries that it has mapped from the page cache (how many of those count in VmRSS depends on the kernel's
/// fault-around and on what the page cache holds, so the total moves by a megabyte between runs of one binary).
fn anon_kib(pid: Option<u32>) -> u64 {
    status_kib(pid, "RssAnon:")
}

fn status_kib(pid: Option<u32>, field: &str) -> u64 {
    let Some(pid) = pid else { return 0 };
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// The machine's CPU time so far, all cores, in clock ticks: (idle and iowait, total), from `/proc/stat`'s `cpu`
/// line; zeros if unknown.
fn machine_ticks() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let Some(line) = stat.lines().find(|l| l.starts_with("cpu ")) else {
        return (0, 0);
    };
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal (guest time is already in user).
    let idle = v.get(3).copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0);
    (idle, v.iter().take(8).sum())
}

/// The idle share between two [`machine_ticks`] readings, %; NaN when no tick passed.
fn idle_percent(before: (u64, u64), after: (u64, u64)) -> f64 {
    let total = after.1.saturating_sub(before.1);
    if total == 0 {
        return f64::NAN;
    }
    after.0.saturating_sub(before.0) as f64 * 100.0 / total as f64
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

/// One proxy pair (or the direct path) as measured: where its client runs and which processes are its proxies.
struct Pair {
    name: &'static str,
    ns_a: String,
    server_ip: Ipv4Addr,
    bypass: bool,
    pids: (Option<u32>, Option<u32>),
    /// Its entry in the list of running pairs (none for direct).
    running: Option<usize>,
}

/// What keeps a pair up (dropped at the end: processes killed, namespaces deleted).
enum Running {
    Weft(Box<NetMesh>),
    Ztunnel(Box<ZtunnelMesh>),
    Relay(Box<RelayPair>),
}

/// The yardstick pair: [`relay`] on both nodes of a [`Topology`], each node this bench binary again with
/// `BENCH_RELAY` (`out:<node B's address>` or `in`). Field order is drop order: processes before namespaces.
struct RelayPair {
    a: NsProcess,
    b: NsProcess,
    topo: Topology,
    _dir: tempfile::TempDir,
}

impl RelayPair {
    async fn start(tag: &str, subnet: u8) -> Result<Self, String> {
        let (c, s) = (
            Ipv4Addr::new(10, 248, subnet, 1),
            Ipv4Addr::new(10, 248, subnet, 2),
        );
        let topo = Topology::create(tag, &Layout::new(c, s, 24))?;
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let me = std::env::current_exe().map_err(|e| e.to_string())?;
        let node = |name: &str, ns: &Netns, spec: String| {
            NsProcess::spawn(
                name,
                &ns.name,
                &me,
                &[],
                &[("BENCH_RELAY".to_owned(), spec)],
                dir.path().join(format!("{name}.log")),
            )
        };
        let mut b = node("relay-b", &topo.ns_b, "in".into())?;
        let mut a = node("relay-a", &topo.ns_a, format!("out:{s}"))?;
        b.wait_log(relay::LISTENING, Duration::from_secs(30))
            .await?;
        a.wait_log(relay::LISTENING, Duration::from_secs(30))
            .await?;
        Ok(Self {
            a,
            b,
            topo,
            _dir: dir,
        })
    }
}

/// This process as one node of the relay pair (`BENCH_RELAY`: `in`, or `out:<node B's IPv4 address>`).
async fn run_relay(spec: &str) {
    let served = match spec.strip_prefix("out:") {
        Some(peer) => relay::outbound(peer.parse().expect("BENCH_RELAY out:<IPv4>")).await,
        None => relay::inbound().await,
    };
    if let Err(e) = served {
        eprintln!("relay {spec}: {e}");
        std::process::exit(1);
    }
}

impl Running {
    /// The last lines of both proxies' logs (to show why a path failed).
    fn log_tails(&self) -> String {
        let (a, b) = match self {
            Running::Weft(m) => (m.a.log_tail(20), m.b.log_tail(20)),
            Running::Ztunnel(z) => (z.a.log_tail(20), z.b.log_tail(20)),
            Running::Relay(r) => (r.a.log_tail(20), r.b.log_tail(20)),
        };
        format!("node A:\n{a}\nnode B:\n{b}")
    }
}

/// What one pair measured in one round (NaN: not measured, shown as `-`).
#[derive(Debug, Clone, Copy)]
struct Round {
    gbps: f64,
    /// One flow from the server to the client (a download), Gb/s.
    down_gbps: f64,
    /// Proxy CPU (A+B) per GiB, ms.
    cpu_gib_ms: f64,
    /// The machine's idle share (all cores) during the bulk transfer, %: how far the one-flow case is from
    /// being bound by CPU (a pipeline that waits on itself leaves cores idle however cheap each stage is).
    bulk_idle: f64,
    cps: f64,
    failed: u64,
    /// Proxy CPU (A+B) per connection, µs.
    cpu_conn_us: f64,
    p50: f64,
    p99: f64,
    /// New connection: connect to first byte back, µs.
    setup50: f64,
    setup99: f64,
}

impl Default for Round {
    fn default() -> Self {
        Self {
            gbps: f64::NAN,
            down_gbps: f64::NAN,
            cpu_gib_ms: f64::NAN,
            bulk_idle: f64::NAN,
            cps: f64::NAN,
            failed: 0,
            cpu_conn_us: f64::NAN,
            p50: f64::NAN,
            p99: f64::NAN,
            setup50: f64::NAN,
            setup99: f64::NAN,
        }
    }
}

impl Pair {
    fn ns(&self) -> Netns {
        Netns::existing(&self.ns_a)
    }

    /// CPU time (ns) both proxies have used so far; NaN for the direct path (no proxy, the figure does not apply).
    fn cpu(&self) -> f64 {
        if self.pids == (None, None) {
            return f64::NAN;
        }
        (cpu_ns(self.pids.0) + cpu_ns(self.pids.1)) as f64
    }

    /// Run `f`'s future in node A's namespace, on its own thread.
    fn in_a<F, Fut, T>(&self, f: F) -> T
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = T>,
        T: Send + 'static,
    {
        self.ns().run(f).join().expect("bench thread").unwrap()
    }

    fn round(&self, z: Sizes) -> Round {
        let (ip, bypass) = (self.server_ip, self.bypass);
        let mut r = Round::default();
        if part("bulk") {
            let c0 = self.cpu();
            let t0 = machine_ticks();
            r.gbps = self.in_a(move || bulk(SocketAddr::from((ip, SINK)), bypass, z.mib << 20));
            r.cpu_gib_ms = (self.cpu() - c0) / 1e6 / (z.mib as f64 / 1024.0);
            r.bulk_idle = idle_percent(t0, machine_ticks());
            r.down_gbps =
                self.in_a(move || bulk_down(SocketAddr::from((ip, SOURCE)), bypass, z.mib << 20));
        }
        if part("cps") {
            let c0 = self.cpu();
            let (ok, failed, secs) = self
                .in_a(move || conn_rate(SocketAddr::from((ip, CLOSE)), bypass, z.window, z.conc));
            r.cps = ok as f64 / secs;
            r.failed = failed;
            r.cpu_conn_us = (self.cpu() - c0) / 1e3 / ok.max(1) as f64;
        }
        if part("lat") {
            (r.p50, r.p99) =
                self.in_a(move || latency(SocketAddr::from((ip, RR)), bypass, z.lat_n));
            let n = (z.lat_n / 10).max(10);
            (r.setup50, r.setup99) =
                self.in_a(move || setup_latency(SocketAddr::from((ip, CLOSE)), bypass, n));
        }
        r
    }
}

/// Median and spread (min, max) of the finite values of a sample.
fn stats(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.retain(|x| x.is_finite());
    if v.is_empty() {
        return (f64::NAN, f64::NAN, f64::NAN);
    }
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

/// `median (min-max)`, or `-` where the figure does not apply (e.g. proxy CPU on the direct path).
fn fmt_stats(v: Vec<f64>, prec: usize) -> String {
    let (m, lo, hi) = stats(v);
    if m.is_nan() {
        return "-".into();
    }
    format!("{m:.prec$} ({lo:.prec$}-{hi:.prec$})")
}

/// Raises this process's open-file limit (soft and hard) to at least `n` if it is lower (children, the proxies and
/// the servers, inherit it); returns the soft limit in force.
fn raise_nofile(n: u64) -> u64 {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return 1024;
    };
    if soft >= n {
        return soft;
    }
    // Root (CAP_SYS_RESOURCE) may raise the hard limit; otherwise go as far as it.
    if setrlimit(Resource::RLIMIT_NOFILE, n, n.max(hard)).is_ok() {
        return n;
    }
    let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
    getrlimit(Resource::RLIMIT_NOFILE).map_or(soft, |(s, _)| s)
}

/// Waits until `addr` accepts direct connections from inside `ns` (the servers are up).
fn wait_listening(ns: &Netns, addr: SocketAddr) {
    let ok = ns
        .run(move || async move {
            let start = Instant::now();
            while start.elapsed() < Duration::from_secs(30) {
                if connect(addr, true).await.is_ok() {
                    return true;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            false
        })
        .join()
        .unwrap()
        .unwrap();
    assert!(ok, "servers at {addr} did not start");
}

/// Start the pairs asked for: (what keeps them up, how to measure them, their servers).
async fn start_pairs(log: &str) -> (Vec<Running>, Vec<Pair>, Vec<Servers>) {
    let (mut running, mut pairs, mut servers) = (Vec::new(), Vec::new(), Vec::new());
    let base = std::env::var_os("WEFT_BASE_BIN").map(std::path::PathBuf::from);
    for (name, tag, subnet, plugins) in [
        ("weft", "m", 9u8, true),
        ("weft-pol", "p", 13, true),
        ("weft-np", "n", 10, false),
        ("weft-base", "o", 12, true),
    ] {
        if !wanted(name) {
            continue;
        }
        let (c, s) = (
            Ipv4Addr::new(10, 248, subnet, 1),
            Ipv4Addr::new(10, 248, subnet, 2),
        );
        let mut layout = Layout::new(c, s, 24);
        // What ships: weft's own log buffering (and the flag is unknown to an older baseline build).
        layout.sync_logs = false;
        if name == "weft-base" {
            let Some(bin) = &base else {
                continue;
            };
            layout.weft_bin = Some(bin.clone());
        }
        if !plugins {
            layout.flags_a = vec!["--default-plugins".into(), "false".into()];
            layout.flags_b = layout.flags_a.clone();
        }
        let mut config = yaml(c, s);
        if name == "weft-pol"
            || (name == "weft-base"
                && std::env::var_os("BENCH_BASE_POLICY").is_some_and(|v| v == "1"))
        {
            config.push_str(POLICY_NEVER_MATCHING);
        }
        let mesh = NetMesh::start_with(tag, &layout, &config, log)
            .await
            .expect("network namespaces (needs root) and a weft build");
        pairs.push(Pair {
            name,
            ns_a: mesh.ns_a.name.clone(),
            server_ip: s,
            bypass: false,
            pids: (mesh.a.pid(), mesh.b.pid()),
            running: Some(running.len()),
        });
        servers.push(Servers::spawn(&mesh.ns_b.name, s));
        running.push(Running::Weft(Box::new(mesh)));
    }
    match ztunnel_binary() {
        Ok(bin) if wanted("ztunnel") => {
            let z = ZtunnelMesh::start("z", 11, &bin, log, &[])
                .await
                .expect("the ztunnel pair (ZTUNNEL_BIN is set)");
            let s = z.topo.server_ip;
            pairs.push(Pair {
                name: "ztunnel",
                ns_a: z.topo.ns_a.name.clone(),
                server_ip: s,
                bypass: false,
                pids: (z.a.pid(), z.b.pid()),
                running: Some(running.len()),
            });
            servers.push(Servers::spawn(&z.topo.ns_b.name, s));
            running.push(Running::Ztunnel(Box::new(z)));
        }
        Ok(_) => println!("ztunnel pair skipped: not in BENCH_PAIRS"),
        Err(why) => println!("ztunnel pair skipped: {why}"),
    }
    if wanted("relay") {
        let r = RelayPair::start("r", 14)
            .await
            .expect("the relay pair (network namespaces need root)");
        pairs.push(Pair {
            name: "relay",
            ns_a: r.topo.ns_a.name.clone(),
            server_ip: r.topo.server_ip,
            bypass: false,
            pids: (r.a.pid(), r.b.pid()),
            running: Some(running.len()),
        });
        servers.push(Servers::spawn(&r.topo.ns_b.name, r.topo.server_ip));
        running.push(Running::Relay(Box::new(r)));
    }
    // Direct: the first pair's namespaces with the capture skipped.
    if wanted("direct")
        && let Some(first) = pairs.first()
    {
        let direct = Pair {
            name: "direct",
            ns_a: first.ns_a.clone(),
            server_ip: first.server_ip,
            bypass: true,
            pids: (None, None),
            running: None,
        };
        pairs.push(direct);
    }
    (running, pairs, servers)
}

/// The idle-connection memory case, pair by pair.
fn memory(pairs: &[Pair], idle: usize) {
    println!(
        "idle memory (after one warm-up; then {idle} idle connections held through the pair), MiB; per connection, bytes:"
    );
    let mut per_conn = Vec::new();
    // The relay's per-connection buffers are sized for throughput (two of relay::BUF), not memory: not a yardstick
    // for this case.
    for p in pairs.iter().filter(|p| !p.bypass && p.name != "relay") {
        // CPU an idle pair burns on its own (timers, tickers, housekeeping), over a short quiet window.
        let (c0, t0) = (p.cpu(), Instant::now());
        std::thread::sleep(IDLE_CPU_WINDOW);
        let idle_cpu = (p.cpu() - c0) / 1e6 / t0.elapsed().as_secs_f64();
        let before = (rss_kib(p.pids.0), rss_kib(p.pids.1));
        let anon = (anon_kib(p.pids.0), anon_kib(p.pids.1));
        let (ip, pids) = (p.server_ip, p.pids);
        let held = p.in_a(move || hold_idle(SocketAddr::from((ip, RR)), idle, pids));
        let per =
            |after: u64, before: u64| after.saturating_sub(before) as f64 * 1024.0 / idle as f64;
        let mib = |k: u64| k as f64 / 1024.0;
        println!(
            "  {:9} idle CPU A+B {idle_cpu:5.2} ms/s | idle RSS A {:6.1}  B {:6.1} (anon A {:5.1}  B {:5.1}) | holding {idle}: A {:6.1}  B {:6.1} | per connection A {:6.0}  B {:6.0}",
            p.name,
            mib(before.0),
            mib(before.1),
            mib(anon.0),
            mib(anon.1),
            mib(held.0),
            mib(held.1),
            per(held.0, before.0),
            per(held.1, before.1),
        );
        per_conn.push((
            p.name,
            before.0 + before.1,
            per(held.0, before.0) + per(held.1, before.1),
            anon.0 + anon.1,
        ));
    }
    let find = |n: &str| per_conn.iter().find(|(name, ..)| *name == n);
    for w in ["weft", "weft-pol", "weft-np", "weft-base"] {
        if let (Some(w), Some(z)) = (find(w), find("ztunnel")) {
            println!(
                "  {} / ztunnel: idle RSS (A+B) {:.2} (anon {:.2})   per idle connection (A+B) {:.2}",
                w.0,
                w.1 as f64 / z.1 as f64,
                w.3 as f64 / z.3 as f64,
                w.2 / z.2
            );
        }
    }
}

/// The table of medians per pair, then the paired ratios.
fn report(pairs: &[Pair], results: &[Vec<Round>]) {
    let col = |i: usize, f: fn(&Round) -> f64| results[i].iter().map(f).collect::<Vec<_>>();
    println!(
        "{:9} | {:20} | {:20} | {:20} | {:16} | {:16} | {:16} | {:16} | {:16} | {:16} | {:16}",
        "pair",
        "bulk Gb/s",
        "bulk down Gb/s",
        "new conn/s",
        "CPU us/conn A+B",
        "RTT p50 us",
        "RTT p99 us",
        "1st byte p50 us",
        "1st byte p99 us",
        "CPU ms/GiB A+B",
        "bulk: idle %"
    );
    for (i, p) in pairs.iter().enumerate() {
        let failed: u64 = results[i].iter().map(|r| r.failed).sum();
        println!(
            "{:9} | {:20} | {:20} | {:20} | {:16} | {:16} | {:16} | {:16} | {:16} | {:16} | {:16}{}",
            p.name,
            fmt_stats(col(i, |r| r.gbps), 2),
            fmt_stats(col(i, |r| r.down_gbps), 2),
            fmt_stats(col(i, |r| r.cps), 0),
            fmt_stats(col(i, |r| r.cpu_conn_us), 0),
            fmt_stats(col(i, |r| r.p50), 0),
            fmt_stats(col(i, |r| r.p99), 0),
            fmt_stats(col(i, |r| r.setup50), 0),
            fmt_stats(col(i, |r| r.setup99), 0),
            fmt_stats(col(i, |r| r.cpu_gib_ms), 0),
            fmt_stats(col(i, |r| r.bulk_idle), 1),
            if failed > 0 {
                format!("  ({failed} connections failed)")
            } else {
                String::new()
            }
        );
    }
    let idx = |name: &str| pairs.iter().position(|p| p.name == name);
    let ratio = |a: usize, b: usize, f: fn(&Round) -> f64| {
        results[a]
            .iter()
            .zip(&results[b])
            .map(|(x, y)| f(x) / f(y))
            .collect::<Vec<_>>()
    };
    println!(
        "ratios per round, median (min-max) (bulk and conn/s: higher is better; the rest: lower is better):"
    );
    for (a, b) in [
        ("weft", "ztunnel"),
        ("weft-pol", "ztunnel"),
        ("weft-np", "ztunnel"),
        ("weft-base", "ztunnel"),
        ("weft", "weft-np"),
        ("weft-pol", "weft-np"),
        ("weft", "weft-base"),
        ("weft-pol", "weft-base"),
        ("weft", "direct"),
        ("ztunnel", "direct"),
        ("relay", "ztunnel"),
        ("weft", "relay"),
        ("relay", "direct"),
    ] {
        let (Some(i), Some(j)) = (idx(a), idx(b)) else {
            continue;
        };
        println!(
            "  {:20} bulk {}   down {}   conn/s {}   CPU/conn {}   RTT p50 {}   RTT p99 {}   1st byte p50 {}",
            format!("{a} / {b}"),
            fmt_stats(ratio(i, j, |r| r.gbps), 3),
            fmt_stats(ratio(i, j, |r| r.down_gbps), 3),
            fmt_stats(ratio(i, j, |r| r.cps), 3),
            fmt_stats(ratio(i, j, |r| r.cpu_conn_us), 3),
            fmt_stats(ratio(i, j, |r| r.p50), 3),
            fmt_stats(ratio(i, j, |r| r.p99), 3),
            fmt_stats(ratio(i, j, |r| r.setup50), 3),
        );
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    if let Ok(ip) = std::env::var("BENCH_SERVE") {
        servers(ip.parse().expect("BENCH_SERVE ip")).await;
        return;
    }
    if let Ok(spec) = std::env::var("BENCH_RELAY") {
        run_relay(&spec).await;
        return;
    }
    let (z, full) = Sizes::from_env();
    let log = std::env::var("BENCH_LOG").unwrap_or_else(|_| "info".into());
    let nofile = raise_nofile((z.idle as u64 * 4).max(65_536));
    let idle = if z.idle as u64 + 4096 > nofile {
        let fit = nofile.saturating_sub(4096) as usize;
        println!(
            "open-file limit {nofile}: holding {} idle connections needs more; holding {fit}",
            z.idle
        );
        fit
    } else {
        z.idle
    };
    let (mut running, pairs, _servers) = start_pairs(&log).await;
    for p in &pairs {
        wait_listening(&p.ns(), SocketAddr::from((p.server_ip, CLOSE)));
    }
    // Warm every path up once (certificates, pooled HBONE connections, plugin instances).
    for p in &pairs {
        let (ip, bypass) = (p.server_ip, p.bypass);
        let (_, failed, _) = p.in_a(move || {
            conn_rate(
                SocketAddr::from((ip, CLOSE)),
                bypass,
                Duration::from_millis(300),
                4,
            )
        });
        if failed > 0 {
            let logs = p
                .running
                .map(|i| running[i].log_tails())
                .unwrap_or_default();
            panic!(
                "warm-up: {failed} connections through {} failed; the path does not work:\n{logs}",
                p.name
            );
        }
    }
    println!(
        "weft mesh bench ({}): two netns nodes per pair, capture -> HBONE/mTLS -> node B; {} alternating rounds of \
         {} MiB bulk, {:?} x {} connectors, {} RTT samples; median (min-max) over rounds",
        if full { "full" } else { "smoke run" },
        z.rounds,
        z.mib,
        z.window,
        z.conc,
        z.lat_n,
    );
    if part("mem") && idle > 0 {
        memory(&pairs, idle);
    }
    let n = pairs.len();
    let mut results: Vec<Vec<Round>> = vec![Vec::new(); n];
    for round in 0..z.rounds {
        for k in 0..n {
            let i = (round + k) % n;
            results[i].push(pairs[i].round(z));
        }
    }
    report(&pairs, &results);
    for r in running.iter_mut() {
        match r {
            Running::Weft(m) => {
                m.a.terminate(Duration::from_secs(5)).await;
                m.b.terminate(Duration::from_secs(5)).await;
            }
            Running::Ztunnel(z) => z.stop().await,
            Running::Relay(_) => {}
        }
    }
}
