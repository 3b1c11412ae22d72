//! The admin, metrics and readiness servers bound what a client can hold: late request headers
//! and old connections are cut off, and a connection cap holds and frees up.
#![allow(clippy::unwrap_used)] // a test panics to fail

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::timeout;
use tokio_util::sync::CancellationToken;
use weft_admin::{AdminError, AdminHandler, Limits, Server, Serving, serve_with};

/// Upper bound for anything a paused-clock test waits on (virtual time: it must exceed the
/// deadlines under test).
const WAIT: Duration = Duration::from_secs(600);
/// Upper bound for anything a real-time test waits on.
const REAL_WAIT: Duration = Duration::from_secs(20);

/// Answers every route; its metrics page is `metrics_len` bytes, ending in `# EOF`.
struct Handler {
    metrics_len: usize,
}

impl AdminHandler for Handler {
    fn config_dump(&self) -> serde_json::Value {
        serde_json::json!({})
    }
    fn readiness(&self) -> Result<(), Vec<String>> {
        Ok(())
    }
    fn log_level(&self) -> String {
        "info".into()
    }
    fn set_log_level(&self, level: &str) -> Result<String, String> {
        Ok(level.into())
    }
    fn metrics(&self) -> String {
        let mut page = "#".repeat(self.metrics_len.saturating_sub(8));
        page.push_str("\n# EOF\n");
        page
    }
    fn quit(&self) {}
}

async fn start(which: Server, handler: &Arc<dyn AdminHandler>, limits: Limits) -> Serving {
    serve_with(
        which,
        "127.0.0.1:0".parse().unwrap(),
        handler.clone(),
        CancellationToken::new(),
        limits,
    )
    .await
    .unwrap()
}

fn handler(metrics_len: usize) -> Arc<dyn AdminHandler> {
    Arc::new(Handler { metrics_len })
}

/// Reads until the server closes the connection; returns what it sent.
async fn read_until_closed(tcp: &mut TcpStream, wait: Duration) -> Vec<u8> {
    let mut got = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    timeout(wait, async {
        loop {
            match tcp.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await
    .expect("the server kept the connection open");
    got
}

/// Sends a keep-alive readiness request and reads its (fixed-size) response.
async fn ready_request(tcp: &mut TcpStream, wait: Duration) {
    tcp.write_all(b"GET /healthz/ready HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    while !(got.ends_with(b"ready\n")) {
        let n = timeout(wait, tcp.read(&mut buf)).await.unwrap().unwrap();
        assert!(n > 0, "closed: {}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
    }
    assert!(
        got.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&got)
    );
}

fn limits(header: Duration, max: usize, age: Duration) -> Limits {
    Limits {
        header_read_timeout: header,
        max_connections: max,
        max_connection_age: age,
    }
}

#[tokio::test(start_paused = true)]
async fn a_silent_client_is_cut_off_by_the_header_read_timeout() {
    let h = handler(0);
    let hour = Duration::from_secs(3600);
    let s = start(
        Server::Readiness,
        &h,
        limits(Duration::from_secs(10), 8, hour),
    )
    .await;
    // Nothing at all, then (slowloris) a request line and a header but never the blank line.
    let mut silent = TcpStream::connect(s.addr).await.unwrap();
    let mut partial = TcpStream::connect(s.addr).await.unwrap();
    partial
        .write_all(b"GET /healthz/ready HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    for tcp in [&mut silent, &mut partial] {
        let got = read_until_closed(tcp, WAIT).await;
        assert!(
            !got.starts_with(b"HTTP/1.1 200"),
            "{}",
            String::from_utf8_lossy(&got)
        );
    }
    assert_eq!(s.stats.timed_out_total(), 2);
    // A client that sends its request in time is served.
    let mut ok = TcpStream::connect(s.addr).await.unwrap();
    ready_request(&mut ok, WAIT).await;
}

#[tokio::test(start_paused = true)]
async fn a_connection_that_does_not_read_its_response_is_closed_after_its_maximum_age() {
    // 32 MiB: more than the socket buffers hold, so the server's write blocks.
    const PAGE: usize = 32 << 20;
    let h = handler(PAGE);
    let s = start(
        Server::Metrics,
        &h,
        limits(Duration::from_secs(10), 8, Duration::from_secs(60)),
    )
    .await;
    let mut tcp = TcpStream::connect(s.addr).await.unwrap();
    tcp.write_all(b"GET /stats/prometheus HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    // Wait, without reading, until the server gives up on the connection.
    let waited = timeout(WAIT, async {
        while s.stats.timed_out_total() == 0 {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    })
    .await;
    assert!(waited.is_ok(), "the connection was never closed");
    assert_eq!(s.stats.timed_out_total(), 1);
    assert_eq!(s.stats.active(), 0);
    let got = read_until_closed(&mut tcp, WAIT).await;
    assert!(got.len() < PAGE, "the whole page was delivered");
}

#[tokio::test(start_paused = true)]
async fn a_keep_alive_connection_is_closed_gracefully_after_its_maximum_age() {
    let h = handler(0);
    let s = start(
        Server::Readiness,
        &h,
        limits(Duration::from_secs(10), 8, Duration::from_secs(60)),
    )
    .await;
    let mut tcp = TcpStream::connect(s.addr).await.unwrap();
    // A request every 5 s keeps the header deadline from firing; the age bound still ends it,
    // after answering the request in progress.
    let mut served = 0;
    loop {
        // Once the server has closed, the write may fail; the read below tells.
        let _ = tcp
            .write_all(b"GET /healthz/ready HTTP/1.1\r\nHost: x\r\n\r\n")
            .await;
        let mut got = Vec::new();
        let mut buf = [0u8; 1024];
        let closed = loop {
            let n = timeout(WAIT, tcp.read(&mut buf))
                .await
                .unwrap()
                .unwrap_or(0);
            if n == 0 {
                break true;
            }
            got.extend_from_slice(&buf[..n]);
            if got.ends_with(b"ready\n") {
                break false;
            }
        };
        if closed {
            break;
        }
        served += 1;
        assert!(served < 100, "never closed");
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
    assert!(served >= 12, "closed after {served} requests");
    assert_eq!(s.stats.timed_out_total(), 0, "closed gracefully");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_connection_cap_holds_and_frees_up() {
    let h = handler(0);
    let hour = Duration::from_secs(3600);
    let s = start(Server::Readiness, &h, limits(hour, 2, hour)).await;
    let metrics = start(Server::Metrics, &h, limits(hour, 8, hour)).await;

    let mut first = TcpStream::connect(s.addr).await.unwrap();
    let mut second = TcpStream::connect(s.addr).await.unwrap();
    ready_request(&mut first, REAL_WAIT).await;
    ready_request(&mut second, REAL_WAIT).await;
    assert_eq!(s.stats.active(), 2);

    // The third is closed at once, without an answer.
    let mut third = TcpStream::connect(s.addr).await.unwrap();
    let _ = third
        .write_all(b"GET /healthz/ready HTTP/1.1\r\nHost: x\r\n\r\n")
        .await;
    let got = read_until_closed(&mut third, REAL_WAIT).await;
    assert!(got.is_empty(), "{}", String::from_utf8_lossy(&got));
    assert_eq!(s.stats.refused_total(), 1);
    // The first two are still served.
    ready_request(&mut first, REAL_WAIT).await;
    ready_request(&mut second, REAL_WAIT).await;

    // Closing one frees its slot.
    drop(first);
    timeout(REAL_WAIT, async {
        while s.stats.active() > 1 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the server never noticed the close");
    let mut fourth = TcpStream::connect(s.addr).await.unwrap();
    ready_request(&mut fourth, REAL_WAIT).await;
    assert_eq!(s.stats.refused_total(), 1);

    // The metrics server of the same weft exports the counters.
    let mut m = TcpStream::connect(metrics.addr).await.unwrap();
    m.write_all(b"GET /stats/prometheus HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let page = String::from_utf8(read_until_closed(&mut m, REAL_WAIT).await).unwrap();
    assert!(
        page.contains("weft_admin_connections_refused_total{server=\"readiness\"} 1\n"),
        "{page}"
    );
    assert!(
        page.contains("weft_admin_connections_active{server=\"readiness\"} 2\n"),
        "{page}"
    );
    assert!(page.ends_with("# EOF\n"), "{page}");
}

#[tokio::test]
async fn limits_that_would_refuse_every_connection_are_an_error() {
    let h = handler(0);
    for (bad, why) in [
        (
            Limits {
                max_connections: 0,
                ..Limits::default()
            },
            "max_connections",
        ),
        (
            Limits {
                header_read_timeout: Duration::ZERO,
                ..Limits::default()
            },
            "header_read_timeout",
        ),
        (
            Limits {
                max_connection_age: Duration::ZERO,
                ..Limits::default()
            },
            "max_connection_age",
        ),
    ] {
        let err = serve_with(
            Server::Metrics,
            "127.0.0.1:0".parse().unwrap(),
            h.clone(),
            CancellationToken::new(),
            bad,
        )
        .await
        .expect_err(why);
        assert!(
            matches!(
                &err,
                AdminError::InvalidLimits {
                    what: "metrics",
                    ..
                }
            ) && err.to_string().contains(why),
            "{err}"
        );
    }
}
