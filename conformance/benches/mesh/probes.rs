//! The bench's two ends and its meters: the servers in node B, the client's measurements (bulk both ways, round
//! trips, new connections, idle connections held) and the readers of `/proc` (RSS, CPU time, the machine's idle share).

use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use weft_conformance::load::{close_server, rr_server};
use weft_conformance::netmesh::connect;

/// The sink: reads to EOF, answers with the byte count.
pub(crate) const SINK: u16 = 9000;
/// The one-byte request/response server (keep-alive).
pub(crate) const RR: u16 = 9001;
/// The one-request server that closes after its answer.
pub(crate) const CLOSE: u16 = 9002;
/// The server that sends: reads a byte count (8 bytes, big-endian), sends that many bytes, closes.
pub(crate) const SOURCE: u16 = 9003;
/// Keep-alive servers the idle connections of the memory case are spread over, round robin: a client address can
/// hold one connection per local port to each server port (28,232 with Linux's default ephemeral range), so
/// 100,000 idle connections need four.
pub(crate) const IDLE_PORTS: [u16; 4] = [RR, 9011, 9021, 9031];
/// How long an idle pair's own CPU use is measured for (the memory case).
pub(crate) const IDLE_CPU_WINDOW: Duration = Duration::from_secs(2);

/// Servers in node B: a sink (reads to EOF, answers with the byte count), a one-byte request/response server
/// (keep-alive) and a one-request server that closes after its answer (so its side, not the client's, holds
/// TIME_WAIT: a client that closes first piles up TIME_WAIT on its own ports and `connect()` then measures the
/// client's port search, not the path).
pub(crate) async fn servers(ip: Ipv4Addr) {
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
    for port in IDLE_PORTS.into_iter().filter(|p| *p != RR) {
        tokio::spawn(async move {
            rr_server(SocketAddr::from((ip, port)))
                .await
                .expect("rr server (idle connections)")
        });
    }
    rr_server(SocketAddr::from((ip, RR)))
        .await
        .expect("rr server");
}

/// The servers as a child process in node B's namespace (this bench binary again, with `BENCH_SERVE`), so their
/// sockets count against their own open-file limit, not the client's; killed on drop.
pub(crate) struct Servers(std::process::Child);

impl Servers {
    pub(crate) fn spawn(ns: &str, ip: Ipv4Addr) -> Self {
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

/// One flow from the client to the sink: sends `bytes`, half-closes, waits for the sink's count; seconds taken.
pub(crate) async fn bulk(dst: SocketAddr, bypass: bool, bytes: u64) -> f64 {
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
    start.elapsed().as_secs_f64()
}

/// A time-bounded flow from the client to the sink on a new connection (iperf3's way: slow start and buffer
/// growth included): sends for `secs`, half-closes, and counts what the sink says it received over the time until
/// its answer; Gb/s.
pub(crate) async fn flow_up(dst: SocketAddr, bypass: bool, secs: Duration) -> f64 {
    let mut s = connect(dst, bypass).await.expect("connect");
    let buf = vec![0x5au8; 256 * 1024];
    let start = Instant::now();
    let mut sent = 0u64;
    while start.elapsed() < secs {
        s.write_all(&buf).await.expect("write");
        sent += buf.len() as u64;
    }
    s.shutdown().await.expect("shutdown");
    let mut got = [0u8; 8];
    s.read_exact(&mut got).await.expect("count");
    assert_eq!(u64::from_be_bytes(got), sent, "sink byte count");
    sent as f64 * 8.0 / start.elapsed().as_secs_f64() / 1e9
}

/// A time-bounded flow the other way: asks the source for more than it can send and reads for `secs`, then resets
/// the connection; Gb/s.
pub(crate) async fn flow_down(dst: SocketAddr, bypass: bool, secs: Duration) -> f64 {
    let mut s = connect(dst, bypass).await.expect("connect");
    let start = Instant::now();
    s.write_all(&u64::MAX.to_be_bytes()).await.expect("ask");
    let mut buf = vec![0u8; 256 * 1024];
    let mut got = 0u64;
    while start.elapsed() < secs {
        let k = s.read(&mut buf).await.expect("read");
        assert!(
            k > 0,
            "the source closed a flow it was asked to keep sending"
        );
        got += k as u64;
    }
    let gbps = got as f64 * 8.0 / start.elapsed().as_secs_f64() / 1e9;
    let _ = socket2::SockRef::from(&s).set_linger(Some(Duration::ZERO));
    gbps
}

/// One flow the other way: asks the source for `bytes` and reads them to the end; seconds taken.
pub(crate) async fn bulk_down(dst: SocketAddr, bypass: bool, bytes: u64) -> f64 {
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
    start.elapsed().as_secs_f64()
}

/// The `p`-th percentile of sorted `v` (nearest rank); NaN for no samples.
pub(crate) fn pct(v: &[f64], p: usize) -> f64 {
    v.get((v.len() * p / 100).min(v.len().saturating_sub(1)))
        .copied()
        .unwrap_or(f64::NAN)
}

/// `n` keep-alive 1-byte round trips on one connection: each one's time in µs.
pub(crate) async fn latency(dst: SocketAddr, bypass: bool, n: usize) -> Vec<f64> {
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
    samples
}

/// `n` new connections one after the other (connect, one byte each way, the server closes): the time from
/// `connect()` to the first byte back of each, in µs. Over a mesh this includes the HBONE CONNECT round trip
/// the client's first bytes wait for (what sending them before the 200 would save, #13 step 3).
pub(crate) async fn setup_latency(dst: SocketAddr, bypass: bool, n: usize) -> Vec<f64> {
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
    samples
}

/// What [`hold_idle`] measured while the connections were held.
pub(crate) struct Held {
    /// (RSS A, RSS B) in KiB.
    pub rss: (u64, u64),
    /// New connections' times to first byte (µs), taken one after another while the idle ones are held.
    pub setup: Vec<f64>,
}

/// Opens `n` connections through the pair to `ip` (64 at a time, over [`IDLE_PORTS`]), each with one byte echoed
/// so the tunnel is up end to end, reads both proxies' RSS while all are held, times `setup_n` new connections
/// (to the closing server) while they still are, then resets them (no TIME_WAIT left behind for the later
/// parts). A connection that fails fails the bench.
pub(crate) async fn hold_idle(
    ip: Ipv4Addr,
    n: usize,
    pids: (Option<u32>, Option<u32>),
    setup_n: usize,
) -> Held {
    let mut held = Vec::with_capacity(n);
    while held.len() < n {
        let batch = (n - held.len()).min(64);
        let tasks: Vec<_> = (held.len()..held.len() + batch)
            .map(|i| {
                let dst = SocketAddr::from((ip, IDLE_PORTS[i % IDLE_PORTS.len()]));
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
            let i = held.len();
            held.push(
                t.await
                    .expect("task")
                    .unwrap_or_else(|e| panic!("idle connection {i} of {n}: {e}")),
            );
        }
    }
    // Both proxies have seen every connection's byte; give them no further event and read.
    let rss = (rss_kib(pids.0), rss_kib(pids.1));
    let setup = setup_latency(SocketAddr::from((ip, CLOSE)), false, setup_n).await;
    for s in &held {
        let _ = socket2::SockRef::from(s).set_linger(Some(Duration::ZERO));
    }
    drop(held);
    Held { rss, setup }
}

/// VmRSS of `pid` in KiB (0 if unknown).
pub(crate) fn rss_kib(pid: Option<u32>) -> u64 {
    status_kib(pid, "VmRSS:")
}

/// RssAnon of `pid` in KiB (0 if unknown): the process's private memory, without the pages of its binary and
/// libraries that it has mapped from the page cache (how many of those count in VmRSS depends on the kernel's
/// fault-around and on what the page cache holds, so the total moves by a megabyte between runs of one binary).
pub(crate) fn anon_kib(pid: Option<u32>) -> u64 {
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
pub(crate) fn machine_ticks() -> (u64, u64) {
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
pub(crate) fn idle_percent(before: (u64, u64), after: (u64, u64)) -> f64 {
    let total = after.1.saturating_sub(before.1);
    if total == 0 {
        return f64::NAN;
    }
    after.0.saturating_sub(before.0) as f64 * 100.0 / total as f64
}

/// CPU time (ns) used so far by every thread of process `pid` (from `/proc/<pid>/task/*/schedstat`); 0 if unknown.
pub(crate) fn cpu_ns(pid: Option<u32>) -> u64 {
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
