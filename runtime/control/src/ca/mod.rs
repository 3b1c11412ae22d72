//! A reference Istio-protocol CA (`istio.v1.auth.IstioCertificateService/CreateCertificate` over gRPC and TLS)
//! for tests and demos. It signs with a root or an intermediate from disk, and authorizes every request: the
//! caller is authenticated by a Kubernetes TokenReview or a static token file, and may obtain a certificate only
//! for its own identity, or, when the caller is a trusted node agent (`--trusted-node-accounts`, istiod's
//! `CA_TRUSTED_NODE_ACCOUNTS`), for an identity that a workload on the caller's node has according to the CA's
//! workload source (the mesh config file, watched, so edits apply live). Every decision is logged on the `audit`
//! target, with its reason.

pub mod node_accounts;
pub mod service;

use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use weft_proto::istio_ca::istio_certificate_service_server::IstioCertificateServiceServer;

pub use crate::auth::{AuthError, Authenticator, Caller};
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
    Tls(#[from] crate::auth::TlsError),
}

/// The server's TLS config: a serving certificate for `names`, issued by `ca`, ALPN `h2`.
pub fn server_tls(
    ca: &weft_identity::LocalCa,
    names: &[String],
) -> Result<Arc<rustls::ServerConfig>, Error> {
    Ok(crate::auth::server_tls_from_ca(
        ca,
        names,
        Duration::from_secs(365 * 24 * 3600),
    )?)
}

/// Serve `service` on `listener` over TLS (HTTP/2, gRPC) until `shutdown` resolves; open connections are then
/// closed (the accept loop is `crate::auth::serve`).
pub async fn serve(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    service: Arc<CaService>,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> Result<(), Error> {
    crate::auth::serve(
        listener,
        tls,
        IstioCertificateServiceServer::from_arc(service),
        shutdown,
    )
    .await;
    Ok(())
}
