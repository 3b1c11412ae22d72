//! A weft-tls pair over an in-memory stream, for what only the stream's insides can show.
#![allow(clippy::unwrap_used)] // a test panics to fail

use std::sync::Arc;

use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::*;

async fn pair() -> (
    TlsStream<tokio::io::DuplexStream>,
    TlsStream<tokio::io::DuplexStream>,
) {
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["node.test".to_string()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert.der().clone()).unwrap();
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut server = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.der().clone()],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        )
        .unwrap();
    server.enable_secret_extraction = true;
    let mut client = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    client.enable_secret_extraction = true;
    let (c, s) = tokio::io::duplex(64 * 1024);
    let name = ServerName::try_from("node.test").unwrap();
    let (a, b) = tokio::join!(
        crate::connect(Arc::new(client), name, c),
        crate::accept(Arc::new(server), s)
    );
    (a.unwrap(), b.unwrap())
}

#[tokio::test]
async fn the_sending_key_is_replaced_before_it_reaches_its_limit() {
    let (mut a, mut b) = pair().await;
    a.tx_limit = a.tx.seq + 4;
    let data: Vec<u8> = (0..10 * MAX_PLAINTEXT).map(|i| (i % 253) as u8).collect();
    let mut got = vec![0u8; data.len()];
    let (w, r) = tokio::join!(
        async {
            a.write_all(&data).await?;
            a.flush().await
        },
        b.read_exact(&mut got)
    );
    w.unwrap();
    r.unwrap();
    assert!(got == data);
    // 10 data records under a limit of 4 per key: the key was replaced three times (each KeyUpdate is the
    // last record under its key), and the peer followed every time.
    assert!(a.tx.seq < 4, "{:?}", a.tx);
    assert_eq!(b.rx.seq, a.tx.seq);
}

#[tokio::test]
async fn a_peer_that_floods_key_updates_without_data_is_cut_off() {
    let (mut a, mut b) = pair().await;
    for _ in 0..=MAX_KEY_UPDATES_IN_A_ROW {
        a.refresh_traffic_keys(false);
        a.flush().await.unwrap();
    }
    let err = b.read(&mut [0u8; 16]).await.unwrap_err();
    assert!(err.to_string().contains("too many KeyUpdates"), "{err}");
}

#[tokio::test]
async fn records_after_close_notify_are_ignored() {
    let (mut a, mut b) = pair().await;
    a.write_all(b"before").await.unwrap();
    a.shutdown().await.unwrap();
    let mut got = Vec::new();
    b.read_to_end(&mut got).await.unwrap();
    assert_eq!(got, b"before");
    assert!(
        a.write_all(b"after").await.is_err(),
        "no data after our close_notify"
    );
}
