//! Client + server over loopback TCP: round trips, bulk transfer, half-close, statuses, resets.
#![allow(clippy::unwrap_used)] // a test panics to fail

mod common;

use std::time::Duration;

use common::{TestServer, WAIT, dial, pattern};
use http::{HeaderValue, StatusCode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::timeout;
use weft_hbone::{ConnectRequest, Error, H2Config, InboundRequest};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_round_trip_through_echo() {
    let server = TestServer::echo(H2Config::default()).await;
    let client = dial(server.addr, &H2Config::default()).await.expect("dial");
    let req = ConnectRequest::new("127.0.0.1:8080").with_header(
        "x-echo".parse().expect("name"),
        HeaderValue::from_static("hi"),
    );
    let (mut stream, headers) = client.connect(req).await.expect("connect");
    assert_eq!(
        headers.get("x-authority").expect("x-authority"),
        "127.0.0.1:8080"
    );
    assert_eq!(headers.get("x-echo").expect("x-echo"), "hi");
    assert_eq!(client.active_streams(), 1);

    stream.write_all(b"hello hbone").await.expect("write");
    let mut buf = [0u8; 11];
    stream.read_exact(&mut buf).await.expect("read");
    assert_eq!(&buf, b"hello hbone");
    stream.shutdown().await.expect("shutdown");
    let mut rest = Vec::new();
    stream.read_to_end(&mut rest).await.expect("eof");
    assert!(rest.is_empty());
    drop(stream);
    assert_eq!(client.active_streams(), 0);
    assert!(client.is_ready() && !client.is_closed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ipv6_authority_round_trip() {
    let server = TestServer::echo(H2Config::default()).await;
    let client = dial(server.addr, &H2Config::default()).await.expect("dial");
    let target = "[fd00::7]:443".parse().expect("addr");
    let (_stream, headers) = client
        .connect(ConnectRequest::to_addr(target))
        .await
        .expect("connect");
    assert_eq!(
        headers.get("x-authority").expect("x-authority"),
        "[fd00::7]:443"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_transfer_64mib_each_way_concurrently() {
    const LEN: usize = 64 * 1024 * 1024;
    let server = TestServer::echo(H2Config::default()).await;
    let client = dial(server.addr, &H2Config::default()).await.expect("dial");
    let (stream, _) = client
        .connect(ConnectRequest::new("127.0.0.1:1"))
        .await
        .expect("connect");
    let (mut r, mut w) = stream.into_split();
    let sent = pattern(LEN, 0x5a);
    let expected = sent.clone();
    let writer = tokio::spawn(async move {
        for chunk in sent.chunks(100_003) {
            w.write_all(chunk).await.expect("write");
        }
        w.shutdown().await.expect("shutdown");
        w
    });
    let mut got = Vec::with_capacity(LEN);
    timeout(Duration::from_secs(120), r.read_to_end(&mut got))
        .await
        .expect("transfer timed out")
        .expect("read");
    let _w = writer.await.expect("writer");
    assert_eq!(got.len(), LEN);
    assert!(got == expected, "echoed bytes differ");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_close_client_first_still_reads_server_bytes() {
    let server = TestServer::start(H2Config::default(), |req: InboundRequest| async move {
        let Ok(mut s) = req.accept(Default::default()) else {
            return;
        };
        let mut got = Vec::new();
        if s.read_to_end(&mut got).await.is_err() {
            return;
        }
        // Client already half-closed; our direction must still work.
        let reply = format!("got {} bytes: {}", got.len(), String::from_utf8_lossy(&got));
        let _ = s.write_all(reply.as_bytes()).await;
        let _ = s.shutdown().await;
    })
    .await;
    let client = dial(server.addr, &H2Config::default()).await.expect("dial");
    let (mut s, _) = client
        .connect(ConnectRequest::new("127.0.0.1:1"))
        .await
        .expect("connect");
    s.write_all(b"ping").await.expect("write");
    s.shutdown().await.expect("half-close");
    assert!(
        s.write_all(b"more").await.is_err(),
        "write after shutdown must fail"
    );
    let mut reply = String::new();
    timeout(WAIT, s.read_to_string(&mut reply))
        .await
        .expect("timeout")
        .expect("read");
    assert_eq!(reply, "got 4 bytes: ping");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_close_server_first_still_reads_client_bytes() {
    let (tx, rx) = tokio::sync::oneshot::channel::<Vec<u8>>();
    let tx = std::sync::Arc::new(std::sync::Mutex::new(Some(tx)));
    let server = TestServer::start(H2Config::default(), move |req: InboundRequest| {
        let tx = tx.clone();
        async move {
            let Ok(s) = req.accept(Default::default()) else {
                return;
            };
            let (mut r, mut w) = s.into_split();
            let _ = w.write_all(b"greeting").await;
            let _ = w.shutdown().await;
            let mut got = Vec::new();
            let _ = r.read_to_end(&mut got).await;
            if let Some(tx) = tx.lock().expect("lock").take() {
                let _ = tx.send(got);
            }
        }
    })
    .await;
    let client = dial(server.addr, &H2Config::default()).await.expect("dial");
    let (mut s, _) = client
        .connect(ConnectRequest::new("127.0.0.1:1"))
        .await
        .expect("connect");
    let mut greeting = Vec::new();
    timeout(WAIT, s.read_to_end(&mut greeting))
        .await
        .expect("timeout")
        .expect("read");
    assert_eq!(greeting, b"greeting");
    // The server's side is closed; ours is still open.
    s.write_all(b"late data")
        .await
        .expect("write after peer half-close");
    s.shutdown().await.expect("shutdown");
    let got = timeout(WAIT, rx)
        .await
        .expect("timeout")
        .expect("server result");
    assert_eq!(got, b"late data");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_200_statuses_surface_as_error_status() {
    let server = TestServer::start(H2Config::default(), |req: InboundRequest| async move {
        let status = match req.connect_target() {
            Err(s) => s,
            Ok(a) if a.port() == 401 => StatusCode::UNAUTHORIZED,
            Ok(a) if a.port() == 503 => StatusCode::SERVICE_UNAVAILABLE,
            Ok(_) => StatusCode::BAD_REQUEST,
        };
        let _ = req.reject(status);
    })
    .await;
    let client = dial(server.addr, &H2Config::default()).await.expect("dial");
    for (authority, want) in [
        ("10.0.0.1:401", StatusCode::UNAUTHORIZED),
        ("10.0.0.1:503", StatusCode::SERVICE_UNAVAILABLE),
        ("example.com:80", StatusCode::BAD_REQUEST),
        ("10.0.0.1", StatusCode::BAD_REQUEST),
    ] {
        match client.connect(ConnectRequest::new(authority)).await {
            Err(Error::Status(s)) => assert_eq!(s, want, "{authority}"),
            other => panic!("{authority}: expected status {want}, got {other:?}"),
        }
    }
    assert_eq!(client.active_streams(), 0);
    assert!(client.is_ready(), "rejections must not hurt the connection");
    assert!(matches!(
        client
            .connect(ConnectRequest::new("not an authority"))
            .await,
        Err(Error::BadAuthority(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_stream_surfaces_as_io_error() {
    let server = TestServer::start(H2Config::default(), |req: InboundRequest| async move {
        let Ok(mut s) = req.accept(Default::default()) else {
            return;
        };
        let mut b = [0u8; 1];
        let _ = s.read_exact(&mut b).await;
        s.reset(h2::Reason::CONNECT_ERROR);
    })
    .await;
    let client = dial(server.addr, &H2Config::default()).await.expect("dial");
    let (mut s, _) = client
        .connect(ConnectRequest::new("127.0.0.1:1"))
        .await
        .expect("connect");
    s.write_all(b"x").await.expect("write");
    let mut buf = [0u8; 16];
    let err = timeout(WAIT, s.read(&mut buf))
        .await
        .expect("timeout")
        .expect_err("reset");
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionReset);
    let reason = err
        .get_ref()
        .and_then(|e| e.downcast_ref::<h2::Error>())
        .and_then(h2::Error::reason);
    assert_eq!(reason, Some(h2::Reason::CONNECT_ERROR));
    let werr = timeout(WAIT, async {
        loop {
            if let Err(e) = s.write_all(b"y").await {
                return e;
            }
        }
    })
    .await
    .expect("writes keep succeeding after reset");
    assert_eq!(werr.kind(), std::io::ErrorKind::ConnectionReset, "{werr:?}");
}

// Paused clock: a write that has not completed when virtual time moves on is blocked for good
// (every task waits), so "the writer stalled" does not depend on the machine's speed.
#[tokio::test(start_paused = true)]
async fn slow_reader_back_pressures_writer() {
    let cfg = common::no_keepalive();
    let (release_tx, release_rx) = tokio::sync::watch::channel(false);
    let server = TestServer::start(cfg.clone(), move |req: InboundRequest| {
        let mut release = release_rx.clone();
        async move {
            let Ok(mut s) = req.accept(Default::default()) else {
                return;
            };
            // Read nothing until told to, then drain.
            let _ = release.wait_for(|r| *r).await;
            let mut sink = Vec::new();
            let _ = s.read_to_end(&mut sink).await;
            let _ = s.write_all(&(sink.len() as u64).to_be_bytes()).await;
            let _ = s.shutdown().await;
        }
    })
    .await;
    let client = dial(server.addr, &cfg).await.expect("dial");
    let (mut s, _) = client
        .connect(ConnectRequest::new("127.0.0.1:1"))
        .await
        .expect("connect");
    let chunk = vec![7u8; 256 * 1024];
    let mut written = 0usize;
    // Write until a write blocks: the peer's window plus our send buffer must stop us.
    while let Ok(r) = timeout(Duration::from_secs(1), s.write(&chunk)).await {
        written += r.expect("write");
        assert!(written <= 64 * 1024 * 1024, "writer never blocked");
    }
    let window = cfg.stream_window_size as usize;
    let bound = window + cfg.client_max_send_buffer_size + chunk.len();
    assert!(written <= bound, "buffered {written} > {bound}");
    assert!(written >= window / 2, "only {written} written");
    release_tx.send(true).expect("release");
    s.shutdown().await.expect("shutdown");
    let mut n = [0u8; 8];
    timeout(WAIT, s.read_exact(&mut n))
        .await
        .expect("timeout")
        .expect("read");
    assert_eq!(u64::from_be_bytes(n) as usize, written);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_count_follows_both_halves() {
    let server = TestServer::echo(H2Config::default()).await;
    let client = dial(server.addr, &H2Config::default()).await.expect("dial");
    let mut streams = Vec::new();
    for _ in 0..3 {
        streams.push(
            client
                .connect(ConnectRequest::new("127.0.0.1:9"))
                .await
                .expect("connect")
                .0,
        );
    }
    assert_eq!(client.active_streams(), 3);
    let (r, w) = streams.pop().expect("stream").into_split();
    drop(r);
    assert_eq!(client.active_streams(), 3, "one half still alive");
    drop(w);
    assert_eq!(client.active_streams(), 2);
    streams.clear();
    assert_eq!(client.active_streams(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zero_copy_chunk_api_round_trip() {
    let server = TestServer::echo(H2Config::default()).await;
    let client = dial(server.addr, &H2Config::default()).await.expect("dial");
    let (s, _) = client
        .connect(ConnectRequest::new("127.0.0.1:1"))
        .await
        .expect("connect");
    let (mut r, mut w) = s.into_split();
    let payload = bytes::Bytes::from(pattern(3 * 1024 * 1024 + 17, 3));
    let expected = payload.clone();
    let writer = tokio::spawn(async move {
        w.send_bytes(payload).await.expect("send");
        w.shutdown().await.expect("shutdown");
    });
    let mut got = Vec::new();
    while let Some(chunk) = timeout(WAIT, r.read_chunk())
        .await
        .expect("timeout")
        .expect("read")
    {
        got.extend_from_slice(&chunk);
    }
    writer.await.expect("writer");
    assert!(got == expected[..]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_read_half_returns_connection_window() {
    let server = TestServer::echo(H2Config::default()).await;
    // A connection window that fits only two of the echoes below.
    let cfg = H2Config {
        stream_window_size: 64 * 1024,
        connection_window_size: 128 * 1024,
        ..Default::default()
    };
    let client = dial(server.addr, &cfg).await.expect("dial");
    let mut writers = Vec::new();
    for _ in 0..8 {
        let (s, _) = client
            .connect(ConnectRequest::new("127.0.0.1:1"))
            .await
            .expect("connect");
        let (mut r, mut w) = s.into_split();
        w.write_all(&[1u8; 48 * 1024]).await.expect("write");
        let mut b = [0u8; 1];
        timeout(WAIT, r.read_exact(&mut b))
            .await
            .expect("stalled: connection window leaked")
            .expect("read");
        // Drop the read half with ~48 KiB received but unread; keep the stream open.
        drop(r);
        writers.push(w);
    }
}

/// Handler: accepts, reads until the client half-closes, answers `got:` and what it read, and half-closes.
async fn tell_what_came(req: InboundRequest) {
    let Ok(stream) = req.accept(http::HeaderMap::new()) else {
        return;
    };
    let (mut r, mut w) = stream.into_split();
    let mut got = Vec::new();
    if r.read_to_end(&mut got).await.is_err() {
        return;
    }
    let _ = w.write_all(&[b"got:", &got[..]].concat()).await;
    let _ = w.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn early_data_goes_with_the_connect_and_comes_first() {
    let server = TestServer::start(H2Config::default(), tell_what_came).await;
    let client = dial(server.addr, &H2Config::default()).await.expect("dial");
    let req = ConnectRequest::new("127.0.0.1:8080")
        .with_early_data(bytes::Bytes::from_static(b"GET / HTTP/1.1\r\n"));
    let (mut stream, _) = client.connect(req).await.expect("connect");
    // The early bytes were sent by `connect` itself; what the stream writes follows them.
    stream.write_all(b"\r\n").await.expect("write");
    let back = common::finish(&mut stream).await;
    assert_eq!(back, b"got:GET / HTTP/1.1\r\n\r\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn early_data_of_a_refused_connect_is_dropped_with_its_stream() {
    let server = TestServer::start(H2Config::default(), |req: InboundRequest| async move {
        match req.connect_target() {
            Ok(a) if a.port() == 401 => {
                let _ = req.reject(StatusCode::UNAUTHORIZED);
            }
            _ => tell_what_came(req).await,
        }
    })
    .await;
    let client = dial(server.addr, &H2Config::default()).await.expect("dial");
    let early = bytes::Bytes::from(pattern(40_000, 3));
    for i in 0..3 {
        let refused = client
            .connect(ConnectRequest::new("10.0.0.1:401").with_early_data(early.clone()))
            .await;
        assert!(
            matches!(refused, Err(Error::Status(StatusCode::UNAUTHORIZED))),
            "attempt {i}: {refused:?}"
        );
    }
    // The connection is unharmed (the refused streams' bytes did not use up its window) and the next tunnel
    // gets its own early data only.
    assert!(client.is_ready());
    let (mut stream, _) = client
        .connect(ConnectRequest::new("10.0.0.1:80").with_early_data(early.clone()))
        .await
        .expect("connect");
    let back = common::finish(&mut stream).await;
    assert_eq!(back, [b"got:", &early[..]].concat());
}

#[test]
fn a_refused_or_unsent_connect_is_retried_with_or_without_early_data() {
    let refused = || Error::H2(h2::Error::from(h2::Reason::REFUSED_STREAM));
    for early in [false, true] {
        assert!(refused().is_retryable_on_new_connection(early));
        assert!(Error::ConnectionClosed.is_retryable_on_new_connection(early));
        assert!(!Error::Status(StatusCode::FORBIDDEN).is_retryable_on_new_connection(early));
    }
}

/// Offers one chunk when the test sends it, then ends; records that it was taken.
struct ChannelEarly {
    rx: tokio::sync::mpsc::UnboundedReceiver<bytes::Bytes>,
    taken: Option<tokio::sync::oneshot::Sender<()>>,
}

impl weft_hbone::EarlyData for ChannelEarly {
    fn poll_early(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<bytes::Bytes>> {
        let chunk = std::task::ready!(self.rx.poll_recv(cx));
        if chunk.is_some()
            && let Some(t) = self.taken.take()
        {
            let _ = t.send(());
        }
        std::task::Poll::Ready(chunk)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bytes_that_arrive_while_the_connect_waits_go_before_its_response() {
    // The server answers only when the test says so.
    let (go_tx, go_rx) = tokio::sync::watch::channel(false);
    let server = TestServer::start(H2Config::default(), move |req: InboundRequest| {
        let mut go = go_rx.clone();
        async move {
            let _ = go.wait_for(|g| *g).await;
            tell_what_came(req).await;
        }
    })
    .await;
    let client = dial(server.addr, &H2Config::default()).await.expect("dial");
    let (chunks, rx) = tokio::sync::mpsc::unbounded_channel();
    let (taken_tx, taken_rx) = tokio::sync::oneshot::channel();
    let connecting = tokio::spawn(async move {
        let mut early = ChannelEarly {
            rx,
            taken: Some(taken_tx),
        };
        let r = client
            .connect_with_early(ConnectRequest::new("127.0.0.1:80"), &mut early)
            .await;
        (r, client)
    });
    chunks
        .send(bytes::Bytes::from_static(b"while waiting"))
        .unwrap();
    drop(chunks);
    timeout(WAIT, taken_rx)
        .await
        .expect("timeout")
        .expect("the chunk was taken while the CONNECT waited");
    go_tx.send(true).unwrap();
    let (r, _client) = timeout(WAIT, connecting)
        .await
        .expect("timeout")
        .expect("task");
    let (mut stream, _) = r.expect("connect");
    let back = common::finish(&mut stream).await;
    assert_eq!(back, b"got:while waiting");
}
