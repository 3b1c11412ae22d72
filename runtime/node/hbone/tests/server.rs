//! Server lifecycle: graceful shutdown drains open streams; keepalive detects a dead peer.
#![allow(clippy::unwrap_used)] // a test panics to fail

mod common;

use std::time::Duration;

use common::{TestServer, WAIT, dial, eventually, no_keepalive};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::time::timeout;
use tokio_util::sync::CancellationToken;
use weft_hbone::{ConnectRequest, H2Config, serve_connection};

// Paused clock: the sleep below ends only once every task waits, so "the server has not
// returned" is checked after everything that could happen has.
#[tokio::test(start_paused = true)]
async fn graceful_shutdown_drains_open_stream_and_refuses_new_ones() {
    let server = TestServer::echo(no_keepalive()).await;
    let client = dial(server.addr, &no_keepalive()).await.expect("dial");
    let (mut open, _) = client
        .connect(ConnectRequest::new("127.0.0.1:1"))
        .await
        .expect("connect");
    open.write_all(b"before").await.expect("write");

    server.goaway_conn(0);
    eventually("client saw GOAWAY", || !client.is_ready()).await;
    assert!(
        client
            .connect(ConnectRequest::new("127.0.0.1:1"))
            .await
            .is_err(),
        "new stream accepted after GOAWAY"
    );

    // The open stream keeps working in both directions while the server drains.
    open.write_all(b" after").await.expect("write during drain");
    let mut buf = [0u8; 12];
    timeout(WAIT, open.read_exact(&mut buf))
        .await
        .expect("timeout")
        .expect("read");
    assert_eq!(&buf, b"before after");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        server.closed(),
        0,
        "server returned with a stream still open"
    );

    open.shutdown().await.expect("shutdown");
    let mut rest = Vec::new();
    timeout(WAIT, open.read_to_end(&mut rest))
        .await
        .expect("timeout")
        .expect("eof");
    drop(open);
    assert_eq!(server.conn_result(0).await, Ok(()));
    timeout(WAIT, client.closed())
        .await
        .expect("client connection closes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_of_idle_connection_returns_promptly() {
    let server = TestServer::echo(H2Config::default()).await;
    let client = dial(server.addr, &H2Config::default()).await.expect("dial");
    let (mut s, _) = client
        .connect(ConnectRequest::new("127.0.0.1:1"))
        .await
        .expect("connect");
    s.shutdown().await.expect("shutdown");
    let mut rest = Vec::new();
    s.read_to_end(&mut rest).await.expect("eof");
    drop(s);
    server.shutdown.cancel();
    assert_eq!(server.conn_result(0).await, Ok(()));
}

/// A connection accepted just before a drain, whose handshake completes after the shutdown was asked: the
/// CONNECT the client made it for is served (no GOAWAY before its first stream: an h2 client that has read one
/// opens no stream), then the GOAWAY comes, no further stream is accepted, and the server returns once the stream
/// has ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_before_the_handshake_still_serves_the_first_stream() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let shutdown = CancellationToken::new();
    shutdown.cancel();
    let server = tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.expect("accept");
        serve_connection(tcp, &H2Config::default(), shutdown, common::echo).await
    });
    let client = dial(addr, &H2Config::default()).await.expect("dial");
    let (mut s, _) = client
        .connect(ConnectRequest::new("127.0.0.1:1"))
        .await
        .expect("the first CONNECT on a connection accepted before the drain was refused");
    s.write_all(b"served").await.expect("write");
    let mut buf = [0u8; 6];
    timeout(WAIT, s.read_exact(&mut buf))
        .await
        .expect("timeout")
        .expect("read");
    assert_eq!(&buf, b"served");
    eventually("client saw GOAWAY", || !client.is_ready()).await;
    assert!(
        client
            .connect(ConnectRequest::new("127.0.0.1:1"))
            .await
            .is_err(),
        "a second stream was accepted after the drain started"
    );
    s.shutdown().await.expect("shutdown");
    let mut rest = Vec::new();
    timeout(WAIT, s.read_to_end(&mut rest))
        .await
        .expect("timeout")
        .expect("eof");
    drop(s);
    let served = timeout(WAIT, server)
        .await
        .expect("the server did not return after its last stream")
        .expect("server task");
    assert!(served.is_ok(), "{served:?}");
}

#[tokio::test(start_paused = true)]
async fn client_keepalive_detects_unresponsive_server() {
    // A peer that completes the HTTP/2 handshake and then never reads again: PINGs go unanswered.
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (hold_tx, hold_rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.expect("accept");
        let conn = h2::server::handshake(tcp).await.expect("handshake");
        let _ = hold_rx.await;
        drop(conn);
    });
    let cfg = H2Config {
        keepalive_interval: Some(Duration::from_millis(100)),
        keepalive_timeout: Duration::from_millis(200),
        ..Default::default()
    };
    let client = dial(addr, &cfg).await.expect("dial");
    timeout(WAIT, client.closed())
        .await
        .expect("keepalive never fired");
    assert!(!client.is_ready());
    let _ = hold_tx.send(());
}

// Paused clock: PINGs and their ACKs travel while virtual time stands still, so the ACK
// deadline tests the protocol, not the machine's load.
#[tokio::test(start_paused = true)]
async fn keepalive_keeps_healthy_connection_open() {
    let cfg = H2Config {
        keepalive_interval: Some(Duration::from_secs(10)),
        keepalive_timeout: Duration::from_secs(20),
        ..Default::default()
    };
    let server = TestServer::echo(cfg.clone()).await;
    let client = dial(server.addr, &cfg).await.expect("dial");
    // Thirty keepalive rounds.
    tokio::time::sleep(Duration::from_secs(300)).await;
    assert!(client.is_ready());
    assert_eq!(server.closed(), 0);
    let (mut s, _) = client
        .connect(ConnectRequest::new("127.0.0.1:1"))
        .await
        .expect("connect");
    s.write_all(b"ok").await.expect("write");
    let mut b = [0u8; 2];
    s.read_exact(&mut b).await.expect("read");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_connection_returns_when_client_goes_away() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let serve = tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.expect("accept");
        serve_connection(
            tcp,
            &H2Config::default(),
            CancellationToken::new(),
            common::echo,
        )
        .await
    });
    let client = dial(addr, &H2Config::default()).await.expect("dial");
    let (s, _) = client
        .connect(ConnectRequest::new("127.0.0.1:1"))
        .await
        .expect("connect");
    drop(s);
    drop(client);
    // All handles gone: the client closes the connection (GOAWAY) and the server returns.
    let res = timeout(WAIT, serve).await.expect("timeout").expect("join");
    assert!(res.is_ok(), "{res:?}");
}
