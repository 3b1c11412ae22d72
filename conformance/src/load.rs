//! Load for benchmarks: a one-byte request/response server, and a connection-rate client (connect, one byte each
//! way, close) that counts successes and failures in a time window.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Serve one-byte request/response on `addr` forever (each byte read is written back).
pub async fn rr_server(addr: SocketAddr) -> std::io::Result<()> {
    let lis = tokio::net::TcpListener::bind(addr).await?;
    loop {
        let (mut s, _) = lis.accept().await?;
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

/// New connections per second to `dst` over `window` with `concurrency` loops (from node A's namespace; `bypass`
/// skips capture). Returns (connections/s, failures).
pub async fn conn_rate(
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
                    let mut s = crate::netmesh::connect(dst, bypass).await?;
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
        if let Ok((o, f)) = t.await {
            ok += o;
            failed += f;
        }
    }
    (ok as f64 / start.elapsed().as_secs_f64(), failed)
}
