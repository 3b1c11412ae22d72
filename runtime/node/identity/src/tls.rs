//! rustls configurations for HBONE: TLS 1.3 only, ALPN `h2`, mutual authentication with SPIFFE identities.
//! The client accepts a server only if its URI SAN is one the state expects; the server accepts a client only if
//! its chain verifies and its trust domain is the server's.

use std::sync::Arc;

use rustls::DigitallySignedStruct;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ParsedCertificate, WebPkiClientVerifier};
use rustls::{CertificateError, DistinguishedName, OtherError, SignatureScheme};

use crate::Error;
use crate::cert::{WorkloadCert, parse_leaf};
use crate::spiffe::SpiffeId;

/// ALPN protocol spoken over HBONE.
pub const ALPN_H2: &[u8] = b"h2";

/// The crypto provider weft uses: aws-lc-rs, TLS 1.3 suites AES-256-GCM and AES-128-GCM only, in Istio's order of
/// preference (ztunnel's `tls::lib::provider`), so a weft node protects its connections as a ztunnel node would.
pub fn provider() -> Arc<CryptoProvider> {
    static PROVIDER: std::sync::OnceLock<Arc<CryptoProvider>> = std::sync::OnceLock::new();
    PROVIDER
        .get_or_init(|| {
            let mut p = rustls::crypto::aws_lc_rs::default_provider();
            p.cipher_suites = vec![
                rustls::crypto::aws_lc_rs::cipher_suite::TLS13_AES_256_GCM_SHA384,
                rustls::crypto::aws_lc_rs::cipher_suite::TLS13_AES_128_GCM_SHA256,
            ];
            Arc::new(p)
        })
        .clone()
}

fn algs() -> WebPkiSupportedAlgorithms {
    provider().signature_verification_algorithms
}

/// Verify that `chain` (leaf first, then intermediates) is valid now and chains to `roots`.
pub fn verify_chain(
    chain: &[CertificateDer<'_>],
    roots: &rustls::RootCertStore,
    now: UnixTime,
) -> Result<(), Error> {
    let Some(leaf) = chain.first() else {
        return Err(Error::BadCertificate("empty chain".into()));
    };
    let parsed = ParsedCertificate::try_from(leaf)
        .map_err(|e| Error::BadCertificate(format!("leaf: {e}")))?;
    rustls::client::verify_server_cert_signed_by_trust_anchor(
        &parsed,
        roots,
        &chain[1..],
        now,
        algs().all,
    )
    .map_err(|e| Error::BadCertificate(format!("chain does not verify to the trust roots: {e}")))
}

/// The SPIFFE identity in a peer's leaf certificate (exactly one valid Istio-shaped URI SAN).
pub fn identity_of(leaf: &CertificateDer<'_>) -> Result<SpiffeId, Error> {
    let info = parse_leaf(leaf)?;
    let ids: Vec<SpiffeId> = info.uris.iter().filter_map(|u| u.parse().ok()).collect();
    match ids.as_slice() {
        [one] => Ok(one.clone()),
        [] => Err(Error::BadCertificate(format!(
            "no SPIFFE identity among URI SANs {:?}",
            info.uris
        ))),
        _ => Err(Error::BadCertificate(format!(
            "several SPIFFE identities among URI SANs {:?}",
            info.uris
        ))),
    }
}

fn other(e: Error) -> rustls::Error {
    rustls::Error::InvalidCertificate(CertificateError::Other(OtherError(Arc::new(e))))
}

/// Server-side config presenting `cert`; clients must present a chain to the same roots and trust domain.
pub(crate) fn server_config(cert: &WorkloadCert) -> Result<rustls::ServerConfig, Error> {
    let inner = WebPkiClientVerifier::builder_with_provider(cert.roots().clone(), provider())
        .build()
        .map_err(|e| Error::Tls(format!("client verifier: {e}")))?;
    let verifier = Arc::new(TrustDomainClientVerifier {
        inner,
        trust_domain: cert.identity().trust_domain().to_owned(),
    });
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| Error::Tls(e.to_string()))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(cert.chain().to_vec(), cert.key())
        .map_err(|e| Error::Tls(format!("server certificate/key: {e}")))?;
    cfg.alpn_protocols = vec![ALPN_H2.to_vec()];
    cfg.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
    cfg.send_tls13_tickets = 0;
    // weft-tls takes the session over after the handshake (its own record layer).
    cfg.enable_secret_extraction = true;
    Ok(cfg)
}

/// Client-side config presenting `cert`; the server must prove one of `expected`.
pub(crate) fn client_config(
    cert: &WorkloadCert,
    expected: Vec<SpiffeId>,
) -> Result<rustls::ClientConfig, Error> {
    let verifier = Arc::new(SpiffeServerVerifier {
        roots: cert.roots().clone(),
        expected,
    });
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| Error::Tls(e.to_string()))?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_client_auth_cert(cert.chain().to_vec(), cert.key())
        .map_err(|e| Error::Tls(format!("client certificate/key: {e}")))?;
    cfg.alpn_protocols = vec![ALPN_H2.to_vec()];
    cfg.enable_sni = false;
    cfg.resumption = rustls::client::Resumption::disabled();
    // weft-tls takes the session over after the handshake (its own record layer).
    cfg.enable_secret_extraction = true;
    Ok(cfg)
}

/// Accepts a server whose chain verifies to the roots and whose SPIFFE identity is one the state expects.
#[derive(Debug)]
struct SpiffeServerVerifier {
    roots: Arc<rustls::RootCertStore>,
    expected: Vec<SpiffeId>,
}

impl ServerCertVerifier for SpiffeServerVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let parsed = ParsedCertificate::try_from(end_entity)?;
        rustls::client::verify_server_cert_signed_by_trust_anchor(
            &parsed,
            &self.roots,
            intermediates,
            now,
            algs().all,
        )?;
        let got = identity_of(end_entity).map_err(other)?;
        if self.expected.contains(&got) {
            Ok(ServerCertVerified::assertion())
        } else {
            Err(other(Error::WrongIdentity {
                wanted: self
                    .expected
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(" or "),
                got: got.to_string(),
            }))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &algs())
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &algs())
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        algs().supported_schemes()
    }
}

/// WebPKI client verification (chain to the roots, client-auth usage) plus: the client's SPIFFE trust domain must
/// equal ours.
#[derive(Debug)]
struct TrustDomainClientVerifier {
    inner: Arc<dyn ClientCertVerifier>,
    trust_domain: String,
}

impl ClientCertVerifier for TrustDomainClientVerifier {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        self.inner
            .verify_client_cert(end_entity, intermediates, now)?;
        let id = identity_of(end_entity).map_err(other)?;
        if id.trust_domain() != self.trust_domain {
            return Err(other(Error::WrongIdentity {
                wanted: format!("an identity in trust domain {}", self.trust_domain),
                got: id.to_string(),
            }));
        }
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }

    fn client_auth_mandatory(&self) -> bool {
        true
    }
}
