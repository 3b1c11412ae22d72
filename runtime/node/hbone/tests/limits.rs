//! Deadlines and limits a peer cannot get around: the server's deadline for the client preface
//! and SETTINGS, the client's deadline for the CONNECT response, header-list limits on both
//! sides, and the SETTINGS each side advertises on the wire.
#![allow(clippy::unwrap_used)] // a test panics to fail

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{TestServer, WAIT, dial, echo, no_keepalive};
use http::{HeaderMap, HeaderValue, StatusCode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::timeout;
use tokio_util::sync::CancellationToken;
use weft_hbone::{
    ConnectRequest, Error, H2Config, H2Stream, InboundRequest, Pool, PoolConfig, serve_connection,
};

const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Starts `serve_connection` for the next connection on a new listener; returns the listener's
/// address and the server's result.
async fn serve_one(
    cfg: H2Config,
) -> (
    std::net::SocketAddr,
    tokio::task::JoinHandle<Result<(), Error>>,
) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.unwrap();
        serve_connection(tcp, &cfg, CancellationToken::new(), echo).await
    });
    (addr, task)
}

/// Reads until the server closes the connection (EOF or reset); returns what it had sent.
async fn read_until_closed(tcp: &mut TcpStream) -> Vec<u8> {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match tcp.read(&mut buf).await {
            Ok(0) | Err(_) => return got,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
}

async fn round_trip(s: &mut H2Stream, msg: &[u8]) {
    s.write_all(msg).await.unwrap();
    let mut back = vec![0u8; msg.len()];
    s.read_exact(&mut back).await.unwrap();
    assert_eq!(back, msg);
}

// --- the server's deadline for the preface and SETTINGS -----------------------------------

#[tokio::test(start_paused = true)]
async fn silent_peer_is_cut_off_by_the_handshake_timeout() {
    let cfg = no_keepalive();
    let (addr, server) = serve_one(cfg.clone()).await;
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    // The peer completed TCP (TLS is the caller's) and sends nothing. Virtual time moves on only
    // when every task waits, so the deadline fires exactly when nothing else can happen.
    let res = timeout(WAIT, server)
        .await
        .expect("serve_connection kept a silent peer")
        .unwrap();
    assert!(
        matches!(res, Err(Error::HandshakeTimeout(d)) if d == cfg.handshake_timeout),
        "{res:?}"
    );
    read_until_closed(&mut tcp).await;
}

#[tokio::test(start_paused = true)]
async fn peer_sending_the_preface_but_no_settings_is_cut_off() {
    let cfg = no_keepalive();
    let (addr, server) = serve_one(cfg.clone()).await;
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    tcp.write_all(PREFACE).await.unwrap();
    // Half a SETTINGS frame: the header announces 6 bytes of payload that never come.
    tcp.write_all(&[0, 0, 6, 0x4, 0, 0, 0, 0, 0, 0, 3])
        .await
        .unwrap();
    let res = timeout(WAIT, server)
        .await
        .expect("serve_connection kept a peer that never finished SETTINGS")
        .unwrap();
    assert!(matches!(res, Err(Error::HandshakeTimeout(_))), "{res:?}");
    read_until_closed(&mut tcp).await;
}

#[tokio::test]
async fn a_first_frame_other_than_settings_fails_the_connection() {
    let cfg = H2Config {
        handshake_timeout: Duration::from_secs(3600),
        ..no_keepalive()
    };
    let (addr, server) = serve_one(cfg).await;
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    tcp.write_all(PREFACE).await.unwrap();
    // A PING where SETTINGS must be.
    tcp.write_all(&[0, 0, 8, 0x6, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8])
        .await
        .unwrap();
    let res = timeout(WAIT, server)
        .await
        .expect("server kept it")
        .unwrap();
    let err = res.expect_err("accepted a connection that did not start with SETTINGS");
    assert!(err.to_string().contains("not SETTINGS"), "{err}");
    read_until_closed(&mut tcp).await;
}

#[tokio::test]
async fn a_well_behaved_client_outlives_the_handshake_deadline() {
    let cfg = no_keepalive();
    let (addr, server) = serve_one(cfg.clone()).await;
    let client = dial(addr, &cfg).await.unwrap();
    let (mut s, _) = client
        .connect(ConnectRequest::new("127.0.0.1:1"))
        .await
        .unwrap();
    // The server has answered a CONNECT, so it has read the preface and SETTINGS. Now let the
    // handshake deadline pass.
    round_trip(&mut s, b"before").await;
    tokio::time::pause();
    tokio::time::advance(cfg.handshake_timeout * 2).await;
    round_trip(&mut s, b"after the deadline").await;
    assert!(!server.is_finished(), "server ended a healthy connection");
    assert!(client.is_ready());
    drop(s);
    drop(client);
    tokio::time::resume();
    let res = timeout(WAIT, server).await.unwrap().unwrap();
    assert!(res.is_ok(), "{res:?}");
}

// --- the client's deadline for the CONNECT response ---------------------------------------

/// A server that answers CONNECTs to port 1 never (holding the request) and echoes the rest;
/// counts the CONNECTs it saw.
async fn sometimes_silent_server() -> (TestServer, Arc<AtomicUsize>) {
    let held: Arc<Mutex<Vec<InboundRequest>>> = Arc::default();
    let seen = Arc::new(AtomicUsize::new(0));
    let counter = seen.clone();
    let server = TestServer::start(no_keepalive(), move |req: InboundRequest| {
        let (held, seen) = (held.clone(), counter.clone());
        async move {
            seen.fetch_add(1, Ordering::SeqCst);
            if req.authority().ends_with(":1") {
                held.lock().unwrap().push(req);
            } else {
                echo(req).await;
            }
        }
    })
    .await;
    (server, seen)
}

#[tokio::test]
async fn unanswered_connect_times_out_and_the_connection_stays_usable() {
    let (server, seen) = sometimes_silent_server().await;
    let cfg = no_keepalive();
    let client = dial(server.addr, &cfg).await.unwrap();
    let (mut open, _) = client
        .connect(ConnectRequest::new("127.0.0.1:2"))
        .await
        .unwrap();
    round_trip(&mut open, b"open").await;

    tokio::time::pause();
    let res = timeout(WAIT, client.connect(ConnectRequest::new("127.0.0.1:1")))
        .await
        .expect("CONNECT waited past its deadline");
    match res {
        Err(Error::ResponseTimeout(d)) => assert_eq!(d, cfg.connect_response_timeout),
        other => panic!("expected ResponseTimeout, got {other:?}"),
    }
    tokio::time::resume();
    assert_eq!(
        seen.load(Ordering::SeqCst),
        2,
        "the CONNECT reached the server"
    );
    // Neither the connection nor its other stream is hurt, and the cancelled stream is not
    // counted.
    assert!(client.is_ready());
    assert_eq!(client.active_streams(), 1);
    round_trip(&mut open, b"still open").await;
    let (mut next, _) = client
        .connect(ConnectRequest::new("127.0.0.1:3"))
        .await
        .unwrap();
    round_trip(&mut next, b"next").await;
    assert_eq!(server.accepted(), 1);
}

#[tokio::test]
async fn pool_keeps_a_connection_whose_connect_timed_out() {
    let (server, _) = sometimes_silent_server().await;
    let pool: Pool<&str> = Pool::new(PoolConfig::default());
    let addr = server.addr;
    let dial_fn = move || async move { dial(addr, &no_keepalive()).await };
    let (mut first, _) = pool
        .connect("k", ConnectRequest::new("127.0.0.1:2"), dial_fn)
        .await
        .unwrap();
    round_trip(&mut first, b"first").await;
    drop(first);

    tokio::time::pause();
    let res = timeout(
        WAIT,
        pool.connect("k", ConnectRequest::new("127.0.0.1:1"), dial_fn),
    )
    .await
    .expect("pooled CONNECT waited past its deadline");
    assert!(matches!(res, Err(Error::ResponseTimeout(_))), "{res:?}");
    tokio::time::resume();

    let (mut again, _) = pool
        .connect("k", ConnectRequest::new("127.0.0.1:2"), dial_fn)
        .await
        .unwrap();
    round_trip(&mut again, b"again").await;
    assert_eq!(pool.created_total(), 1, "a live connection was replaced");
    assert_eq!(server.accepted(), 1);
}

// --- header-list limits -----------------------------------------------------------------

/// A server whose CONNECT responses carry a `x-big` header of `len` bytes when the target port
/// is 1; counts the requests it saw.
async fn big_response_server(len: usize) -> (TestServer, Arc<AtomicUsize>) {
    let seen = Arc::new(AtomicUsize::new(0));
    let counter = seen.clone();
    let server = TestServer::start(no_keepalive(), move |req: InboundRequest| {
        let seen = counter.clone();
        async move {
            seen.fetch_add(1, Ordering::SeqCst);
            if req.authority().ends_with(":1") {
                let mut h = HeaderMap::new();
                h.insert("x-big", HeaderValue::from_str(&"b".repeat(len)).unwrap());
                let Ok(mut s) = req.accept(h) else { return };
                // Keep the stream until the client is done with it.
                let mut sink = Vec::new();
                let _ = s.read_to_end(&mut sink).await;
            } else {
                echo(req).await;
            }
        }
    })
    .await;
    (server, seen)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_refuses_a_response_header_list_over_16k() {
    // 20 KiB: over ztunnel's client limit (16 KiB), well under the server limit (64 KiB).
    let (server, _) = big_response_server(20 * 1024).await;
    let cfg = H2Config::default();
    assert_eq!(cfg.client_max_header_list_size, 16 * 1024);
    let client = dial(server.addr, &cfg).await.unwrap();
    let err = client
        .connect(ConnectRequest::new("127.0.0.1:1"))
        .await
        .expect_err("accepted a 20 KiB response header list");
    match &err {
        // h2 resets the stream (PROTOCOL_ERROR) and drops the response.
        Error::H2(e) => {
            assert_eq!(e.reason(), Some(h2::Reason::PROTOCOL_ERROR), "{err}");
            assert!(e.is_library(), "refused by the client itself: {err}");
        }
        other => panic!("expected a refused stream, got {other:?}"),
    }
    assert!(!err.is_retryable_on_new_connection(false));
    // Only that stream failed.
    assert!(client.is_ready());
    assert_eq!(client.active_streams(), 0);
    let (mut s, _) = client
        .connect(ConnectRequest::new("127.0.0.1:2"))
        .await
        .unwrap();
    round_trip(&mut s, b"ok").await;

    // Just under the limit is accepted.
    let (small, _) = big_response_server(15 * 1024).await;
    let client = dial(small.addr, &cfg).await.unwrap();
    let (_s, headers) = client
        .connect(ConnectRequest::new("127.0.0.1:1"))
        .await
        .unwrap();
    assert_eq!(headers["x-big"].len(), 15 * 1024);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pool_does_not_resend_a_connect_whose_response_was_refused() {
    let (server, seen) = big_response_server(20 * 1024).await;
    let pool: Pool<&str> = Pool::new(PoolConfig::default());
    let addr = server.addr;
    let dial_fn = move || async move { dial(addr, &H2Config::default()).await };
    let (s, _) = pool
        .connect("k", ConnectRequest::new("127.0.0.1:2"), dial_fn)
        .await
        .unwrap();
    drop(s);
    let res = pool
        .connect("k", ConnectRequest::new("127.0.0.1:1"), dial_fn)
        .await;
    assert!(matches!(res, Err(Error::H2(_))), "{res:?}");
    // The server processed that CONNECT once; sending it again elsewhere would open a second
    // upstream connection, and the healthy pooled connection must stay.
    assert_eq!(seen.load(Ordering::SeqCst), 2);
    assert_eq!(pool.created_total(), 1);
    assert_eq!(pool.connections(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_refuses_a_request_header_list_over_64k() {
    let seen = Arc::new(AtomicUsize::new(0));
    let counter = seen.clone();
    let server = TestServer::start(H2Config::default(), move |req: InboundRequest| {
        counter.fetch_add(1, Ordering::SeqCst);
        echo(req)
    })
    .await;
    let client = dial(server.addr, &H2Config::default()).await.unwrap();
    let big = ConnectRequest::new("127.0.0.1:1").with_header(
        "x-big".parse().unwrap(),
        HeaderValue::from_str(&"b".repeat(65 * 1024)).unwrap(),
    );
    let res = client.connect(big).await;
    // h2 answers 431 (RFC 9113 §10.5.1) and resets the stream; the handler never sees it.
    match res {
        Err(Error::Status(s)) => assert_eq!(s, StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE),
        other => panic!("expected 431, got {other:?}"),
    }
    assert_eq!(seen.load(Ordering::SeqCst), 0);
    assert!(client.is_ready());
    let under = ConnectRequest::new("127.0.0.1:1").with_header(
        "x-big".parse().unwrap(),
        HeaderValue::from_str(&"b".repeat(63 * 1024)).unwrap(),
    );
    let (mut s, _) = client.connect(under).await.unwrap();
    round_trip(&mut s, b"ok").await;
    assert_eq!(seen.load(Ordering::SeqCst), 1);
}

// --- SETTINGS on the wire ---------------------------------------------------------------

const SETTINGS_HEADER_TABLE_SIZE: u16 = 0x1;
const SETTINGS_ENABLE_PUSH: u16 = 0x2;
const SETTINGS_MAX_CONCURRENT_STREAMS: u16 = 0x3;
const SETTINGS_INITIAL_WINDOW_SIZE: u16 = 0x4;
const SETTINGS_MAX_FRAME_SIZE: u16 = 0x5;
const SETTINGS_MAX_HEADER_LIST_SIZE: u16 = 0x6;

/// One HTTP/2 frame as read off the wire.
#[derive(Debug)]
struct Frame {
    kind: u8,
    flags: u8,
    stream: u32,
    payload: Vec<u8>,
}

async fn read_frame(tcp: &mut TcpStream) -> Frame {
    let mut head = [0u8; 9];
    timeout(WAIT, tcp.read_exact(&mut head))
        .await
        .unwrap()
        .unwrap();
    let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
    let mut payload = vec![0u8; len];
    timeout(WAIT, tcp.read_exact(&mut payload))
        .await
        .unwrap()
        .unwrap();
    Frame {
        kind: head[3],
        flags: head[4],
        stream: u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff,
        payload,
    }
}

/// The parameters of a (non-ACK) SETTINGS frame.
fn settings_params(f: &Frame) -> BTreeMap<u16, u32> {
    assert_eq!(f.kind, 0x4, "expected SETTINGS, got {f:?}");
    assert_eq!(f.flags & 0x1, 0, "expected SETTINGS, got an ACK");
    assert_eq!(f.stream, 0);
    f.payload
        .chunks_exact(6)
        .map(|p| {
            (
                u16::from_be_bytes([p[0], p[1]]),
                u32::from_be_bytes([p[2], p[3], p[4], p[5]]),
            )
        })
        .collect()
}

/// The increment of the connection-level WINDOW_UPDATE that follows the SETTINGS frame (at
/// most a SETTINGS ACK may come between them).
async fn connection_window_increment(tcp: &mut TcpStream) -> u32 {
    loop {
        let f = read_frame(tcp).await;
        match (f.kind, f.flags, f.stream) {
            (0x4, 0x1, 0) => continue,
            (0x8, _, 0) => {
                let p = &f.payload;
                return u32::from_be_bytes([p[0], p[1], p[2], p[3]]) & 0x7fff_ffff;
            }
            _ => panic!("expected WINDOW_UPDATE(0), got {f:?}"),
        }
    }
}

/// What a server advertises when it is dialled with a raw, compliant preface.
async fn server_advertises(cfg: H2Config) -> (BTreeMap<u16, u32>, u32) {
    let server = TestServer::echo(cfg).await;
    let mut tcp = TcpStream::connect(server.addr).await.unwrap();
    tcp.write_all(PREFACE).await.unwrap();
    tcp.write_all(&[0, 0, 0, 0x4, 0, 0, 0, 0, 0]).await.unwrap();
    let settings = settings_params(&read_frame(&mut tcp).await);
    let window = connection_window_increment(&mut tcp).await;
    (settings, window)
}

/// What a client advertises right after its preface.
async fn client_advertises(cfg: H2Config) -> (BTreeMap<u16, u32>, u32) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let dialer = tokio::spawn(async move { dial(addr, &cfg).await });
    let (mut tcp, _) = listener.accept().await.unwrap();
    let mut preface = [0u8; 24];
    timeout(WAIT, tcp.read_exact(&mut preface))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&preface, PREFACE);
    let settings = settings_params(&read_frame(&mut tcp).await);
    let window = connection_window_increment(&mut tcp).await;
    let _client = dialer.await.unwrap().unwrap();
    (settings, window)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_settings_on_the_wire_are_ztunnels_and_follow_the_config() {
    // ztunnel's server (src/proxy/h2/server.rs, serve_connection).
    let (settings, window) = server_advertises(H2Config::default()).await;
    assert_eq!(
        settings,
        BTreeMap::from([
            (SETTINGS_MAX_CONCURRENT_STREAMS, 200),
            (SETTINGS_INITIAL_WINDOW_SIZE, 4 << 20),
            (SETTINGS_MAX_FRAME_SIZE, 1 << 20),
            (SETTINGS_MAX_HEADER_LIST_SIZE, 64 << 10),
        ])
    );
    assert_eq!(window, (16 << 20) - 65_535);

    let custom = H2Config {
        stream_window_size: 1 << 20,
        connection_window_size: 3 << 20,
        max_frame_size: 32 << 10,
        max_concurrent_streams: 7,
        max_header_list_size: 12_345,
        ..H2Config::default()
    };
    let (settings, window) = server_advertises(custom).await;
    assert_eq!(
        settings,
        BTreeMap::from([
            (SETTINGS_MAX_CONCURRENT_STREAMS, 7),
            (SETTINGS_INITIAL_WINDOW_SIZE, 1 << 20),
            (SETTINGS_MAX_FRAME_SIZE, 32 << 10),
            (SETTINGS_MAX_HEADER_LIST_SIZE, 12_345),
        ])
    );
    assert_eq!(window, (3 << 20) - 65_535);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_settings_on_the_wire_are_ztunnels_and_follow_the_config() {
    // ztunnel's client (src/proxy/h2/client.rs, spawn_connection): no MAX_CONCURRENT_STREAMS.
    let (settings, window) = client_advertises(H2Config::default()).await;
    assert_eq!(
        settings,
        BTreeMap::from([
            (SETTINGS_ENABLE_PUSH, 0),
            (SETTINGS_INITIAL_WINDOW_SIZE, 4 << 20),
            (SETTINGS_MAX_FRAME_SIZE, 1 << 20),
            (SETTINGS_MAX_HEADER_LIST_SIZE, 16 << 10),
        ])
    );
    assert_eq!(window, (16 << 20) - 65_535);
    assert!(!settings.contains_key(&SETTINGS_HEADER_TABLE_SIZE));

    let custom = H2Config {
        stream_window_size: 2 << 20,
        connection_window_size: 5 << 20,
        max_frame_size: 64 << 10,
        client_max_header_list_size: 4_321,
        ..H2Config::default()
    };
    let (settings, window) = client_advertises(custom).await;
    assert_eq!(
        settings,
        BTreeMap::from([
            (SETTINGS_ENABLE_PUSH, 0),
            (SETTINGS_INITIAL_WINDOW_SIZE, 2 << 20),
            (SETTINGS_MAX_FRAME_SIZE, 64 << 10),
            (SETTINGS_MAX_HEADER_LIST_SIZE, 4_321),
        ])
    );
    assert_eq!(window, (5 << 20) - 65_535);
}

// --- the client's send buffer ---------------------------------------------------------

/// A raw HTTP/2 server that grants huge windows, answers the first CONNECT with 200 and then
/// never reads again; its socket's receive buffer is tiny, so a client writing to it is held
/// back by its own send buffer, not by flow control or the kernel.
async fn stalled_peer() -> (std::net::SocketAddr, tokio::task::JoinHandle<TcpStream>) {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let listener = socket.listen(1).unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        let (mut tcp, _) = listener.accept().await.unwrap();
        // SETTINGS: INITIAL_WINDOW_SIZE 2^31-1; then the connection window to 2^31-1.
        let mut out = vec![0, 0, 6, 0x4, 0, 0, 0, 0, 0];
        out.extend(SETTINGS_INITIAL_WINDOW_SIZE.to_be_bytes());
        out.extend(0x7fff_ffffu32.to_be_bytes());
        out.extend([0, 0, 4, 0x8, 0, 0, 0, 0, 0]);
        out.extend((0x7fff_ffffu32 - 65_535).to_be_bytes());
        tcp.write_all(&out).await.unwrap();
        let mut preface = [0u8; 24];
        tcp.read_exact(&mut preface).await.unwrap();
        loop {
            let f = read_frame(&mut tcp).await;
            if f.kind == 0x1 {
                break;
            }
        }
        // HEADERS on stream 1, END_HEADERS, ":status: 200" (HPACK static index 8).
        tcp.write_all(&[0, 0, 1, 0x1, 0x4, 0, 0, 0, 1, 0x88])
            .await
            .unwrap();
        tcp
    });
    (addr, task)
}

// Paused clock: a write still pending when virtual time moves on is blocked for good.
#[tokio::test(start_paused = true)]
async fn client_buffers_up_to_ztunnels_4mib_per_stream_when_the_peer_stalls() {
    let cfg = no_keepalive();
    let (addr, peer) = stalled_peer().await;
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_send_buffer_size(4096).unwrap();
    let tcp = socket.connect(addr).await.unwrap();
    let client = weft_hbone::handshake(tcp, &cfg).await.unwrap();
    let (mut s, _) = client
        .connect(ConnectRequest::new("127.0.0.1:1"))
        .await
        .unwrap();
    let _peer = peer.await.unwrap();
    let chunk = vec![7u8; 64 * 1024];
    let mut written = 0usize;
    while let Ok(r) = timeout(Duration::from_secs(1), s.write(&chunk)).await {
        written += r.unwrap();
        assert!(written <= 64 << 20, "writer never blocked");
    }
    // ztunnel's client send buffer (the stream window); what the kernel holds on both sides is
    // small next to it (16 KiB here).
    let buf = 4 << 20;
    assert!(
        (buf..buf + (1 << 20)).contains(&written),
        "blocked after {written} bytes, send buffer {buf}"
    );
}
