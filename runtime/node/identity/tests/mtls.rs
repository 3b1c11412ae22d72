//! Mutual TLS between two workload certificates issued by the local CA: identities checked both ways.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::{TlsAcceptor, TlsConnector};
use weft_identity::ca::generate_root;
use weft_identity::{LocalCa, ManagerConfig, SecretManager, SpiffeId};

fn manager(td: &str) -> Arc<SecretManager> {
    let (cert, key) = generate_root(td, Duration::from_secs(3600)).unwrap();
    let ca = LocalCa::from_pem(&cert, &key, vec![]).unwrap();
    SecretManager::new(Arc::new(ca), ManagerConfig::default())
}

fn id(s: &str) -> SpiffeId {
    s.parse().unwrap()
}

/// Runs one handshake; returns the client's error text or the identity the server saw.
async fn handshake(
    server: Arc<weft_identity::WorkloadCert>,
    client: Arc<weft_identity::WorkloadCert>,
    expect: SpiffeId,
) -> Result<SpiffeId, String> {
    let lis = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = lis.local_addr().unwrap();
    let acceptor = TlsAcceptor::from(server.server_config().unwrap());
    let srv = tokio::spawn(async move {
        let (s, _) = lis.accept().await.unwrap();
        let mut tls = acceptor.accept(s).await.map_err(|e| e.to_string())?;
        let peer = tls.get_ref().1.peer_certificates().unwrap()[0].clone();
        let mut b = [0u8; 4];
        tls.read_exact(&mut b).await.map_err(|e| e.to_string())?;
        tls.write_all(b"pong").await.map_err(|e| e.to_string())?;
        tls.shutdown().await.ok();
        weft_identity::tls::identity_of(&peer).map_err(|e| e.to_string())
    });
    let connector = TlsConnector::from(client.client_config(vec![expect]).unwrap());
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("weft.invalid").unwrap();
    let mut tls = connector
        .connect(name, tcp)
        .await
        .map_err(|e| e.to_string())?;
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    // Istio's order of preference (ztunnel's provider): AES-256-GCM first.
    assert_eq!(
        tls.get_ref().1.negotiated_cipher_suite().map(|s| s.suite()),
        Some(rustls::CipherSuite::TLS13_AES_256_GCM_SHA384)
    );
    tls.write_all(b"ping").await.unwrap();
    let mut b = [0u8; 4];
    tls.read_exact(&mut b).await.map_err(|e| e.to_string())?;
    assert_eq!(&b, b"pong");
    srv.await.unwrap()
}

#[tokio::test]
async fn mutual_tls_identities_verified() {
    let m = manager("cluster.local");
    let a = id("spiffe://cluster.local/ns/default/sa/client");
    let b = id("spiffe://cluster.local/ns/default/sa/server");
    let ca = m.fetch(&a).await.unwrap();
    let cb = m.fetch(&b).await.unwrap();
    assert_eq!(ca.identity(), &a);
    let seen = handshake(cb.clone(), ca.clone(), b.clone()).await.unwrap();
    assert_eq!(seen, a, "server must see the client's SPIFFE id");
    // The same identity is cached, not reissued.
    let again = m.fetch(&a).await.unwrap();
    assert!(Arc::ptr_eq(&ca, &again));
    assert_eq!(
        m.counters()
            .fetches
            .load(std::sync::atomic::Ordering::Relaxed),
        2
    );
}

#[tokio::test]
async fn client_refuses_server_with_unexpected_identity() {
    let m = manager("cluster.local");
    let client = m
        .fetch(&id("spiffe://cluster.local/ns/default/sa/client"))
        .await
        .unwrap();
    let imposter = m
        .fetch(&id("spiffe://cluster.local/ns/other/sa/imposter"))
        .await
        .unwrap();
    let err = handshake(
        imposter,
        client,
        id("spiffe://cluster.local/ns/default/sa/server"),
    )
    .await
    .unwrap_err();
    assert!(
        err.contains("WrongIdentity") && err.contains("imposter"),
        "{err}"
    );
}

#[tokio::test]
async fn server_refuses_client_from_other_trust_domain_or_root() {
    // Same root, other trust domain.
    let m = manager("cluster.local");
    let server = m
        .fetch(&id("spiffe://cluster.local/ns/default/sa/server"))
        .await
        .unwrap();
    let foreign = m
        .fetch(&id("spiffe://other.domain/ns/default/sa/client"))
        .await
        .unwrap();
    let r = handshake(
        server.clone(),
        foreign,
        id("spiffe://cluster.local/ns/default/sa/server"),
    )
    .await;
    assert!(
        r.is_err(),
        "a client from another trust domain must be refused: {r:?}"
    );
    // Another root entirely: the server's chain does not verify for the client either.
    let other = manager("cluster.local");
    let stranger = other
        .fetch(&id("spiffe://cluster.local/ns/default/sa/client"))
        .await
        .unwrap();
    let r = handshake(
        server,
        stranger,
        id("spiffe://cluster.local/ns/default/sa/server"),
    )
    .await;
    assert!(
        r.is_err(),
        "a client with another root must be refused: {r:?}"
    );
}

#[tokio::test]
async fn concurrent_fetches_make_one_ca_call() {
    let m = manager("cluster.local");
    let want = id("spiffe://cluster.local/ns/ns1/sa/burst");
    let mut tasks = Vec::new();
    for _ in 0..200 {
        let m = m.clone();
        let want = want.clone();
        tasks.push(tokio::spawn(async move { m.fetch(&want).await.unwrap() }));
    }
    let mut serials = std::collections::HashSet::new();
    for t in tasks {
        serials.insert(t.await.unwrap().serial().to_owned());
    }
    assert_eq!(serials.len(), 1);
    assert_eq!(
        m.counters()
            .fetches
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    let dump = m.dump();
    assert_eq!(dump.len(), 1);
    assert_eq!(dump[0].state, "Available");
    // Forgotten once no local workload needs it.
    m.retain(&Default::default());
    assert!(m.dump().is_empty());
}

#[test]
fn ca_refuses_csr_for_another_identity() {
    let (cert, key) = generate_root("cluster.local", Duration::from_secs(3600)).unwrap();
    let ca = LocalCa::from_pem(&cert, &key, vec![]).unwrap();
    let csr = weft_identity::cert::new_csr(&id("spiffe://cluster.local/ns/a/sa/b")).unwrap();
    let err = ca
        .sign_csr(
            &id("spiffe://cluster.local/ns/a/sa/c"),
            &csr.csr_pem,
            Duration::from_secs(60),
        )
        .unwrap_err();
    assert!(err.to_string().contains("exactly the SAN"), "{err}");
}
