//! The kube-rs client from weft-control's flags: the API server URL, its CA bundle and a bearer token file (the
//! same three flags TokenReview uses; in a pod, the projected service-account token).

use crate::kube::{Error, KubeOptions};

/// Build the client.
pub fn build(opts: &KubeOptions) -> Result<kube::Client, Error> {
    let url = opts
        .api
        .parse()
        .map_err(|e| Error::Client(format!("--kube-api {:?}: {e}", opts.api)))?;
    let mut config = kube::Config::new(url);
    config.default_namespace = opts.namespace.clone();
    if let Some(ca) = &opts.ca_file {
        let pem = std::fs::read(ca)
            .map_err(|e| Error::Client(format!("--kube-ca-file {}: {e}", ca.display())))?;
        let mut certs = Vec::new();
        for c in rustls_pemfile_certs(&pem) {
            certs.push(
                c.map_err(|e| Error::Client(format!("--kube-ca-file {}: {e}", ca.display())))?,
            );
        }
        if certs.is_empty() {
            return Err(Error::Client(format!(
                "--kube-ca-file {}: no certificate in it",
                ca.display()
            )));
        }
        config.root_cert = Some(certs);
    }
    if let Some(token) = &opts.token_file {
        // Re-read by kube-rs as the file changes (projected tokens rotate).
        config.auth_info.token_file = Some(token.display().to_string());
    }
    kube::Client::try_from(config).map_err(|e| Error::Client(e.to_string()))
}

/// The DER certificates of a PEM bundle.
fn rustls_pemfile_certs(pem: &[u8]) -> impl Iterator<Item = Result<Vec<u8>, String>> + '_ {
    use rustls_pki_types::CertificateDer;
    use rustls_pki_types::pem::PemObject as _;
    CertificateDer::pem_slice_iter(pem).map(|c| c.map(|c| c.to_vec()).map_err(|e| e.to_string()))
}
