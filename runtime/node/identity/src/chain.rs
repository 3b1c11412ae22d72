//! Checks on a chain a remote CA returned, before the secret manager ever sees it: the leaf must prove exactly
//! the identity asked for, and the chain must verify to the trust roots (the configured bundle plus the root the
//! CA sends as the chain's last element, which then joins the trust bundle).

use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;

use crate::Error;
use crate::ca::IssuedChain;
use crate::cert::{parse_leaf, to_pem};
use crate::manager::root_store;
use crate::spiffe::SpiffeId;

/// Every certificate in `pems` (an element may hold several PEM blocks), in order.
pub fn parse_pems(pems: &[String]) -> Result<Vec<CertificateDer<'static>>, Error> {
    let mut out = Vec::new();
    for pem in pems {
        for der in CertificateDer::pem_slice_iter(pem.as_bytes()) {
            out.push(der.map_err(|e| Error::BadCertificate(format!("bad PEM: {e}")))?);
        }
    }
    Ok(out)
}

/// Whether `der` is a self-signed CA certificate (a root).
pub fn is_root(der: &CertificateDer<'_>) -> bool {
    x509_parser::parse_x509_certificate(der)
        .map(|(_, c)| c.subject() == c.issuer() && c.is_ca())
        .unwrap_or(false)
}

/// Validate a CA's answer for `identity`. `configured_roots` (PEM) are the roots trusted before this answer.
/// Returns the chain to present (leaf first, then intermediates) and the trust bundle to use from now on
/// (configured roots plus the answer's roots, deduplicated).
///
/// The answer's shape is Istio's (istiod's `security/pkg/server/ca/server.go`, and ztunnel reads it so): the leaf,
/// the intermediates one per element, and as the **last element the whole root bundle**, which may hold several
/// roots (during a root rotation, the old and the new). With two elements or more, the last one is therefore taken
/// whole as roots and never presented. A single element (a CA that concatenates everything) is split into its
/// certificates and a self-signed CA certificate at its end is taken as the root.
pub fn validate_issued(
    identity: &SpiffeId,
    chain_pem: &[String],
    configured_roots: &[String],
) -> Result<IssuedChain, Error> {
    let (certs, bundle) = match chain_pem {
        [] => (Vec::new(), Vec::new()),
        [only] => {
            let mut certs = parse_pems(std::slice::from_ref(only))?;
            let root = if certs.len() > 1 && certs.last().is_some_and(|c| is_root(c)) {
                certs.pop()
            } else {
                None
            };
            (certs, root.into_iter().collect())
        }
        [chain @ .., bundle] => (
            parse_pems(chain)?,
            parse_pems(std::slice::from_ref(bundle))?,
        ),
    };
    let Some(leaf) = certs.first() else {
        return Err(Error::BadCertificate(
            "the CA returned an empty certificate chain".into(),
        ));
    };
    let info = parse_leaf(leaf)?;
    let want = identity.to_string();
    if info.uris != [want.clone()] {
        return Err(Error::WrongIdentity {
            wanted: want,
            got: if info.uris.is_empty() {
                "no URI SAN".into()
            } else {
                info.uris.join(",")
            },
        });
    }
    let mut roots: Vec<String> = Vec::new();
    for der in parse_pems(configured_roots)?.iter().chain(&bundle) {
        let pem = to_pem(der);
        if !roots.contains(&pem) {
            roots.push(pem);
        }
    }
    // A root the CA listed among the intermediates (a plugged-in CA whose chain file ends with its root) is
    // presented as istiod sent it, as ztunnel does; the peer's verification does not need it.
    if roots.is_empty() {
        return Err(Error::BadCertificate(
            "no trust roots: none configured and the CA sent none".into(),
        ));
    }
    let store = root_store(&roots)?;
    crate::tls::verify_chain(&certs, &store, rustls_pki_types::UnixTime::now())?;
    Ok(IssuedChain {
        chain_pem: certs.iter().map(to_pem).collect(),
        roots_pem: roots,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::ca::{LocalCa, generate_root};
    use crate::cert::new_csr;
    use std::time::Duration;

    fn ca() -> (LocalCa, String) {
        let (cert, key) = generate_root("cluster.local", Duration::from_secs(3600)).unwrap();
        (LocalCa::from_pem(&cert, &key, vec![]).unwrap(), cert)
    }

    #[test]
    fn accepts_a_good_chain_and_learns_its_root() {
        let (ca, root) = ca();
        let id: SpiffeId = "spiffe://cluster.local/ns/a/sa/b".parse().unwrap();
        let csr = new_csr(&id).unwrap();
        let chain = ca
            .sign_csr(&id, &csr.csr_pem, Duration::from_secs(60))
            .unwrap();
        let out = validate_issued(&id, &chain, &[]).unwrap();
        assert_eq!(out.chain_pem.len(), 1);
        assert_eq!(out.roots_pem.len(), 1);
        assert_eq!(
            parse_pems(&out.roots_pem).unwrap(),
            parse_pems(&[root]).unwrap()
        );
    }

    /// istiod during a root rotation: the leaf, then one last element holding both roots. Both are learnt and
    /// neither is presented (ztunnel reads the answer so; before, the old root was presented and only the new one
    /// was trusted).
    #[test]
    fn the_last_element_is_the_whole_root_bundle() {
        let (old_cert, _) = generate_root("cluster.local", Duration::from_secs(3600)).unwrap();
        let (new_cert, new_key) =
            generate_root("cluster.local", Duration::from_secs(3600)).unwrap();
        let ca = LocalCa::from_pem(
            &new_cert,
            &new_key,
            vec![old_cert.clone(), new_cert.clone()],
        )
        .unwrap();
        let id: SpiffeId = "spiffe://cluster.local/ns/a/sa/b".parse().unwrap();
        let csr = new_csr(&id).unwrap();
        let chain = ca
            .sign_csr(&id, &csr.csr_pem, Duration::from_secs(60))
            .unwrap();
        assert_eq!(chain.len(), 2, "leaf, then the bundle in one element");
        let out = validate_issued(&id, &chain, &[]).unwrap();
        assert_eq!(out.chain_pem.len(), 1, "no root is presented");
        let learnt = parse_pems(&out.roots_pem).unwrap();
        let both = parse_pems(&[old_cert, new_cert]).unwrap();
        assert_eq!(learnt, both);
    }

    /// An intermediate CA certificate and key signed by the root `(cert, key)`.
    fn intermediate(root_cert: &str, root_key: &str) -> (String, String) {
        let issuer =
            rcgen::Issuer::from_ca_cert_pem(root_cert, rcgen::KeyPair::from_pem(root_key).unwrap())
                .unwrap();
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let mut p = rcgen::CertificateParams::default();
        p.distinguished_name
            .push(rcgen::DnType::CommonName, "weft test intermediate");
        p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        p.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
        ];
        p.use_authority_key_identifier_extension = true;
        let cert = p.signed_by(&key, &issuer).unwrap();
        (cert.pem(), key.serialize_pem())
    }

    /// Leaf, an intermediate, the root bundle: the intermediate is presented, the root is not.
    #[test]
    fn intermediates_are_presented_and_the_bundle_is_not() {
        let (root_cert, root_key) =
            generate_root("cluster.local", Duration::from_secs(3600)).unwrap();
        let (int_cert, int_key) = intermediate(&root_cert, &root_key);
        let ca = LocalCa::from_pem(&int_cert, &int_key, vec![root_cert.clone()]).unwrap();
        let id: SpiffeId = "spiffe://cluster.local/ns/a/sa/b".parse().unwrap();
        let csr = new_csr(&id).unwrap();
        let chain = ca
            .sign_csr(&id, &csr.csr_pem, Duration::from_secs(60))
            .unwrap();
        assert_eq!(chain.len(), 3);
        let out = validate_issued(&id, &chain, &[]).unwrap();
        assert_eq!(out.chain_pem.len(), 2);
        assert_eq!(
            parse_pems(&out.chain_pem[1..]).unwrap(),
            parse_pems(&[int_cert]).unwrap()
        );
        assert_eq!(
            parse_pems(&out.roots_pem).unwrap(),
            parse_pems(&[root_cert]).unwrap()
        );
    }

    #[test]
    fn refuses_a_wrong_san() {
        let (ca, root) = ca();
        let asked: SpiffeId = "spiffe://cluster.local/ns/a/sa/b".parse().unwrap();
        let other: SpiffeId = "spiffe://cluster.local/ns/a/sa/other".parse().unwrap();
        let csr = new_csr(&asked).unwrap();
        let chain = ca
            .sign_csr_with_san(&other, &csr.csr_pem, Duration::from_secs(60))
            .unwrap();
        let err = validate_issued(&asked, &chain, &[root]).unwrap_err();
        assert!(matches!(err, Error::WrongIdentity { .. }), "{err}");
        assert!(err.to_string().contains("sa/other"), "{err}");
    }

    #[test]
    fn refuses_a_chain_that_does_not_verify() {
        let (ca, _) = ca();
        let (_, trusted_root) = self::ca();
        let id: SpiffeId = "spiffe://cluster.local/ns/a/sa/b".parse().unwrap();
        let csr = new_csr(&id).unwrap();
        let mut chain = ca
            .sign_csr(&id, &csr.csr_pem, Duration::from_secs(60))
            .unwrap();
        // The leaf without its root: it must verify to the configured (unrelated) root, and does not.
        chain.truncate(1);
        let err = validate_issued(&id, &chain, std::slice::from_ref(&trusted_root)).unwrap_err();
        assert!(err.to_string().contains("does not verify"), "{err}");
        // The leaf with a root that did not sign it.
        chain.push(trusted_root);
        let err = validate_issued(&id, &chain, &[]).unwrap_err();
        assert!(err.to_string().contains("does not verify"), "{err}");
        assert!(validate_issued(&id, &[], &[]).is_err());
    }
}
