//! Choosing the CA a node uses, from its settings: the local CA (the standalone default), an Istio-protocol CA,
//! or Kubernetes' CSR API.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::Error;
use crate::ca::{CaClient, LocalCa};
use crate::istio::{IstioCaClient, IstioCaConfig};
use crate::k8s_csr::{K8sCsrClient, K8sCsrConfig};
use crate::kube::KubeClient;

/// Which CA signs workload certificates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CaKind {
    /// In process, from a CA directory.
    Local,
    /// `istio.v1.auth.IstioCertificateService` over gRPC+TLS.
    Istio,
    /// Kubernetes' `certificates.k8s.io/v1` CertificateSigningRequest API.
    K8sCsr,
}

/// Everything any CA kind may need.
#[derive(Debug, Clone)]
pub struct CaSettings {
    /// The kind.
    pub kind: CaKind,
    /// Local: the CA directory.
    pub ca_dir: Option<PathBuf>,
    /// Istio: `https://host:port`.
    pub address: Option<String>,
    /// Istio: roots for the CA's TLS certificate and the initial bundle; k8s-csr: the signer's roots.
    pub root_cert: Option<PathBuf>,
    /// Istio: the node's token for the CA; k8s-csr: its token for the API server.
    pub token_file: Option<PathBuf>,
    /// Istio: `clusterid` header.
    pub cluster_id: String,
    /// Istio: TLS name override.
    pub server_name: Option<String>,
    /// k8s-csr: API server URL.
    pub kube_api: Option<String>,
    /// k8s-csr: the API server's CA bundle.
    pub kube_ca_file: Option<PathBuf>,
    /// k8s-csr: `spec.signerName`.
    pub signer_name: String,
    /// Deadline of one CA call (k8s-csr: of the wait for a signature).
    pub timeout: Duration,
}

fn need<T: Clone>(v: &Option<T>, flag: &str, kind: &str) -> Result<T, Error> {
    v.clone()
        .ok_or_else(|| Error::Ca(format!("{flag} is required with --ca-kind {kind}")))
}

/// Build the CA client the settings describe.
pub fn build_ca(s: &CaSettings) -> Result<Arc<dyn CaClient>, Error> {
    Ok(match s.kind {
        CaKind::Local => Arc::new(LocalCa::from_dir(&need(&s.ca_dir, "--ca-dir", "local")?)?),
        CaKind::Istio => Arc::new(IstioCaClient::new(IstioCaConfig {
            address: need(&s.address, "--ca-address", "istio")?,
            root_cert: s.root_cert.clone(),
            token_file: s.token_file.clone(),
            cluster_id: s.cluster_id.clone(),
            server_name: s.server_name.clone(),
            timeout: s.timeout,
        })?),
        CaKind::K8sCsr => {
            let url = need(&s.kube_api, "--kube-api", "k8s-csr")?;
            Arc::new(K8sCsrClient::new(K8sCsrConfig {
                api: KubeClient::new(&url, s.kube_ca_file.as_deref(), s.token_file.clone())?,
                signer_name: s.signer_name.clone(),
                root_cert: need(&s.root_cert, "--ca-root-cert", "k8s-csr")?,
                poll_interval: Duration::from_millis(250),
                wait: s.timeout,
            }))
        }
    })
}
