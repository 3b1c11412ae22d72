//! The hand-over from rustls's handshake to weft's record layer, against a plain rustls client that puts records
//! right behind its `Finished` in the same write: a `KeyUpdate` asking for an answer, data, a `close_notify`.
//! Whatever follows the handshake's last record must be left to the record layer, never half taken by rustls.
#![allow(clippy::unwrap_used)] // a test panics to fail

use std::io::{Read, Write};
use std::sync::Arc;

use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use rustls::{ClientConfig, ClientConnection, RootCertStore, ServerConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

fn configs() -> (Arc<ClientConfig>, Arc<ServerConfig>) {
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["node.test".to_string()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    let mut roots = RootCertStore::empty();
    roots.add(cert.der().clone()).unwrap();
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut server = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.der().clone()],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        )
        .unwrap();
    server.enable_secret_extraction = true;
    server.send_tls13_tickets = 0;
    let client = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    (Arc::new(client), Arc::new(server))
}

/// Send what `client` has queued in one write.
async fn send(client: &mut ClientConnection, io: &mut DuplexStream) {
    let mut out = Vec::new();
    while client.wants_write() {
        client.write_tls(&mut out).unwrap();
    }
    io.write_all(&out).await.unwrap();
}

/// Read from `io` into `client` until `done` says so, or the transport ends.
async fn receive(
    client: &mut ClientConnection,
    io: &mut DuplexStream,
    mut done: impl FnMut(&mut ClientConnection) -> bool,
) {
    let mut buf = vec![0u8; 64 * 1024];
    while !done(client) {
        let n = io.read(&mut buf).await.unwrap();
        if n == 0 {
            return;
        }
        let mut rd = &buf[..n];
        while !rd.is_empty() {
            client.read_tls(&mut rd).unwrap();
        }
        client.process_new_packets().unwrap();
    }
}

/// A rustls client through its handshake with a weft-tls server (spawned), up to the point where its `Finished` is
/// queued and not yet sent: the caller adds what should share its write.
async fn client_before_finished() -> (
    ClientConnection,
    DuplexStream,
    tokio::task::JoinHandle<weft_tls::TlsStream<DuplexStream>>,
) {
    let (client_cfg, server_cfg) = configs();
    let (mut io, server_io) = tokio::io::duplex(1 << 20);
    let server =
        tokio::spawn(async move { weft_tls::accept(server_cfg, server_io).await.unwrap() });
    let mut client =
        ClientConnection::new(client_cfg, ServerName::try_from("node.test").unwrap()).unwrap();
    send(&mut client, &mut io).await;
    receive(&mut client, &mut io, |c| !c.is_handshaking()).await;
    assert!(!client.is_handshaking() && client.wants_write());
    (client, io, server)
}

#[tokio::test]
async fn a_key_update_asking_for_an_answer_behind_finished_is_answered() {
    let (mut client, mut io, server) = client_before_finished().await;
    client.refresh_traffic_keys().unwrap();
    client.writer().write_all(b"ping").unwrap();
    send(&mut client, &mut io).await;

    let mut server = server.await.unwrap();
    let mut got = [0u8; 4];
    server.read_exact(&mut got).await.unwrap();
    assert_eq!(&got, b"ping");
    // The server answers the KeyUpdate before its data: the client reads the data under the key it then expects.
    server.write_all(b"pong").await.unwrap();
    server.flush().await.unwrap();
    let mut reply = Vec::new();
    receive(&mut client, &mut io, |c| {
        let _ = c.reader().read_to_end(&mut reply);
        reply.len() >= 4
    })
    .await;
    assert_eq!(reply, b"pong");
}

#[tokio::test]
async fn data_and_close_notify_behind_finished_are_read_in_order() {
    let (mut client, mut io, server) = client_before_finished().await;
    client.writer().write_all(b"first flight").unwrap();
    client.send_close_notify();
    send(&mut client, &mut io).await;

    let mut server = server.await.unwrap();
    let mut got = Vec::new();
    server.read_to_end(&mut got).await.unwrap();
    assert_eq!(got, b"first flight");
    // The read side ended cleanly; the write side is still open.
    server.write_all(b"bye").await.unwrap();
    server.shutdown().await.unwrap();
    let mut reply = Vec::new();
    receive(&mut client, &mut io, |c| {
        let _ = c.reader().read_to_end(&mut reply);
        reply.len() >= 3
    })
    .await;
    assert_eq!(reply, b"bye");
}
