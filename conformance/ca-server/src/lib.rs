//! A reference Istio-protocol CA (`istio.v1.auth.IstioCertificateService/CreateCertificate` over gRPC and TLS)
//! for tests and demos. It signs with a root or an intermediate from disk, and authorizes every request: the
//! caller is authenticated by a Kubernetes TokenReview or a static token file, and may obtain a certificate only
//! for its own identity, or, when the caller is a trusted node agent (`--trusted-node-accounts`, istiod's
//! `CA_TRUSTED_NODE_ACCOUNTS`), for an identity that a workload on the caller's node has according to the CA's
//! workload source (the mesh config file, watched, so edits apply live). Every decision is logged on the `audit`
//! target, with its reason.

pub mod auth;
pub mod node_accounts;
pub mod service;

use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpListener;
use tonic::codegen::Service as _;
use weft_proto::istio_ca::istio_certificate_service_server::IstioCertificateServiceServer;

pub use auth::{AuthError, Authenticator, Caller};
pub use node_accounts::{NodeAccount, NodeAccountError, TrustedNodeAccounts};
pub use service::{CaCounters, CaService, Fault};

/// Errors starting the CA server.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The signer or its serving certificate.
    #[error("identity: {0}")]
    Identity(#[from] weft_identity::Error),
    /// TLS setup.
    #[error("tls: {0}")]
    Tls(String),
}

/// The server's TLS config: a serving certificate for `names`, issued by `ca`, ALPN `h2`.
pub fn server_tls(
    ca: &weft_identity::LocalCa,
    names: &[String],
) -> Result<Arc<rustls::ServerConfig>, Error> {
    let (chain_pem, key_pem) = ca.issue_server_cert(names, Duration::from_secs(365 * 24 * 3600))?;
    let chain = CertificateDer::pem_slice_iter(chain_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| Error::Tls(e.to_string()))?;
    let key =
        PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).map_err(|e| Error::Tls(e.to_string()))?;
    let mut cfg = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| Error::Tls(e.to_string()))?
    .with_no_client_auth()
    .with_single_cert(chain, key)
    .map_err(|e| Error::Tls(e.to_string()))?;
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(cfg))
}

/// Serve `service` on `listener` over TLS (HTTP/2, gRPC) until `shutdown` resolves; open connections are then
/// closed. Each connection's TLS handshake runs in its own task with a deadline, so a stalled client delays
/// nobody.
pub async fn serve(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    service: Arc<CaService>,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> Result<(), Error> {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let grpc = IstioCertificateServiceServer::from_arc(service);
    let mut conns = tokio::task::JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        let (tcp, peer) = tokio::select! {
            () = &mut shutdown => break,
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(error = %e, "accept");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        while conns.try_join_next().is_some() {}
        let (acceptor, grpc) = (acceptor.clone(), grpc.clone());
        conns.spawn(async move {
            let _ = tcp.set_nodelay(true);
            let tls =
                match tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp)).await {
                    Ok(Ok(s)) => s,
                    Ok(Err(e)) => return tracing::info!(%peer, error = %e, "TLS handshake failed"),
                    Err(_) => return tracing::info!(%peer, "TLS handshake timed out"),
                };
            let svc =
                hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                    let mut grpc = grpc.clone();
                    async move { grpc.call(req).await }
                });
            if let Err(e) = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(tls), svc)
                .await
            {
                tracing::debug!(%peer, error = %e, "gRPC connection ended");
            }
        });
    }
    conns.shutdown().await;
    Ok(())
}
