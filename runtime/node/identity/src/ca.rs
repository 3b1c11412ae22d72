//! Certificate authorities behind one trait. `LocalCa` signs with a root (or intermediate) key from disk, for a
//! standalone node or a dev mesh; the Istio CA protocol client implements the same trait.

use std::fmt::Debug;
use std::path::Path;
use std::time::{Duration, SystemTime};

use futures_util::future::BoxFuture;

use crate::Error;
use crate::spiffe::SpiffeId;

/// A request for one identity's certificate.
#[derive(Debug, Clone)]
pub struct CertRequest {
    /// The identity wanted (the CSR's only SAN).
    pub identity: SpiffeId,
    /// PEM CSR.
    pub csr_pem: String,
    /// Requested lifetime.
    pub validity: Duration,
}

/// A signed chain as PEM, leaf first; the last element may be the root.
#[derive(Debug, Clone)]
pub struct IssuedChain {
    /// PEM certificates, leaf first.
    pub chain_pem: Vec<String>,
    /// Roots the CA says to trust (PEM). May be empty when unchanged.
    pub roots_pem: Vec<String>,
}

/// Something that signs CSRs for workload identities.
pub trait CaClient: Send + Sync + Debug + 'static {
    /// Ask for a certificate. Implementations return an error rather than a certificate for another identity.
    fn sign<'a>(&'a self, req: &'a CertRequest) -> BoxFuture<'a, Result<IssuedChain, Error>>;
    /// The trust roots (PEM) known now.
    fn trust_roots(&self) -> Vec<String>;
}

/// A CA in-process: signs with a CA certificate and key read from disk. Certificates it issues never touch disk.
pub struct LocalCa {
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
    ca_pem: String,
    roots_pem: Vec<String>,
}

impl Debug for LocalCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalCa").finish_non_exhaustive()
    }
}

impl LocalCa {
    /// Load a CA certificate and key (PEM). `roots` are the trust anchors to hand out: the CA certificate itself
    /// when it is a root; the root of its chain when it is an intermediate.
    pub fn from_pem(
        ca_cert_pem: &str,
        ca_key_pem: &str,
        roots: Vec<String>,
    ) -> Result<Self, Error> {
        let key =
            rcgen::KeyPair::from_pem(ca_key_pem).map_err(|e| Error::Ca(format!("CA key: {e}")))?;
        let issuer = rcgen::Issuer::from_ca_cert_pem(ca_cert_pem, key)
            .map_err(|e| Error::Ca(format!("CA certificate: {e}")))?;
        let roots_pem = if roots.is_empty() {
            vec![ca_cert_pem.to_owned()]
        } else {
            roots
        };
        Ok(Self {
            issuer,
            ca_pem: ca_cert_pem.to_owned(),
            roots_pem,
        })
    }

    /// Load `root-cert.pem` and `root-key.pem` (and `cert-chain.pem` / `ca-cert.pem` + `ca-key.pem` for an
    /// intermediate, as Istio's `cacerts` secret lays them out) from a directory. The key file must be readable by
    /// its owner only ([`read_private_key`]): a CA key others can read is refused, naming the file and the fix.
    pub fn from_dir(dir: &Path) -> Result<Self, Error> {
        let read = |name: &str| {
            std::fs::read_to_string(dir.join(name))
                .map_err(|e| Error::Ca(format!("reading {}: {e}", dir.join(name).display())))
        };
        if dir.join("ca-cert.pem").exists() {
            let root = read("root-cert.pem")?;
            let key = read_private_key(&dir.join("ca-key.pem"))?;
            Self::from_pem(&read("ca-cert.pem")?, &key, vec![root])
        } else {
            let key = read_private_key(&dir.join("root-key.pem"))?;
            Self::from_pem(&read("root-cert.pem")?, &key, vec![])
        }
    }

    /// Sign a CSR for `identity` directly (used by the trait, by the reference CA server and tests).
    pub fn sign_csr(
        &self,
        identity: &SpiffeId,
        csr_pem: &str,
        validity: Duration,
    ) -> Result<Vec<String>, Error> {
        self.sign_csr_at(identity, csr_pem, validity, SystemTime::now())
    }

    /// [`LocalCa::sign_csr`] with the signing time given: validity runs from `now` (back-dated 60 s for clock
    /// skew). Tests that drive time with a paused clock issue certificates on that clock.
    pub fn sign_csr_at(
        &self,
        identity: &SpiffeId,
        csr_pem: &str,
        validity: Duration,
        now: SystemTime,
    ) -> Result<Vec<String>, Error> {
        let csr = rcgen::CertificateSigningRequestParams::from_pem(csr_pem)
            .map_err(|e| Error::Ca(format!("bad CSR: {e}")))?;
        let want = identity.to_string();
        let sans: Vec<String> = csr
            .params
            .subject_alt_names
            .iter()
            .map(|s| match s {
                rcgen::SanType::URI(u) => u.as_str().to_owned(),
                other => format!("{other:?}"),
            })
            .collect();
        if sans != [want.clone()] {
            return Err(Error::Ca(format!(
                "CSR must carry exactly the SAN {want}, it carries {sans:?}"
            )));
        }
        self.sign_params(csr, identity, validity, now)
    }

    /// Sign the CSR's key for `san`, whatever SANs the CSR asks for. Only for fault injection (a CA that answers
    /// with the wrong identity) and tests; [`LocalCa::sign_csr`] is the checked path.
    pub fn sign_csr_with_san(
        &self,
        san: &SpiffeId,
        csr_pem: &str,
        validity: Duration,
    ) -> Result<Vec<String>, Error> {
        let csr = rcgen::CertificateSigningRequestParams::from_pem(csr_pem)
            .map_err(|e| Error::Ca(format!("bad CSR: {e}")))?;
        self.sign_params(csr, san, validity, SystemTime::now())
    }

    fn sign_params(
        &self,
        mut csr: rcgen::CertificateSigningRequestParams,
        san: &SpiffeId,
        validity: Duration,
        now: SystemTime,
    ) -> Result<Vec<String>, Error> {
        let p = &mut csr.params;
        p.not_before = (now - Duration::from_secs(60)).into();
        p.not_after = (now + validity).into();
        p.serial_number = Some(rcgen::SerialNumber::from_slice(&rand::random::<[u8; 16]>()));
        p.distinguished_name = rcgen::DistinguishedName::new();
        p.subject_alt_names = vec![rcgen::SanType::URI(
            rcgen::string::Ia5String::try_from(san.to_string()).map_err(Error::rcgen)?,
        )];
        p.is_ca = rcgen::IsCa::ExplicitNoCa;
        p.key_usages = vec![
            rcgen::KeyUsagePurpose::DigitalSignature,
            rcgen::KeyUsagePurpose::KeyEncipherment,
        ];
        p.extended_key_usages = vec![
            rcgen::ExtendedKeyUsagePurpose::ServerAuth,
            rcgen::ExtendedKeyUsagePurpose::ClientAuth,
        ];
        p.use_authority_key_identifier_extension = true;
        let leaf = csr
            .signed_by(&self.issuer)
            .map_err(|e| Error::Ca(format!("signing: {e}")))?;
        let mut chain = vec![leaf.pem()];
        if !self.roots_pem.contains(&self.ca_pem) {
            chain.push(self.ca_pem.clone());
        }
        // As istiod answers: the whole root bundle as one last element (several roots during a rotation).
        let mut bundle = String::new();
        for root in &self.roots_pem {
            bundle.push_str(root.trim_end());
            bundle.push('\n');
        }
        chain.push(bundle);
        Ok(chain)
    }
}

impl LocalCa {
    /// Issue a TLS server certificate for DNS names and IP addresses (a CA's or a control plane's own serving
    /// certificate, for dev meshes and tests): returns (chain PEM: leaf, then intermediates; key PEM).
    pub fn issue_server_cert(
        &self,
        names: &[String],
        validity: Duration,
    ) -> Result<(String, String), Error> {
        let key =
            rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(Error::rcgen)?;
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).map_err(Error::rcgen)?;
        for n in names {
            p.subject_alt_names
                .push(match n.parse::<std::net::IpAddr>() {
                    Ok(ip) => rcgen::SanType::IpAddress(ip),
                    Err(_) => rcgen::SanType::DnsName(
                        rcgen::string::Ia5String::try_from(n.as_str()).map_err(Error::rcgen)?,
                    ),
                });
        }
        let mut dn = rcgen::DistinguishedName::new();
        dn.push(
            rcgen::DnType::CommonName,
            names.first().map_or("weft", String::as_str),
        );
        p.distinguished_name = dn;
        let now = SystemTime::now();
        p.not_before = (now - Duration::from_secs(60)).into();
        p.not_after = (now + validity).into();
        p.serial_number = Some(rcgen::SerialNumber::from_slice(&rand::random::<[u8; 16]>()));
        p.is_ca = rcgen::IsCa::ExplicitNoCa;
        p.key_usages = vec![rcgen::KeyUsagePurpose::DigitalSignature];
        p.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
        p.use_authority_key_identifier_extension = true;
        let cert = p.signed_by(&key, &self.issuer).map_err(Error::rcgen)?;
        let mut chain = cert.pem();
        if !self.roots_pem.contains(&self.ca_pem) {
            chain.push_str(&self.ca_pem);
        }
        Ok((chain, key.serialize_pem()))
    }
}

impl CaClient for LocalCa {
    fn sign<'a>(&'a self, req: &'a CertRequest) -> BoxFuture<'a, Result<IssuedChain, Error>> {
        Box::pin(async move {
            Ok(IssuedChain {
                chain_pem: self.sign_csr(&req.identity, &req.csr_pem, req.validity)?,
                roots_pem: self.roots_pem.clone(),
            })
        })
    }

    fn trust_roots(&self) -> Vec<String> {
        self.roots_pem.clone()
    }
}

/// Generate a self-signed development root for `trust_domain`: returns (certificate PEM, key PEM).
pub fn generate_root(trust_domain: &str, validity: Duration) -> Result<(String, String), Error> {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(Error::rcgen)?;
    let mut p = rcgen::CertificateParams::default();
    let mut dn = rcgen::DistinguishedName::new();
    dn.push(rcgen::DnType::OrganizationName, trust_domain);
    dn.push(rcgen::DnType::CommonName, "weft development root");
    p.distinguished_name = dn;
    p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    p.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::CrlSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    let now = SystemTime::now();
    p.not_before = (now - Duration::from_secs(60)).into();
    p.not_after = (now + validity).into();
    p.serial_number = Some(rcgen::SerialNumber::from_slice(&rand::random::<[u8; 16]>()));
    let cert = p.self_signed(&key).map_err(Error::rcgen)?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// Read a CA private key (PEM), refusing one that group or others may read: the error names the file, its mode
/// and the fix (`chmod 600`). The mode is checked on the opened file (a symlink, as in a Kubernetes secret mount,
/// is judged by its target), so what is checked is what is read.
pub fn read_private_key(path: &Path) -> Result<String, Error> {
    use std::io::Read;
    let mut file = std::fs::File::open(path)
        .map_err(|e| Error::Ca(format!("reading {}: {e}", path.display())))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = file
            .metadata()
            .map_err(|e| Error::Ca(format!("reading {}: {e}", path.display())))?
            .permissions()
            .mode()
            & 0o7777;
        if mode & 0o077 != 0 {
            return Err(Error::Ca(format!(
                "{path} has mode {mode:04o}: a CA private key must be readable by its owner only, and group or \
                 others may access this one (anyone who reads it can mint any identity in the mesh); fix it with \
                 `chmod 600 {path}`",
                path = path.display()
            )));
        }
    }
    let mut key = String::new();
    file.read_to_string(&mut key)
        .map_err(|e| Error::Ca(format!("reading {}: {e}", path.display())))?;
    Ok(key)
}

/// Create `path` (which must not exist, not even as a symlink) with `mode` from the start, and write `bytes`.
fn write_new(path: &Path, bytes: &[u8], mode: u32) -> Result<(), Error> {
    use std::io::Write;
    let mut opts = std::fs::OpenOptions::new();
    // `create_new` is O_CREAT|O_EXCL: it fails on any existing path, a symlink included (never followed).
    opts.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut opts, mode);
    #[cfg(not(unix))]
    let _ = mode;
    let mut file = opts.open(path).map_err(|e| {
        if e.kind() == std::io::ErrorKind::AlreadyExists {
            Error::Ca(format!(
                "{} already exists: refusing to overwrite it or write through it (remove it, or write the CA to \
                 a new directory)",
                path.display()
            ))
        } else {
            Error::Ca(format!("creating {}: {e}", path.display()))
        }
    })?;
    file.write_all(bytes)
        .and_then(|()| file.sync_all())
        .map_err(|e| Error::Ca(format!("writing {}: {e}", path.display())))
}

/// Write a development root into `dir` as `root-cert.pem` and `root-key.pem`. The key file is created readable by
/// its owner only (mode 0600 at creation, whatever the umask, never chmod-ed afterwards, so there is no moment at
/// which others could open it). Neither file may exist yet: an existing CA is never overwritten, and a symlink
/// planted in its place is not followed.
pub fn write_root(dir: &Path, trust_domain: &str, validity: Duration) -> Result<(), Error> {
    let (cert, key) = generate_root(trust_domain, validity)?;
    std::fs::create_dir_all(dir)
        .map_err(|e| Error::Ca(format!("creating {}: {e}", dir.display())))?;
    let (key_path, cert_path) = (dir.join("root-key.pem"), dir.join("root-cert.pem"));
    for p in [&key_path, &cert_path] {
        if p.symlink_metadata().is_ok() {
            return Err(Error::Ca(format!(
                "{} already exists: refusing to overwrite a CA (remove it, or write the CA to a new directory)",
                p.display()
            )));
        }
    }
    write_new(&key_path, key.as_bytes(), 0o600)?;
    write_new(&cert_path, cert.as_bytes(), 0o644)
}
