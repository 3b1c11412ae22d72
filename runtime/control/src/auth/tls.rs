//! The serving TLS config of a gRPC server: a certificate issued by a local CA (development meshes, tests) or
//! given as PEM (a chain and its key, e.g. from files an operator or cert-manager provides); ALPN `h2`.

use std::sync::Arc;
use std::time::Duration;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// Why a serving config could not be built.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The CA could not issue the certificate.
    #[error("issuing the serving certificate: {0}")]
    Issue(#[from] weft_identity::Error),
    /// The chain or key PEM does not parse.
    #[error("{what}: {message}")]
    Pem {
        /// Which input.
        what: &'static str,
        /// What is wrong.
        message: String,
    },
    /// rustls refused the pair (key does not match, unsupported key type, ...).
    #[error("TLS config: {0}")]
    Config(String),
}

/// A serving config with a certificate for `names` (DNS names or IP addresses) issued by `ca`, valid `validity`.
pub fn server_tls_from_ca(
    ca: &weft_identity::LocalCa,
    names: &[String],
    validity: Duration,
) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let (chain_pem, key_pem) = ca.issue_server_cert(names, validity)?;
    server_tls_from_pem(&chain_pem, &key_pem)
}

/// A serving config from a PEM chain (leaf first) and its PEM private key.
pub fn server_tls_from_pem(
    chain_pem: &str,
    key_pem: &str,
) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let chain = CertificateDer::pem_slice_iter(chain_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Pem {
            what: "certificate chain",
            message: e.to_string(),
        })?;
    if chain.is_empty() {
        return Err(TlsError::Pem {
            what: "certificate chain",
            message: "no CERTIFICATE block".into(),
        });
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).map_err(|e| TlsError::Pem {
        what: "private key",
        message: e.to_string(),
    })?;
    let mut cfg = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| TlsError::Config(e.to_string()))?
    .with_no_client_auth()
    .with_single_cert(chain, key)
    .map_err(|e| TlsError::Config(e.to_string()))?;
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(cfg))
}
