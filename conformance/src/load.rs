//! Load for benchmarks: a one-byte request/response server (keep-alive), a one-shot server that closes first, a
//! connection-rate client that counts successes and failures in a time window, and the open-file limit a bench
//! holding many connections needs.

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

/// Serve "answer one byte, then close" on `addr` forever: the server closes first, as an HTTP server does for
/// `Connection: close`, so TIME_WAIT lands on the server side and the client's port search stays cheap.
pub async fn close_server(addr: SocketAddr) -> std::io::Result<()> {
    let lis = tokio::net::TcpListener::bind(addr).await?;
    loop {
        let (mut s, _) = lis.accept().await?;
        let _ = s.set_nodelay(true);
        tokio::spawn(async move {
            let mut b = [0u8; 1];
            if let Ok(1) = s.read(&mut b).await {
                let _ = s.write_all(&b).await;
            }
        });
    }
}

/// New connections to a [`close_server`] at `dst` over `window` with `concurrency` loops (from node A's
/// namespace; `bypass` skips capture): connect, one byte each way, wait for the server's FIN, close. Returns
/// (completed, failed, seconds it really took).
pub async fn conn_rate(
    dst: SocketAddr,
    bypass: bool,
    window: Duration,
    concurrency: usize,
) -> (u64, u64, f64) {
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
                    match s.read(&mut b).await? {
                        0 => std::io::Result::Ok(()),
                        _ => Err(std::io::Error::other("server sent more than one byte")),
                    }
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
        } else {
            failed += 1;
        }
    }
    (ok, failed, start.elapsed().as_secs_f64())
}

/// Raises this process's open-file limit (soft and hard) to at least `n` if it is lower (children inherit it) and
/// returns the soft limit in force. Raising the hard limit needs `CAP_SYS_RESOURCE`; without it the soft limit goes
/// as far as the hard one.
pub fn raise_nofile(n: u64) -> u64 {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let now = getrlimit(Resource::Nofile);
    let soft = now.current.unwrap_or(u64::MAX);
    if soft >= n {
        return soft;
    }
    let hard = now.maximum;
    let want = Rlimit {
        current: Some(n),
        maximum: Some(hard.map_or(n, |h| h.max(n))),
    };
    if setrlimit(Resource::Nofile, want).is_ok() {
        return n;
    }
    let _ = setrlimit(
        Resource::Nofile,
        Rlimit {
            current: hard,
            maximum: hard,
        },
    );
    getrlimit(Resource::Nofile).current.unwrap_or(soft)
}
