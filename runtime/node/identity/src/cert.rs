//! A workload certificate (private key + chain) as the node holds it in memory, and the CSR that requests one.

use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use serde::Serialize;

use crate::spiffe::SpiffeId;
use crate::{Error, tls};

/// A fresh key pair and the PEM CSR for one identity (ECDSA P-256, the SPIFFE URI as the only SAN, empty subject).
pub struct CsrAndKey {
    /// PEM-encoded PKCS#10 request.
    pub csr_pem: String,
    /// The private key (PKCS#8 DER); never leaves the node.
    pub key: PrivatePkcs8KeyDer<'static>,
}

impl std::fmt::Debug for CsrAndKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CsrAndKey").finish_non_exhaustive()
    }
}

/// Generate a key and a CSR for `id`.
pub fn new_csr(id: &SpiffeId) -> Result<CsrAndKey, Error> {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(Error::rcgen)?;
    let mut params = rcgen::CertificateParams::default();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params.subject_alt_names = vec![rcgen::SanType::URI(
        rcgen::string::Ia5String::try_from(id.to_string()).map_err(Error::rcgen)?,
    )];
    let csr = params.serialize_request(&key).map_err(Error::rcgen)?;
    Ok(CsrAndKey {
        csr_pem: csr.pem().map_err(Error::rcgen)?,
        key: PrivatePkcs8KeyDer::from(key.serialize_der()),
    })
}

/// What `/config_dump` and metrics show of a certificate.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CertSummary {
    /// PEM of this certificate.
    pub pem: String,
    /// Serial number, decimal (as ztunnel dumps it; `istioctl ztunnel-config certificates` prints it in hex).
    pub serial_number: String,
    /// Not valid before (RFC 3339).
    pub valid_from: String,
    /// Not valid after (RFC 3339).
    pub expiration_time: String,
}

/// A certificate the node holds for one identity.
pub struct WorkloadCert {
    identity: SpiffeId,
    key: PrivatePkcs8KeyDer<'static>,
    chain: Vec<CertificateDer<'static>>,
    roots: Arc<rustls::RootCertStore>,
    root_pems: Vec<String>,
    not_before: SystemTime,
    not_after: SystemTime,
    serial: String,
    summaries: Vec<CertSummary>,
    root_summaries: Vec<CertSummary>,
    server_config: OnceLock<Arc<rustls::ServerConfig>>,
}

impl std::fmt::Debug for WorkloadCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkloadCert")
            .field("identity", &self.identity.to_string())
            .field("serial", &self.serial)
            .field("not_after", &self.not_after)
            .finish_non_exhaustive()
    }
}

impl WorkloadCert {
    /// Assemble and validate: the leaf must carry exactly `identity` as a URI SAN, the chain must verify to
    /// `roots`, and the key must match the leaf.
    pub fn new(
        identity: SpiffeId,
        key: PrivatePkcs8KeyDer<'static>,
        chain_pem: &[String],
        roots: Arc<rustls::RootCertStore>,
        root_pems: Vec<String>,
    ) -> Result<Self, Error> {
        Self::new_at(
            identity,
            key,
            chain_pem,
            roots,
            root_pems,
            SystemTime::now(),
        )
    }

    /// [`WorkloadCert::new`], with the chain verified at the wall time `now` (the secret manager's clock).
    pub fn new_at(
        identity: SpiffeId,
        key: PrivatePkcs8KeyDer<'static>,
        chain_pem: &[String],
        roots: Arc<rustls::RootCertStore>,
        root_pems: Vec<String>,
        now: SystemTime,
    ) -> Result<Self, Error> {
        let mut chain = Vec::new();
        for pem in chain_pem {
            for der in CertificateDer::pem_slice_iter(pem.as_bytes()) {
                chain.push(
                    der.map_err(|e| Error::BadCertificate(format!("bad PEM in chain: {e}")))?,
                );
            }
        }
        let Some(leaf) = chain.first() else {
            return Err(Error::BadCertificate("empty certificate chain".into()));
        };
        let info = parse_leaf(leaf)?;
        if !info.uris.iter().any(|u| u == &identity.to_string()) {
            return Err(Error::WrongIdentity {
                wanted: identity.to_string(),
                got: info.uris.join(","),
            });
        }
        // Drop a trailing self-signed root from what we present; peers have it.
        let mut presented = chain.clone();
        if presented.len() > 1 && is_self_signed(presented.last().unwrap_or(leaf)) {
            presented.pop();
        }
        let since_epoch = now
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_err(|e| Error::BadCertificate(format!("clock before 1970: {e}")))?;
        tls::verify_chain(
            &presented,
            &roots,
            rustls::pki_types::UnixTime::since_unix_epoch(since_epoch),
        )?;
        // The leaf and intermediates, as ztunnel's `certChain` (the roots are `rootCerts`).
        let summaries = presented
            .iter()
            .map(summary)
            .collect::<Result<Vec<_>, Error>>()?;
        let mut root_summaries = Vec::new();
        for pem in &root_pems {
            for der in CertificateDer::pem_slice_iter(pem.as_bytes()) {
                let der = der.map_err(|e| Error::BadCertificate(format!("bad root PEM: {e}")))?;
                root_summaries.push(summary(&der)?);
            }
        }
        let cert = Self {
            identity,
            key,
            chain: presented,
            roots,
            root_pems,
            not_before: info.not_before,
            not_after: info.not_after,
            serial: info.serial,
            summaries,
            root_summaries,
            server_config: OnceLock::new(),
        };
        // Fail now, not on the first connection, if the key does not match.
        cert.server_config()?;
        Ok(cert)
    }

    /// The identity this certificate proves.
    pub fn identity(&self) -> &SpiffeId {
        &self.identity
    }

    /// Chain presented to peers: leaf first, then intermediates.
    pub fn chain(&self) -> &[CertificateDer<'static>] {
        &self.chain
    }

    /// The private key.
    pub fn key(&self) -> PrivateKeyDer<'static> {
        PrivateKeyDer::Pkcs8(self.key.clone_key())
    }

    /// Trust roots in force when this certificate was issued.
    pub fn roots(&self) -> &Arc<rustls::RootCertStore> {
        &self.roots
    }

    /// Root certificates as PEM.
    pub fn root_pems(&self) -> &[String] {
        &self.root_pems
    }

    /// Not valid before.
    pub fn not_before(&self) -> SystemTime {
        self.not_before
    }

    /// Not valid after.
    pub fn not_after(&self) -> SystemTime {
        self.not_after
    }

    /// Leaf serial number (decimal).
    pub fn serial(&self) -> &str {
        &self.serial
    }

    /// Per-certificate summaries of the chain as issued (leaf first).
    pub fn summaries(&self) -> &[CertSummary] {
        &self.summaries
    }

    /// The trust roots, as `/config_dump` shows them.
    pub fn root_summaries(&self) -> &[CertSummary] {
        &self.root_summaries
    }

    /// Time left before expiry (zero if expired).
    pub fn remaining(&self, now: SystemTime) -> Duration {
        self.not_after.duration_since(now).unwrap_or_default()
    }

    /// The TLS server config that presents this certificate and requires a client certificate from the same
    /// trust domain. Built once per certificate.
    pub fn server_config(&self) -> Result<Arc<rustls::ServerConfig>, Error> {
        if let Some(c) = self.server_config.get() {
            return Ok(c.clone());
        }
        let cfg = Arc::new(tls::server_config(self)?);
        Ok(self.server_config.get_or_init(|| cfg).clone())
    }

    /// A TLS client config presenting this certificate and accepting only a server whose URI SAN is one of
    /// `expected`.
    pub fn client_config(
        &self,
        expected: Vec<SpiffeId>,
    ) -> Result<Arc<rustls::ClientConfig>, Error> {
        Ok(Arc::new(tls::client_config(self, expected)?))
    }
}

/// Facts read from one certificate.
#[derive(Debug, Clone)]
pub struct LeafInfo {
    /// URI SANs.
    pub uris: Vec<String>,
    /// Serial, decimal.
    pub serial: String,
    /// Not before.
    pub not_before: SystemTime,
    /// Not after.
    pub not_after: SystemTime,
}

/// Parse the facts weft needs from a DER certificate.
pub fn parse_leaf(der: &CertificateDer<'_>) -> Result<LeafInfo, Error> {
    let (_, cert) = x509_parser::parse_x509_certificate(der)
        .map_err(|e| Error::BadCertificate(format!("unparsable certificate: {e}")))?;
    let mut uris = Vec::new();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for name in &san.value.general_names {
            if let x509_parser::extensions::GeneralName::URI(u) = name {
                uris.push((*u).to_owned());
            }
        }
    }
    let ts = |t: i64| UNIX_EPOCH + Duration::from_secs(u64::try_from(t).unwrap_or(0));
    Ok(LeafInfo {
        uris,
        serial: cert.tbs_certificate.serial.to_string(),
        not_before: ts(cert.validity().not_before.timestamp()),
        not_after: ts(cert.validity().not_after.timestamp()),
    })
}

/// What the dump shows of one certificate.
fn summary(der: &CertificateDer<'_>) -> Result<CertSummary, Error> {
    let i = parse_leaf(der)?;
    Ok(CertSummary {
        pem: to_pem(der),
        serial_number: i.serial,
        valid_from: rfc3339(i.not_before),
        expiration_time: rfc3339(i.not_after),
    })
}

fn is_self_signed(der: &CertificateDer<'_>) -> bool {
    x509_parser::parse_x509_certificate(der)
        .map(|(_, c)| c.subject() == c.issuer())
        .unwrap_or(false)
}

/// PEM text of a DER certificate.
pub fn to_pem(der: &CertificateDer<'_>) -> String {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD.encode(der.as_ref());
    let mut out = String::from("-----BEGIN CERTIFICATE-----\n");
    for chunk in b64.as_bytes().chunks(64) {
        out.push_str(std::str::from_utf8(chunk).unwrap_or_default());
        out.push('\n');
    }
    out.push_str("-----END CERTIFICATE-----\n");
    out
}

/// RFC 3339 (UTC, seconds) for a time.
pub fn rfc3339(t: SystemTime) -> String {
    let secs = t
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    time::OffsetDateTime::from_unix_timestamp(i64::try_from(secs).unwrap_or(0))
        .ok()
        .and_then(|d| {
            d.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_else(|| secs.to_string())
}
