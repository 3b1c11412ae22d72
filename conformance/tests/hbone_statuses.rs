//! A raw HBONE client against a real weft node: every kind of bad CONNECT gets the status ztunnel answers with,
//! and a client without a valid certificate never gets a tunnel.
#![allow(clippy::unwrap_used)] // a test panics to fail

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;
use weft_conformance::{Addrs, Mesh, mesh_yaml};
use weft_identity::{LocalCa, ManagerConfig, SecretManager, SpiffeId};

async fn cert_for(mesh: &Mesh, id: &str) -> Arc<weft_identity::WorkloadCert> {
    let ca = LocalCa::from_dir(&mesh.ca_dir()).unwrap();
    let m = SecretManager::new(Arc::new(ca), ManagerConfig::default());
    m.fetch(&id.parse::<SpiffeId>().unwrap()).await.unwrap()
}

async fn h2_to(
    addr: SocketAddr,
    cfg: Arc<rustls::ClientConfig>,
) -> Result<weft_hbone::H2Client, String> {
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let tls = tokio_rustls::TlsConnector::from(cfg)
        .connect(
            rustls::pki_types::ServerName::IpAddress(addr.ip().into()),
            tcp,
        )
        .await
        .map_err(|e| e.to_string())?;
    weft_hbone::handshake(tls, &weft_hbone::H2Config::default())
        .await
        .map_err(|e| e.to_string())
}

async fn status_of(c: &weft_hbone::H2Client, authority: &str) -> Result<StatusCode, String> {
    match c.connect(weft_hbone::ConnectRequest::new(authority)).await {
        Ok(_) => Ok(StatusCode::OK),
        Err(weft_hbone::Error::Status(s)) => Ok(s),
        Err(e) => Err(e.to_string()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_connects_get_proper_statuses() {
    let a = Addrs { n: 32 };
    let yaml = mesh_yaml(a, "echo");
    let mesh = Mesh::start(a, &yaml, &yaml).await.unwrap();
    let client = cert_for(&mesh, "spiffe://cluster.local/ns/default/sa/client").await;
    let echo_id: SpiffeId = "spiffe://cluster.local/ns/default/sa/echo".parse().unwrap();
    let hbone = SocketAddr::from((a.echo(), 15008));
    let c = h2_to(hbone, client.client_config(vec![echo_id]).unwrap())
        .await
        .unwrap();

    assert_eq!(
        status_of(&c, &format!("{}:8080", a.echo())).await.unwrap(),
        StatusCode::OK
    );
    // The 200 describes the destination workload in `baggage`, as ztunnel's does by default.
    let (_, headers) = c
        .connect(weft_hbone::ConnectRequest::new(format!(
            "{}:8080",
            a.echo()
        )))
        .await
        .unwrap();
    assert_eq!(
        headers["baggage"],
        "k8s.cluster.name=Kubernetes,k8s.namespace.name=default,k8s.deployment.name=echo,service.name=echo,\
         service.version=v1"
    );
    // Not a workload on this node.
    assert_eq!(
        status_of(&c, "127.0.99.99:8080").await.unwrap(),
        StatusCode::BAD_REQUEST
    );
    // A workload on this node, but not the one this tunnel was opened to (other identity).
    assert_eq!(
        status_of(&c, &format!("{}:8080", a.legacy()))
            .await
            .unwrap(),
        StatusCode::BAD_REQUEST
    );
    // A service hostname (as through a network gateway): the local endpoint on its target port; a port the
    // service does not have: 503, as ztunnel answers.
    assert_eq!(
        status_of(&c, "echo.default.svc.cluster.local:80")
            .await
            .unwrap(),
        StatusCode::OK
    );
    assert_eq!(
        status_of(&c, "echo.default.svc.cluster.local:8080")
            .await
            .unwrap(),
        StatusCode::SERVICE_UNAVAILABLE
    );
    // Neither ip:port nor hostname:port.
    assert_eq!(
        status_of(&c, "echo-without-a-port").await.unwrap(),
        StatusCode::BAD_REQUEST
    );
    // weft's own ports (self-call protection).
    assert_eq!(
        status_of(&c, &format!("{}:15008", a.echo())).await.unwrap(),
        StatusCode::BAD_REQUEST
    );
    // Nothing listens on the workload's port 9: upstream connect fails.
    assert_eq!(
        status_of(&c, &format!("{}:9", a.echo())).await.unwrap(),
        StatusCode::SERVICE_UNAVAILABLE
    );
    // The connection survives rejected streams.
    assert_eq!(
        status_of(&c, &format!("{}:8080", a.echo())).await.unwrap(),
        StatusCode::OK
    );

    let m = mesh.b.scrape().await.unwrap();
    assert_eq!(
        weft_conformance::metric_sum(
            &m,
            "weft_connections_failed_total{direction=\"inbound\",reason=\"bad_request\"}"
        ),
        3.0,
        "{m}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_without_a_valid_certificate_are_refused() {
    let a = Addrs { n: 34 };
    let yaml = mesh_yaml(a, "echo");
    let mesh = Mesh::start(a, &yaml, &yaml).await.unwrap();
    let hbone = SocketAddr::from((a.echo(), 15008));
    let echo_id: SpiffeId = "spiffe://cluster.local/ns/default/sa/echo".parse().unwrap();

    // A certificate from another root (another mesh), same identity names.
    let other_dir = tempfile::tempdir().unwrap();
    weft_devmesh::write_dev_ca(other_dir.path(), "cluster.local").unwrap();
    let other = SecretManager::new(
        Arc::new(LocalCa::from_dir(other_dir.path()).unwrap()),
        ManagerConfig::default(),
    );
    let stranger = other
        .fetch(
            &"spiffe://cluster.local/ns/default/sa/client"
                .parse()
                .unwrap(),
        )
        .await
        .unwrap();
    // Present it to node B with a client that accepts any server: node B alone must refuse.
    let cfg = accept_any_server(Some(&stranger));
    let r = tunnel_attempt(hbone, cfg, &format!("{}:8080", a.echo())).await;
    assert!(
        r.is_err(),
        "a client from another root must be refused: {r:?}"
    );

    // The right root, another trust domain.
    let foreign = cert_for(&mesh, "spiffe://evil.domain/ns/default/sa/client").await;
    let cfg = foreign.client_config(vec![echo_id.clone()]).unwrap();
    let r = tunnel_attempt(hbone, cfg, &format!("{}:8080", a.echo())).await;
    assert!(
        r.is_err(),
        "a client from another trust domain must be refused in the handshake: {r:?}"
    );

    // No client certificate at all (and a client that would accept any server, so only the server can refuse).
    let cfg = accept_any_server(None);
    let r = tunnel_attempt(hbone, cfg, &format!("{}:8080", a.echo())).await;
    assert!(
        r.is_err(),
        "a client without a certificate must be refused: {r:?}"
    );
    // Each refusal is counted when node B's handshake ends, the last thing that happens to that connection: once
    // all three are counted, nothing more can be logged for them.
    let m = weft_conformance::eventually(
        Duration::from_secs(30),
        "node B counts three refused handshakes",
        || async {
            let m = mesh.b.scrape().await.ok()?;
            (weft_conformance::metric_sum(
                &m,
                "weft_connections_failed_total{direction=\"inbound\",reason=\"tls\"}",
            ) >= 3.0)
                .then_some(m)
        },
    )
    .await;
    assert_eq!(
        weft_conformance::metric_sum(&m, "weft_connections_opened_total"),
        0.0,
        "{m}"
    );
    assert!(
        mesh.b.access_logs().is_empty(),
        "no tunnel may have been opened"
    );
}

/// A TLS 1.3 + h2 client config that accepts any server, presenting `cert` (or no certificate).
fn accept_any_server(cert: Option<&weft_identity::WorkloadCert>) -> Arc<rustls::ClientConfig> {
    let b = rustls::ClientConfig::builder_with_provider(weft_identity::tls::provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AcceptAnyServer));
    let mut cfg = match cert {
        Some(c) => b
            .with_client_auth_cert(c.chain().to_vec(), c.key())
            .unwrap(),
        None => b.with_no_client_auth(),
    };
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    Arc::new(cfg)
}

/// Open an HBONE connection and send one CONNECT: Ok if the request got any HTTP answer (the TLS handshake and
/// HTTP/2 were accepted), Err if the connection was refused before that.
async fn tunnel_attempt(
    hbone: SocketAddr,
    cfg: Arc<rustls::ClientConfig>,
    authority: &str,
) -> Result<(), String> {
    let c = h2_to(hbone, cfg).await?;
    status_of(&c, authority).await.map(|_| ())
}

/// Test-only: a client that accepts any server certificate, so that what is tested is the server's refusal.
#[derive(Debug)]
struct AcceptAnyServer;

impl rustls::client::danger::ServerCertVerifier for AcceptAnyServer {
    fn verify_server_cert(
        &self,
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &[rustls::pki_types::CertificateDer<'_>],
        _: &rustls::pki_types::ServerName<'_>,
        _: &[u8],
        _: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        _: &[u8],
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
    }
    fn verify_tls13_signature(
        &self,
        _: &[u8],
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
    }
    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        weft_identity::tls::provider()
            .signature_verification_algorithms
            .supported_schemes()
    }
}
