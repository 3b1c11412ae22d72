//! `ca_csr`: what a node sends the reference CA (`weft-ca`) in `CreateCertificate` besides its token: the
//! impersonated identity (parsed as a SPIFFE id) and the PEM CSR, which `LocalCa::sign_csr` parses, checks (its
//! only SAN must be the identity asked for) and signs. Input: a structured value (`arbitrary`): the identity as
//! text or as parts, and the CSR as PEM text, as DER (wrapped in PEM here) or built and signed here from
//! fuzzed SANs, subject and extensions (so the SAN check is reached with validly signed CSRs).
//!
//! Invariants: a SPIFFE id that parses reads back the same; a certificate is issued only for a CSR whose SANs
//! are exactly the identity asked for, and a CSR built that way is always signed; the issued leaf names exactly
//! that identity as its only SAN, has an empty subject, is no CA, carries the CSR's public key, the requested
//! lifetime (plus 60 s back-dating) and is followed by the CA's root.
//!
//! Byte 0 = 0: the rest is text, the identity on the first line and the PEM CSR after it (the seeds' form).

use std::sync::OnceLock;
use std::time::Duration;

use arbitrary::{Arbitrary, Unstructured};
use weft_identity::{LocalCa, SpiffeId};
use x509_parser::extensions::{GeneralName, ParsedExtension};
use x509_parser::prelude::FromDer;

#[derive(Debug, Arbitrary)]
enum Ident {
    Text(String),
    Parts(String, String, String),
    Default,
}

#[derive(Debug, Arbitrary)]
enum San {
    Uri(String),
    Dns(String),
    Ip([u8; 4]),
    Email(String),
}

#[derive(Debug, Arbitrary)]
struct Built {
    ed25519: bool,
    /// Put the identity asked for as the first SAN.
    identity_san: bool,
    sans: Vec<San>,
    common_name: Option<String>,
    is_ca: bool,
    client_auth: bool,
}

#[derive(Debug, Arbitrary)]
enum Csr {
    Pem(String),
    Der(Vec<u8>),
    Built(Built),
}

#[derive(Debug, Arbitrary)]
struct Input {
    ident: Ident,
    csr: Csr,
    validity_secs: u32,
}

struct Fixture {
    ca: LocalCa,
    root_pem: String,
    p256: rcgen::KeyPair,
    ed25519: rcgen::KeyPair,
}

fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let (root_pem, key_pem) = weft_identity::ca::generate_root(
            "cluster.local",
            Duration::from_secs(10 * 365 * 86400),
        )
        .unwrap_or_else(|e| panic!("root: {e}"));
        let ca =
            LocalCa::from_pem(&root_pem, &key_pem, vec![]).unwrap_or_else(|e| panic!("CA: {e}"));
        let key = |alg| rcgen::KeyPair::generate_for(alg).unwrap_or_else(|e| panic!("key: {e}"));
        Fixture {
            ca,
            root_pem,
            p256: key(&rcgen::PKCS_ECDSA_P256_SHA256),
            ed25519: key(&rcgen::PKCS_ED25519),
        }
    })
}

/// PEM-armour DER as a CSR.
pub fn pem(label: &str, der: &[u8]) -> String {
    const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut b64 = String::new();
    for c in der.chunks(3) {
        let n = c
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..4 {
            b64.push(if i <= c.len() {
                char::from(B64[(n >> (18 - 6 * i) & 63) as usize])
            } else {
                '='
            });
        }
    }
    let mut out = format!("-----BEGIN {label}-----\n");
    for line in b64.as_bytes().chunks(64) {
        out.push_str(&String::from_utf8_lossy(line));
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

/// A CSR signed by one of the fixture's keys; its public key (DER SubjectPublicKeyInfo contents) and whether its
/// SANs are exactly `[URI wanted]`.
fn build(b: Built, wanted: &str) -> Option<(String, Vec<u8>, bool)> {
    let f = fixture();
    let key = if b.ed25519 { &f.ed25519 } else { &f.p256 };
    let mut sans = Vec::new();
    if b.identity_san {
        sans.push(rcgen::SanType::URI(wanted.try_into().ok()?));
    }
    for s in b.sans {
        sans.push(match s {
            San::Uri(u) => rcgen::SanType::URI(u.try_into().ok()?),
            San::Dns(d) => rcgen::SanType::DnsName(d.try_into().ok()?),
            San::Ip(ip) => rcgen::SanType::IpAddress(ip.into()),
            San::Email(e) => rcgen::SanType::Rfc822Name(e.try_into().ok()?),
        });
    }
    let exact = matches!(sans.as_slice(), [rcgen::SanType::URI(u)] if u.as_str() == wanted);
    let mut p = rcgen::CertificateParams::default();
    p.subject_alt_names = sans;
    p.distinguished_name = rcgen::DistinguishedName::new();
    if let Some(cn) = b.common_name {
        p.distinguished_name.push(rcgen::DnType::CommonName, cn);
    }
    if b.is_ca {
        p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    }
    if b.client_auth {
        p.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    }
    let csr = p.serialize_request(key).ok()?;
    let pem = csr.pem().ok()?;
    Some((pem, key.public_key_raw().to_vec(), exact))
}

/// Feed one input: byte 0 = 0 means the rest is text, the identity on the first line and the PEM CSR after it
/// (how the seeds are written); otherwise the rest is a structured input.
pub fn run(data: &[u8]) {
    let input = match data.split_first() {
        None => return,
        Some((0, rest)) => {
            let Ok(text) = std::str::from_utf8(rest) else {
                return;
            };
            let (id, csr) = text.split_once('\n').unwrap_or((text, ""));
            Input {
                ident: Ident::Text(id.to_owned()),
                csr: Csr::Pem(csr.to_owned()),
                validity_secs: 86400,
            }
        }
        Some((_, rest)) => match Input::arbitrary_take_rest(Unstructured::new(rest)) {
            Ok(input) => input,
            Err(_) => return,
        },
    };
    let wanted = match &input.ident {
        Ident::Text(s) => s.parse::<SpiffeId>(),
        Ident::Parts(td, ns, sa) => SpiffeId::new(td, ns, sa),
        Ident::Default => SpiffeId::new("cluster.local", "default", "sleep"),
    };
    let Ok(wanted) = wanted else {
        return;
    };
    let text = wanted.to_string();
    assert_eq!(
        text.parse::<SpiffeId>().as_ref(),
        Ok(&wanted),
        "{text} does not read back"
    );
    assert_eq!(
        SpiffeId::new(
            wanted.trust_domain(),
            wanted.namespace(),
            wanted.service_account()
        )
        .as_ref(),
        Ok(&wanted)
    );

    let (csr_pem, built) = match input.csr {
        Csr::Pem(s) => (s, None),
        Csr::Der(d) => (pem("CERTIFICATE REQUEST", &d), None),
        Csr::Built(b) => match build(b, &text) {
            Some((pem, key, exact)) => (pem, Some((key, exact))),
            None => return,
        },
    };
    let validity = Duration::from_secs(u64::from(input.validity_secs));
    let signed = fixture().ca.sign_csr(&wanted, &csr_pem, validity);
    let chain = match (signed, &built) {
        (Ok(chain), Some((_, false))) => {
            panic!("signed a CSR whose SANs are not exactly {text}: {chain:?}")
        }
        (Err(e), Some((_, true))) => panic!("refused a valid CSR for {text}: {e}"),
        (Ok(chain), _) => chain,
        (Err(_), _) => return,
    };
    check_leaf(
        &chain,
        &text,
        validity,
        built.as_ref().map(|(k, _)| k.as_slice()),
    );
}

fn check_leaf(chain: &[String], want: &str, validity: Duration, key: Option<&[u8]>) {
    assert_eq!(
        chain.last(),
        Some(&fixture().root_pem),
        "chain does not end at the root"
    );
    let leaf_pem = chain.first().map(String::as_bytes).unwrap_or_default();
    let (_, leaf_pem) =
        x509_parser::pem::parse_x509_pem(leaf_pem).unwrap_or_else(|e| panic!("leaf PEM: {e}"));
    let (_, leaf) = x509_parser::certificate::X509Certificate::from_der(&leaf_pem.contents)
        .unwrap_or_else(|e| panic!("leaf DER: {e}"));
    assert_eq!(
        leaf.subject().iter().count(),
        0,
        "subject {}",
        leaf.subject()
    );
    let mut sans = Vec::new();
    let mut ca = None;
    for ext in leaf.extensions() {
        match ext.parsed_extension() {
            ParsedExtension::SubjectAlternativeName(san) => {
                sans.extend(san.general_names.iter().map(|g| match g {
                    GeneralName::URI(u) => format!("URI:{u}"),
                    other => format!("{other:?}"),
                }))
            }
            ParsedExtension::BasicConstraints(bc) => ca = Some(bc.ca),
            ParsedExtension::KeyUsage(_)
            | ParsedExtension::ExtendedKeyUsage(_)
            | ParsedExtension::AuthorityKeyIdentifier(_)
            | ParsedExtension::SubjectKeyIdentifier(_) => {}
            other => panic!("unexpected extension {other:?}"),
        }
    }
    assert_eq!(sans, [format!("URI:{want}")], "issued SANs");
    assert_eq!(ca, Some(false), "basic constraints");
    let v = leaf.validity();
    let lifetime = v.not_after.timestamp() - v.not_before.timestamp();
    assert_eq!(lifetime, validity.as_secs() as i64 + 60, "lifetime");
    if let Some(key) = key {
        assert_eq!(
            leaf.public_key().subject_public_key.data.as_ref(),
            key,
            "public key"
        );
    }
}
