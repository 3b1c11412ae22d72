//! The rustls client config for fetches: aws-lc-rs, TLS 1.2 and 1.3, roots from the system bundle or a file.

use std::path::Path;
use std::sync::Arc;

use rustls::RootCertStore;
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;

use crate::{FetchError, Roots};

/// Where Debian, Red Hat and Alpine keep the system bundle.
const SYSTEM_BUNDLES: &[&str] = &[
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/cert.pem",
];

fn load_file(path: &Path, store: &mut RootCertStore) -> Result<usize, FetchError> {
    let pem = std::fs::read(path)
        .map_err(|e| FetchError::Roots(format!("cannot read {}: {e}", path.display())))?;
    let mut added = 0;
    for der in CertificateDer::pem_slice_iter(&pem) {
        let der = der.map_err(|e| FetchError::Roots(format!("{}: {e}", path.display())))?;
        // A bundle may hold certificates webpki cannot use as anchors; skip those, as every TLS client does.
        if store.add(der).is_ok() {
            added += 1;
        }
    }
    Ok(added)
}

pub(crate) fn root_store(roots: &Roots) -> Result<RootCertStore, FetchError> {
    let mut store = RootCertStore::empty();
    match roots {
        Roots::File(path) => {
            if load_file(path, &mut store)? == 0 {
                return Err(FetchError::Roots(format!(
                    "{} holds no usable certificate",
                    path.display()
                )));
            }
        }
        Roots::System => {
            let env = std::env::var_os("SSL_CERT_FILE").map(std::path::PathBuf::from);
            let path = env
                .into_iter()
                .chain(SYSTEM_BUNDLES.iter().map(std::path::PathBuf::from))
                .find(|p| p.is_file())
                .ok_or_else(|| {
                    FetchError::Roots(format!(
                        "no system bundle (SSL_CERT_FILE unset, none of {})",
                        SYSTEM_BUNDLES.join(", ")
                    ))
                })?;
            load_file(&path, &mut store)?;
        }
    }
    Ok(store)
}

pub(crate) fn client_config(roots: &Roots) -> Result<Arc<rustls::ClientConfig>, FetchError> {
    let store = root_store(roots)?;
    let mut cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| FetchError::Roots(e.to_string()))?
    .with_root_certificates(store)
    .with_no_client_auth();
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}
