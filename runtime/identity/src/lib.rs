//! weft's identity: SPIFFE identities, certificate authorities behind one trait (a local CA today, the Istio CA
//! protocol next), the per-node secret manager (one cert per identity, in memory only), and the rustls configs
//! HBONE uses (TLS 1.3, mutual auth, SPIFFE SAN checks).

pub mod ca;
pub mod cert;
pub mod manager;
pub mod spiffe;
pub mod tls;

pub use ca::{CaClient, CertRequest, IssuedChain, LocalCa};
pub use cert::WorkloadCert;
pub use manager::{CertificateDump, ManagerConfig, SecretManager};
pub use spiffe::SpiffeId;

/// Errors of the identity crate.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// Key or CSR generation failed.
    #[error("key/CSR generation: {0}")]
    Rcgen(String),
    /// A certificate or chain is malformed or does not verify.
    #[error("bad certificate: {0}")]
    BadCertificate(String),
    /// A certificate proves another identity than the one wanted.
    #[error("certificate identity mismatch: wanted {wanted}, got {got}")]
    WrongIdentity {
        /// What was expected.
        wanted: String,
        /// What the certificate carries.
        got: String,
    },
    /// Building a TLS config failed.
    #[error("tls: {0}")]
    Tls(String),
    /// The CA refused or failed.
    #[error("certificate authority: {0}")]
    Ca(String),
}

impl Error {
    pub(crate) fn rcgen(e: impl std::fmt::Display) -> Self {
        Error::Rcgen(e.to_string())
    }
}
