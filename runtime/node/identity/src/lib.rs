//! weft's identity: SPIFFE identities, certificate authorities behind one trait (a local CA, the Istio CA protocol
//! over gRPC+TLS, Kubernetes' CSR API), the per-node secret manager (one cert per identity, in memory only,
//! coalesced and prioritized CA calls, rotation with backoff), and the rustls configs HBONE uses (TLS 1.3, mutual
//! auth, SPIFFE SAN checks).

pub mod ca;
pub mod cert;
pub mod chain;
pub mod clock;
pub mod istio;
pub mod k8s_csr;
pub mod kube;
pub mod manager;
pub mod sched;
pub mod select;
pub mod spiffe;
pub mod tls;

pub use ca::{CaClient, CertRequest, IssuedChain, LocalCa};
pub use cert::WorkloadCert;
pub use istio::{IstioCaClient, IstioCaConfig};
pub use k8s_csr::{K8sCsrClient, K8sCsrConfig};
pub use kube::KubeClient;
pub use manager::{CertificateDump, IdentityCounters, ManagerConfig, SecretManager};
pub use sched::Priority;
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
    /// The CA answered and refused the request (e.g. `PermissionDenied`: the identity is not on this node).
    #[error("certificate authority refused the request: {code}: {message}")]
    CaRefused {
        /// The status, e.g. `PermissionDenied`, `Unauthenticated`, or `Denied` for a Kubernetes CSR.
        code: String,
        /// The CA's explanation.
        message: String,
    },
    /// The CA could not be reached or did not answer in time.
    #[error("certificate authority unavailable: {0}")]
    CaUnavailable(String),
    /// The identity was forgotten (no local workload uses it any more) while its certificate was being fetched.
    #[error("identity {0} forgotten: no local workload uses it")]
    Forgotten(String),
}

impl Error {
    pub(crate) fn rcgen(e: impl std::fmt::Display) -> Self {
        Error::Rcgen(e.to_string())
    }
}
