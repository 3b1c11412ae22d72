//! A CA client for Kubernetes' CSR API (`certificates.k8s.io/v1`): create a CertificateSigningRequest for a
//! signer, wait until an approver and the signer have put the certificate in `status.certificate`, delete the
//! object, and check the certificate like any CA answer (exact SAN, chain to the signer's roots from a file).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use base64::Engine as _;
use futures_util::future::BoxFuture;
use http::Method;
use serde_json::json;

use crate::Error;
use crate::ca::{CaClient, CertRequest, IssuedChain};
use crate::chain::validate_issued;
use crate::kube::{KubeClient, status_message};

const CSR_PATH: &str = "/apis/certificates.k8s.io/v1/certificatesigningrequests";

/// How to use the CSR API.
#[derive(Debug, Clone)]
pub struct K8sCsrConfig {
    /// The API server.
    pub api: KubeClient,
    /// `spec.signerName`, e.g. `example.com/weft-workloads`.
    pub signer_name: String,
    /// The signer's roots (PEM file): the trust bundle, which the CSR API does not hand out. Re-read every call.
    pub root_cert: PathBuf,
    /// How often the CSR's status is polled.
    pub poll_interval: Duration,
    /// How long to wait for the certificate before giving up.
    pub wait: Duration,
}

/// The CSR API client.
#[derive(Debug)]
pub struct K8sCsrClient {
    cfg: K8sCsrConfig,
}

/// The API refuses `expirationSeconds` below this.
const MIN_EXPIRATION_SECONDS: u64 = 600;

/// The key usages a workload certificate needs (names as the API spells them).
pub const USAGES: [&str; 4] = [
    "digital signature",
    "key encipherment",
    "client auth",
    "server auth",
];

impl K8sCsrClient {
    /// A client.
    pub fn new(cfg: K8sCsrConfig) -> Self {
        Self { cfg }
    }

    fn roots(&self) -> Result<Vec<String>, Error> {
        std::fs::read_to_string(&self.cfg.root_cert)
            .map(|s| vec![s])
            .map_err(|e| {
                Error::Ca(format!(
                    "reading signer roots {}: {e}",
                    self.cfg.root_cert.display()
                ))
            })
    }

    async fn create(&self, req: &CertRequest) -> Result<String, Error> {
        let b64 = base64::engine::general_purpose::STANDARD;
        let id = &req.identity;
        let body = json!({
            "apiVersion": "certificates.k8s.io/v1",
            "kind": "CertificateSigningRequest",
            "metadata": {
                "generateName": format!("weft-{}-{}-", dns_label(id.namespace()), dns_label(id.service_account())),
                "labels": { "app.kubernetes.io/managed-by": "weft" },
                "annotations": { "weft.dev/identity": id.to_string() },
            },
            "spec": {
                "request": b64.encode(req.csr_pem.as_bytes()),
                "signerName": self.cfg.signer_name,
                "usages": USAGES,
                "expirationSeconds": req.validity.as_secs().max(MIN_EXPIRATION_SECONDS),
            },
        });
        let (status, resp) = self
            .cfg
            .api
            .request(Method::POST, CSR_PATH, Some(&body))
            .await?;
        if !(200..300).contains(&status) {
            return Err(http_error(
                status,
                &resp,
                "creating the CertificateSigningRequest",
            ));
        }
        resp.pointer("/metadata/name")
            .and_then(|n| n.as_str())
            .map(str::to_owned)
            .ok_or_else(|| Error::Ca("the created CertificateSigningRequest has no name".into()))
    }

    async fn wait_for_certificate(&self, name: &str) -> Result<String, Error> {
        let start = Instant::now();
        let path = format!("{CSR_PATH}/{name}");
        loop {
            let (status, csr) = self.cfg.api.request(Method::GET, &path, None).await?;
            if !(200..300).contains(&status) {
                return Err(http_error(
                    status,
                    &csr,
                    "reading the CertificateSigningRequest",
                ));
            }
            for c in csr
                .pointer("/status/conditions")
                .and_then(|c| c.as_array())
                .into_iter()
                .flatten()
            {
                let kind = c.get("type").and_then(|t| t.as_str()).unwrap_or("");
                if matches!(kind, "Denied" | "Failed") {
                    let reason = c.get("reason").and_then(|t| t.as_str()).unwrap_or("");
                    let message = c.get("message").and_then(|t| t.as_str()).unwrap_or("");
                    return Err(Error::CaRefused {
                        code: kind.to_owned(),
                        message: format!("CertificateSigningRequest {name}: {reason} {message}")
                            .trim_end()
                            .to_owned(),
                    });
                }
            }
            if let Some(cert) = csr
                .pointer("/status/certificate")
                .and_then(|c| c.as_str())
                .filter(|c| !c.is_empty())
            {
                let pem = base64::engine::general_purpose::STANDARD
                    .decode(cert)
                    .map_err(|e| Error::BadCertificate(format!("status.certificate: {e}")))?;
                return String::from_utf8(pem)
                    .map_err(|e| Error::BadCertificate(format!("status.certificate: {e}")));
            }
            if start.elapsed() >= self.cfg.wait {
                return Err(Error::CaUnavailable(format!(
                    "CertificateSigningRequest {name} not signed within {:?} (approved? is signer {} running?)",
                    self.cfg.wait, self.cfg.signer_name
                )));
            }
            tokio::time::sleep(self.cfg.poll_interval).await;
        }
    }

    async fn sign_inner(&self, req: &CertRequest) -> Result<IssuedChain, Error> {
        let roots = self.roots()?;
        let name = self.create(req).await?;
        tracing::debug!(identity = %req.identity, csr = %name, "CertificateSigningRequest created");
        let result = self.wait_for_certificate(&name).await;
        let path = format!("{CSR_PATH}/{name}");
        match self.cfg.api.request(Method::DELETE, &path, None).await {
            Ok((s, _)) if (200..300).contains(&s) || s == 404 => {}
            Ok((s, body)) => {
                tracing::warn!(csr = %name, status = s, message = %status_message(&body), "deleting the CertificateSigningRequest");
            }
            Err(e) => {
                tracing::warn!(csr = %name, error = %e, "deleting the CertificateSigningRequest")
            }
        }
        let pem = result?;
        validate_issued(&req.identity, &[pem], &roots).inspect_err(
            |e| tracing::error!(identity = %req.identity, error = %e, "refusing the signed certificate"),
        )
    }
}

fn http_error(status: u16, body: &serde_json::Value, what: &str) -> Error {
    let message = format!("{what}: {}", status_message(body));
    if (400..500).contains(&status) && status != 408 && status != 429 {
        Error::CaRefused {
            code: format!("HTTP {status}"),
            message,
        }
    } else {
        Error::CaUnavailable(format!("HTTP {status}: {message}"))
    }
}

/// Lowercase alphanumerics and '-', at most 20 characters: a safe piece of an object name.
fn dns_label(s: &str) -> String {
    let mut out: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .take(20)
        .collect();
    while out.ends_with('-') {
        out.pop();
    }
    out
}

impl CaClient for K8sCsrClient {
    fn sign<'a>(&'a self, req: &'a CertRequest) -> BoxFuture<'a, Result<IssuedChain, Error>> {
        Box::pin(self.sign_inner(req))
    }

    fn trust_roots(&self) -> Vec<String> {
        self.roots().unwrap_or_default()
    }
}
