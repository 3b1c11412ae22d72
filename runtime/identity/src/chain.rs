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
/// Returns the chain to present (leaf first, intermediates, the root dropped) and the trust bundle to use from
/// now on (configured roots plus the answer's root, deduplicated).
pub fn validate_issued(
    identity: &SpiffeId,
    chain_pem: &[String],
    configured_roots: &[String],
) -> Result<IssuedChain, Error> {
    let mut certs = parse_pems(chain_pem)?;
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
    for der in parse_pems(configured_roots)? {
        let pem = to_pem(&der);
        if !roots.contains(&pem) {
            roots.push(pem);
        }
    }
    if certs.len() > 1
        && certs.last().is_some_and(|c| is_root(c))
        && let Some(root) = certs.pop()
    {
        let pem = to_pem(&root);
        if !roots.contains(&pem) {
            roots.push(pem);
        }
    }
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
