//! Connection pool behaviour against a loopback HBONE echo server.
#![allow(clippy::unwrap_used)] // a test panics to fail

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::{TestServer, WAIT, dial, eventually, no_keepalive};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::timeout;
use weft_hbone::{ConnectRequest, Error, H2Client, H2Config, H2Stream, Pool, PoolConfig};

/// A connect function for the pool that dials `addr` and counts its calls.
fn dialer(
    addr: SocketAddr,
    calls: &Arc<AtomicUsize>,
    delay: Duration,
) -> impl FnOnce() -> std::pin::Pin<Box<dyn Future<Output = Result<H2Client, Error>> + Send>> + use<>
{
    let calls = calls.clone();
    move || {
        Box::pin(async move {
            calls.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(delay).await;
            dial(addr, &no_keepalive()).await
        })
    }
}

async fn ping(stream: &mut H2Stream) {
    stream.write_all(b"x").await.expect("write");
    let mut b = [0u8; 1];
    timeout(WAIT, stream.read_exact(&mut b))
        .await
        .expect("timeout")
        .expect("read");
    assert_eq!(&b, b"x");
}

fn req() -> ConnectRequest {
    ConnectRequest::new("127.0.0.1:80")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sequential_requests_reuse_one_connection() {
    let server = TestServer::echo(H2Config::default()).await;
    let pool = Pool::new(PoolConfig::default());
    let calls = Arc::new(AtomicUsize::new(0));
    for _ in 0..5 {
        let (mut s, _) = pool
            .connect("k", req(), dialer(server.addr, &calls, Duration::ZERO))
            .await
            .expect("connect");
        ping(&mut s).await;
    }
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(pool.created_total(), 1);
    assert_eq!(pool.connections(), 1);
    assert_eq!(server.accepted(), 1);
    assert_eq!(pool.active_streams(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opens_second_connection_when_max_streams_reached() {
    let server = TestServer::echo(H2Config::default()).await;
    let pool = Pool::new(PoolConfig {
        max_streams_per_conn: 2,
        ..Default::default()
    });
    let calls = Arc::new(AtomicUsize::new(0));
    let mut held = Vec::new();
    for _ in 0..3 {
        let (s, _) = pool
            .connect(1u32, req(), dialer(server.addr, &calls, Duration::ZERO))
            .await
            .expect("connect");
        held.push(s);
    }
    assert_eq!(pool.created_total(), 2);
    assert_eq!(pool.connections_for(&1), 2);
    assert_eq!(pool.active_streams(), 3);
    for s in &mut held {
        ping(s).await;
    }
    // A freed slot on the first connection is reused rather than dialing again.
    held.remove(0);
    let (mut s, _) = pool
        .connect(1u32, req(), dialer(server.addr, &calls, Duration::ZERO))
        .await
        .expect("connect");
    ping(&mut s).await;
    assert_eq!(pool.created_total(), 2);
    // Another key never shares.
    let _other = pool
        .connect(2u32, req(), dialer(server.addr, &calls, Duration::ZERO))
        .await
        .expect("connect");
    assert_eq!(pool.created_total(), 3);
    assert_eq!(server.accepted(), 3);
}

// On the paused clock the connect function's delay ends only once every other task waits, so
// all 50 requests are queued behind the one attempt, whatever the machine's load.
#[tokio::test(start_paused = true)]
async fn fifty_concurrent_first_requests_create_one_connection() {
    let server = TestServer::echo(no_keepalive()).await;
    let pool = Pool::new(PoolConfig::default());
    let calls = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..50 {
        let pool = pool.clone();
        let dial = dialer(server.addr, &calls, Duration::from_millis(100));
        tasks.push(tokio::spawn(async move {
            let (mut s, _) = pool.connect("key", req(), dial).await.expect("connect");
            ping(&mut s).await;
            s
        }));
    }
    let mut streams = Vec::new();
    for t in tasks {
        streams.push(timeout(WAIT, t).await.expect("timeout").expect("task"));
    }
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "connect_fn called more than once"
    );
    assert_eq!(pool.created_total(), 1);
    assert_eq!(server.accepted(), 1);
    assert_eq!(pool.active_streams(), 50);
}

// Paused clock: the failing attempt ends only once the other nine callers wait for it.
#[tokio::test(start_paused = true)]
async fn failed_connect_is_shared_with_waiters_then_retried() {
    let pool: Pool<&str> = Pool::new(PoolConfig::default());
    let calls = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..10 {
        let (pool, calls) = (pool.clone(), calls.clone());
        tasks.push(tokio::spawn(async move {
            pool.connect("down", req(), move || async move {
                calls.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(100)).await;
                Err::<H2Client, _>(std::io::Error::other("no route"))
            })
            .await
        }));
    }
    for t in tasks {
        match t.await.expect("task") {
            Err(Error::ConnectFailed(e)) => assert!(e.to_string().contains("no route")),
            other => panic!("expected ConnectFailed, got {other:?}"),
        }
    }
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "waiters must share the failed attempt"
    );
    // A later request tries again.
    let server = TestServer::echo(no_keepalive()).await;
    let (mut s, _) = pool
        .connect("down", req(), dialer(server.addr, &calls, Duration::ZERO))
        .await
        .expect("connect after failure");
    ping(&mut s).await;
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_connection_is_dropped_and_replaced() {
    let server = TestServer::echo(H2Config::default()).await;
    let pool = Pool::new(PoolConfig::default());
    let calls = Arc::new(AtomicUsize::new(0));
    let (mut s, _) = pool
        .connect("k", req(), dialer(server.addr, &calls, Duration::ZERO))
        .await
        .expect("connect");
    ping(&mut s).await;
    drop(s);
    // Kill the TCP connection from the server side, and reconnect at once.
    server.abort_conn(0);
    let (mut s, _) = pool
        .connect("k", req(), dialer(server.addr, &calls, Duration::ZERO))
        .await
        .expect("connect after kill");
    ping(&mut s).await;
    assert_eq!(pool.created_total(), 2);
    assert_eq!(pool.connections(), 1);
    drop(s);

    // A GOAWAY (graceful server shutdown) retires the connection too.
    server.goaway_conn(1);
    eventually("goaway seen", || {
        pool.snapshot()
            .iter()
            .all(|(_, c)| c.iter().all(|c| !c.is_ready()))
    })
    .await;
    let (mut s, _) = pool
        .connect("k", req(), dialer(server.addr, &calls, Duration::ZERO))
        .await
        .expect("connect after goaway");
    ping(&mut s).await;
    assert_eq!(pool.created_total(), 3);
    assert_eq!(pool.connections(), 1);
    assert_eq!(server.conn_result(1).await, Ok(()));
}

#[tokio::test(start_paused = true)]
async fn idle_connections_are_released() {
    const IDLE: Duration = Duration::from_secs(60);
    let server = TestServer::echo(no_keepalive()).await;
    let pool = Pool::new(PoolConfig {
        idle_timeout: IDLE,
        ..Default::default()
    });
    let calls = Arc::new(AtomicUsize::new(0));
    let (mut busy, _) = pool
        .connect("busy", req(), dialer(server.addr, &calls, Duration::ZERO))
        .await
        .expect("connect");
    let (mut idle, _) = pool
        .connect("idle", req(), dialer(server.addr, &calls, Duration::ZERO))
        .await
        .expect("connect");
    ping(&mut idle).await;
    drop(idle);
    // Idle from now. Just short of the timeout (plus the reaper's period, a quarter of it),
    // it is kept; the reaper runs on tokio's clock, so advancing it runs the reaper.
    tokio::time::advance(IDLE - Duration::from_secs(1)).await;
    pool.reap();
    assert_eq!(pool.connections_for(&"idle"), 1, "released early");
    tokio::time::advance(IDLE / 4 + Duration::from_secs(2)).await;
    eventually("idle connection released", || {
        pool.connections_for(&"idle") == 0
    })
    .await;
    assert_eq!(pool.connections_for(&"busy"), 1, "busy connection released");
    ping(&mut busy).await;
    // Released connection closes (server side sees it end).
    eventually("server saw idle close", || server.closed() == 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_closes_when_pool_dropped() {
    let server = TestServer::echo(H2Config::default()).await;
    let pool = Pool::new(PoolConfig::default());
    let calls = Arc::new(AtomicUsize::new(0));
    let (mut s, _) = pool
        .connect("k", req(), dialer(server.addr, &calls, Duration::ZERO))
        .await
        .expect("connect");
    drop(pool);
    // Streams outlive the pool.
    ping(&mut s).await;
    assert_eq!(server.closed(), 0);
    drop(s);
    eventually("connection closed after last stream", || {
        server.closed() == 1
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peer_concurrent_stream_limit_caps_connection_use() {
    let server_cfg = H2Config {
        max_concurrent_streams: 2,
        ..Default::default()
    };
    let server = TestServer::echo(server_cfg).await;
    let pool = Pool::new(PoolConfig::default());
    let calls = Arc::new(AtomicUsize::new(0));
    let mut held = Vec::new();
    for _ in 0..2 {
        let (mut s, _) = pool
            .connect("k", req(), dialer(server.addr, &calls, Duration::ZERO))
            .await
            .expect("connect");
        ping(&mut s).await;
        held.push(s);
    }
    // The server's SETTINGS (max 2 streams) have arrived: a third stream needs a new connection
    // instead of queueing behind the peer's limit.
    let (mut s, _) = timeout(
        WAIT,
        pool.connect("k", req(), dialer(server.addr, &calls, Duration::ZERO)),
    )
    .await
    .expect("queued behind peer limit")
    .expect("connect");
    ping(&mut s).await;
    assert_eq!(pool.created_total(), 2);
}

/// A pooled connection dies while a CONNECT on it waits for its answer: a bare CONNECT is sent again on a new
/// connection, one with early data is not (the peer may have delivered the bytes; sending them twice would
/// duplicate them) and fails instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connect_with_early_data_is_not_retried_after_its_connection_died() {
    for early in [false, true] {
        // Port 1: the first such stream is held unanswered and reported; any later one is echoed.
        let (held_tx, mut held_rx) = tokio::sync::mpsc::unbounded_channel::<()>();
        let held = Arc::new(AtomicUsize::new(0));
        let server = TestServer::start(
            H2Config::default(),
            move |req: weft_hbone::InboundRequest| {
                let (held_tx, held) = (held_tx.clone(), held.clone());
                async move {
                    let port = req.connect_target().map(|a| a.port()).unwrap_or(0);
                    if port == 1 && held.fetch_add(1, Ordering::SeqCst) == 0 {
                        let _ = held_tx.send(());
                        std::future::pending::<()>().await;
                    }
                    common::echo(req).await;
                }
            },
        )
        .await;
        let pool = Pool::new(PoolConfig::default());
        let calls = Arc::new(AtomicUsize::new(0));
        let (warm, _) = pool
            .connect("k", req(), dialer(server.addr, &calls, Duration::ZERO))
            .await
            .expect("connect");
        drop(warm);
        let mut held_req = ConnectRequest::new("127.0.0.1:1");
        if early {
            held_req = held_req.with_early_data(bytes::Bytes::from_static(b"x"));
        }
        let attempt = {
            let (pool, dial) = (pool.clone(), dialer(server.addr, &calls, Duration::ZERO));
            tokio::spawn(async move { pool.connect("k", held_req, dial).await })
        };
        timeout(WAIT, held_rx.recv())
            .await
            .expect("the CONNECT reached the server");
        server.abort_conn(0);
        let res = timeout(WAIT, attempt)
            .await
            .expect("timeout")
            .expect("task");
        if early {
            let Err(e) = res else {
                panic!("a CONNECT with early data must not be sent twice");
            };
            assert!(!e.is_retryable_on_new_connection(true), "{e}");
            assert_eq!(server.accepted(), 1, "no second connection");
        } else {
            let (mut s, _) = res.expect("a bare CONNECT is retried on a new connection");
            ping(&mut s).await;
            assert_eq!(server.accepted(), 2);
        }
    }
}

/// Offers its chunks one by one, then ends.
struct Chunks(std::collections::VecDeque<bytes::Bytes>);

impl weft_hbone::EarlyData for Chunks {
    fn poll_early(
        &mut self,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<bytes::Bytes>> {
        std::task::Poll::Ready(self.0.pop_front())
    }
}

/// A plain HTTP/2 server for one connection: it answers the first CONNECT with 200 (the pool's warm-up), and
/// refuses every later one (`REFUSED_STREAM`) once the stream's first bytes have arrived, which it reports.
async fn refusing_server() -> (
    SocketAddr,
    tokio::sync::mpsc::UnboundedReceiver<bytes::Bytes>,
) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (seen_tx, seen_rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.unwrap();
        let mut conn = h2::server::handshake(tcp).await.unwrap();
        let mut kept = Vec::new();
        while let Some(Ok((req, mut respond))) = conn.accept().await {
            if kept.is_empty() {
                let ok = http::Response::builder().status(200).body(()).unwrap();
                kept.push(respond.send_response(ok, false).unwrap());
                continue;
            }
            let seen_tx = seen_tx.clone();
            tokio::spawn(async move {
                let mut body = req.into_body();
                if let Some(Ok(first)) = body.data().await {
                    let _ = seen_tx.send(first);
                }
                respond.send_reset(h2::Reason::REFUSED_STREAM);
            });
        }
    });
    (addr, seen_rx)
}

/// The peer refuses a CONNECT after its early data arrived: the CONNECT is retried on a new connection with the
/// same bytes (the source gave them once; without them the tunnel would start in the middle of the client's
/// data and the client would wait for an answer forever).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_connect_is_retried_with_the_early_data_it_had_taken() {
    let (refusing, mut seen) = refusing_server().await;
    let echo = TestServer::echo(H2Config::default()).await;
    let pool = Pool::new(PoolConfig::default());
    let calls = Arc::new(AtomicUsize::new(0));
    let (warm, _) = pool
        .connect("k", req(), dialer(refusing, &calls, Duration::ZERO))
        .await
        .expect("connect");
    let mut early = Chunks(
        [&b"first "[..], b"second"]
            .into_iter()
            .map(bytes::Bytes::from_static)
            .collect(),
    );
    // The pooled connection (to the refusing server) is tried first; the retry dials the echo server.
    let (mut s, _) = timeout(
        WAIT,
        pool.connect_with_early(
            "k",
            req(),
            &mut early,
            dialer(echo.addr, &calls, Duration::ZERO),
        ),
    )
    .await
    .expect("timeout")
    .expect("the refused CONNECT is retried");
    let first = timeout(WAIT, seen.recv()).await.expect("timeout").unwrap();
    assert!(
        b"first second".starts_with(&first),
        "the refusing server got {first:?}"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 2, "one new connection");
    let back = common::finish(&mut s).await;
    assert_eq!(back, b"first second", "the retry carried every early byte");
    drop(warm);
}
