//! Loopback throughput of HBONE (client + server) against direct TCP, for tuning windows and
//! buffer sizes. Ignored by default; run in release mode:
//!
//! ```text
//! CARGO_TARGET_DIR=target-hbone cargo test -p weft-hbone --release --test throughput \
//!     -- --ignored --nocapture
//! ```
//!
//! `HBONE_BENCH_MIB` sets the bytes sent per run (default 1024 MiB).
#![allow(clippy::unwrap_used)] // a test panics to fail

mod common;

use std::time::{Duration, Instant};

use common::{TestServer, dial};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use weft_hbone::{ConnectRequest, H2Config, InboundRequest};

const IO_BUF: usize = 64 * 1024;
const RUNS: usize = 5;

fn total_bytes() -> usize {
    let mib = std::env::var("HBONE_BENCH_MIB")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(1024);
    mib * 1024 * 1024
}

/// Reads to EOF, then writes the byte count and shuts down.
async fn sink<S: AsyncRead + AsyncWrite + Unpin>(mut s: S) {
    let mut buf = vec![0u8; IO_BUF];
    let mut n = 0u64;
    loop {
        match s.read(&mut buf).await {
            Ok(0) => break,
            Ok(k) => n += k as u64,
            Err(_) => return,
        }
    }
    let _ = s.write_all(&n.to_be_bytes()).await;
    let _ = s.shutdown().await;
}

/// Sends `total` bytes, half-closes, and waits for the peer's byte count.
async fn source<S: AsyncRead + AsyncWrite + Unpin>(mut s: S, total: usize) {
    let buf = vec![0xabu8; IO_BUF];
    let mut left = total;
    while left > 0 {
        let k = left.min(IO_BUF);
        s.write_all(&buf[..k]).await.expect("write");
        left -= k;
    }
    s.shutdown().await.expect("shutdown");
    let mut n = [0u8; 8];
    s.read_exact(&mut n).await.expect("count");
    assert_eq!(u64::from_be_bytes(n) as usize, total);
}

/// Echo: copies everything back, then half-closes.
async fn echo<S: AsyncRead + AsyncWrite + Unpin>(s: S) {
    let (mut r, mut w) = tokio::io::split(s);
    let mut buf = vec![0u8; IO_BUF];
    loop {
        match r.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(k) => {
                if w.write_all(&buf[..k]).await.is_err() {
                    return;
                }
            }
        }
    }
    let _ = w.shutdown().await;
}

/// Sends `total` bytes while reading the echo back concurrently.
async fn bidi<S: AsyncRead + AsyncWrite + Unpin + Send + 'static>(s: S, total: usize) {
    let (mut r, mut w) = tokio::io::split(s);
    let writer = tokio::spawn(async move {
        let buf = vec![0x5au8; IO_BUF];
        let mut left = total;
        while left > 0 {
            let k = left.min(IO_BUF);
            w.write_all(&buf[..k]).await.expect("write");
            left -= k;
        }
        w.shutdown().await.expect("shutdown");
    });
    let mut buf = vec![0u8; IO_BUF];
    let mut got = 0;
    loop {
        match r.read(&mut buf).await.expect("read") {
            0 => break,
            k => got += k,
        }
    }
    writer.await.expect("writer");
    assert_eq!(got, total);
}

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Upload,
    Echo,
}

async fn tcp_run(mode: Mode, streams: usize, total: usize) -> Duration {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            let _ = s.set_nodelay(true);
            tokio::spawn(async move {
                match mode {
                    Mode::Upload => sink(s).await,
                    Mode::Echo => echo(s).await,
                }
            });
        }
    });
    let mut conns = Vec::new();
    for _ in 0..streams {
        let s = TcpStream::connect(addr).await.expect("connect");
        s.set_nodelay(true).expect("nodelay");
        conns.push(s);
    }
    let start = Instant::now();
    let tasks: Vec<_> = conns
        .into_iter()
        .map(|s| {
            tokio::spawn(async move {
                match mode {
                    Mode::Upload => source(s, total / streams).await,
                    Mode::Echo => bidi(s, total / streams).await,
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("task");
    }
    start.elapsed()
}

async fn hbone_run(cfg: &H2Config, mode: Mode, streams: usize, total: usize) -> Duration {
    let server = TestServer::start(cfg.clone(), move |req: InboundRequest| async move {
        let Ok(s) = req.accept(Default::default()) else {
            return;
        };
        match mode {
            Mode::Upload => sink(s).await,
            Mode::Echo => echo(s).await,
        }
    })
    .await;
    let client = dial(server.addr, cfg).await.expect("dial");
    let mut conns = Vec::new();
    for _ in 0..streams {
        let (s, _) = client
            .connect(ConnectRequest::new("127.0.0.1:1"))
            .await
            .expect("connect");
        conns.push(s);
    }
    let start = Instant::now();
    let tasks: Vec<_> = conns
        .into_iter()
        .map(|s| {
            tokio::spawn(async move {
                match mode {
                    Mode::Upload => source(s, total / streams).await,
                    Mode::Echo => bidi(s, total / streams).await,
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("task");
    }
    let d = start.elapsed();
    server.shutdown.cancel();
    d
}

fn windows(stream: usize, conn: usize) -> H2Config {
    H2Config {
        stream_window_size: stream as u32,
        connection_window_size: conn as u32,
        ..Default::default()
    }
}

fn gbps(bytes: usize, d: Duration) -> f64 {
    bytes as f64 * 8.0 / d.as_secs_f64() / 1e9
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: run with --release -- --ignored --nocapture"]
async fn throughput_hbone_vs_tcp() {
    let total = total_bytes();
    let mib = |n: usize| n * 1024 * 1024;
    let configs: Vec<(&str, H2Config)> = vec![
        (
            "default (4M/16M win, 1M frame, 400K sendbuf)",
            H2Config::default(),
        ),
        (
            "sendbuf 1M",
            H2Config {
                max_send_buffer_size: mib(1),
                ..Default::default()
            },
        ),
        (
            "sendbuf 4M",
            H2Config {
                max_send_buffer_size: mib(4),
                ..Default::default()
            },
        ),
        (
            "frame 16K",
            H2Config {
                max_frame_size: 16 * 1024,
                ..Default::default()
            },
        ),
        ("win 2M/8M", windows(mib(2), mib(8))),
        ("win 1M/4M", windows(mib(1), mib(4))),
    ];
    println!(
        "payload {} MiB per run, {RUNS} interleaved TCP/HBONE pairs, {IO_BUF} B app buffers",
        total >> 20
    );
    println!("ratio = median over pairs of (TCP time / HBONE time); 1.0 = as fast as TCP");
    for (mode, mname) in [
        (Mode::Upload, "upload"),
        (Mode::Echo, "echo (bytes each way)"),
    ] {
        for streams in [1usize, 8] {
            println!("\n{mname}, {streams} stream(s):");
            for (name, cfg) in &configs {
                let (mut tcp_best, mut h_best) = (Duration::MAX, Duration::MAX);
                let mut ratios = Vec::new();
                for _ in 0..RUNS {
                    let t = tcp_run(mode, streams, total).await;
                    let h = hbone_run(cfg, mode, streams, total).await;
                    tcp_best = tcp_best.min(t);
                    h_best = h_best.min(h);
                    ratios.push(t.as_secs_f64() / h.as_secs_f64());
                }
                ratios.sort_by(f64::total_cmp);
                println!(
                    "  {name:<44} hbone {:>6.2} Gbit/s  tcp {:>6.2} Gbit/s  ratio {:.2}",
                    gbps(total, h_best),
                    gbps(total, tcp_best),
                    ratios[ratios.len() / 2]
                );
            }
        }
    }
}
