//! Test support (feature `testing`; tests only, never the node): a throwaway CA and server certificates, and a real CNCF distribution registry (Debian's
//! `docker-registry`) on a free loopback port with TLS, optionally behind htpasswd basic auth.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test support fails by panicking

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// A CA that signs server certificates for loopback.
#[derive(Debug)]
pub struct TestCa {
    pub pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl TestCa {
    pub fn new(name: &str) -> Self {
        let key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.distinguished_name.push(DnType::CommonName, name);
        let cert = p.self_signed(&key).unwrap();
        Self {
            pem: cert.pem(),
            issuer: Issuer::new(p, key),
        }
    }

    /// (certificate PEM, key PEM) for `127.0.0.1` and `localhost`.
    pub fn server_cert(&self) -> (String, String) {
        let key = KeyPair::generate().unwrap();
        let p =
            CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()]).unwrap();
        let cert = p.signed_by(&key, &self.issuer).unwrap();
        (cert.pem(), key.serialize_pem())
    }

    pub fn write(&self, dir: &Path) -> PathBuf {
        let p = dir.join("ca.pem");
        std::fs::write(&p, &self.pem).unwrap();
        p
    }
}

/// A free loopback port (bound and released; the registry binds it next).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A running registry; killed on drop.
pub struct Registry {
    pub addr: String,
    pub dir: tempfile::TempDir,
    child: Child,
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

/// `user:bcrypt` line from `htpasswd -Bbn` (apache2-utils).
fn htpasswd(user: &str, password: &str) -> String {
    let out = std::process::Command::new("htpasswd")
        .args(["-Bbn", user, password])
        .output()
        .expect("htpasswd (apache2-utils) must be installed: .ci/run installs it");
    assert!(out.status.success(), "htpasswd failed: {out:?}");
    String::from_utf8(out.stdout).unwrap()
}

impl Registry {
    /// Starts `docker-registry` with TLS from `ca` and, with `basic_auth`, htpasswd auth for that user.
    pub async fn start(ca: &TestCa, basic_auth: Option<(&str, &str)>) -> Registry {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = ca.server_cert();
        std::fs::write(dir.path().join("cert.pem"), cert).unwrap();
        std::fs::write(dir.path().join("key.pem"), key).unwrap();
        let auth = match basic_auth {
            Some((u, p)) => {
                std::fs::write(dir.path().join("htpasswd"), htpasswd(u, p)).unwrap();
                format!(
                    "auth:\n  htpasswd:\n    realm: weft-test\n    path: {}\n",
                    dir.path().join("htpasswd").display()
                )
            }
            None => String::new(),
        };
        // A port taken between free_port() and the registry's bind makes it exit: try another.
        for _ in 0..5 {
            let port = free_port();
            let addr = format!("127.0.0.1:{port}");
            let config = format!(
                "version: 0.1\nlog:\n  level: info\n  accesslog:\n    disabled: true\nstorage:\n  filesystem:\n    \
                 rootdirectory: {root}\n  delete:\n    enabled: true\nhttp:\n  addr: {addr}\n  tls:\n    \
                 certificate: {d}/cert.pem\n    key: {d}/key.pem\n{auth}",
                root = dir.path().join("data").display(),
                d = dir.path().display(),
            );
            let cfg = dir.path().join("config.yml");
            std::fs::write(&cfg, config).unwrap();
            let mut child = Command::new("docker-registry")
                .arg("serve")
                .arg(&cfg)
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .kill_on_drop(true)
                .spawn()
                .expect(
                    "docker-registry must be installed: .ci/run installs Debian's docker-registry",
                );
            let stderr = child.stderr.take().unwrap();
            let mut lines = BufReader::new(stderr).lines();
            let mut log = String::new();
            let ready = tokio::time::timeout(Duration::from_secs(60), async {
                while let Ok(Some(line)) = lines.next_line().await {
                    log.push_str(&line);
                    log.push('\n');
                    if line.contains("listening on") {
                        return true;
                    }
                }
                false
            })
            .await
            .unwrap_or(false);
            if ready {
                // Keep draining its log so it never blocks on a full pipe.
                tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
                return Registry { addr, dir, child };
            }
            let _ = child.start_kill();
            eprintln!("registry on {addr} did not start; log:\n{log}");
        }
        panic!("docker-registry did not start");
    }

    /// The on-disk data file of a blob (to tamper with it).
    pub fn blob_path(&self, digest: &str) -> PathBuf {
        let hex = digest.strip_prefix("sha256:").unwrap();
        self.dir
            .path()
            .join("data/docker/registry/v2/blobs/sha256")
            .join(&hex[..2])
            .join(hex)
            .join("data")
    }
}

/// An OCI client (oci-client, reqwest) that trusts `ca`.
pub fn oci_client(ca: &TestCa) -> oci_client::Client {
    oci_client::Client::new(oci_client::client::ClientConfig {
        protocol: oci_client::client::ClientProtocol::Https,
        extra_root_certificates: vec![oci_client::client::Certificate {
            encoding: oci_client::client::CertificateEncoding::Pem,
            data: ca.pem.clone().into_bytes(),
        }],
        ..Default::default()
    })
}

/// A gzipped tar holding `files`.
pub fn tar_gz(files: &[(&str, &[u8])]) -> Vec<u8> {
    use std::io::Write;
    let mut b = tar::Builder::new(Vec::new());
    for (name, data) in files {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        b.append_data(&mut h, name, *data).unwrap();
    }
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&b.into_inner().unwrap()).unwrap();
    gz.finish().unwrap()
}

/// Some bytes standing in for a module (the fetcher does not look inside).
pub fn module(tag: &str) -> Vec<u8> {
    let mut m = b"\0asm\x0d\0\x01\0".to_vec();
    m.extend_from_slice(tag.as_bytes());
    m.extend(std::iter::repeat_n(0xA5u8, 50_000));
    m
}

/// The media type of a Wasm artifact's one layer (the OCI Wasm artifact layout Istio pulls).
pub const WASM_LAYER: &str = "application/vnd.module.wasm.content.layer.v1+wasm";
/// The media type of a Wasm artifact's config.
pub const WASM_CONFIG: &str = "application/vnd.module.wasm.config.v1+json";

/// Push `m` as a Wasm artifact to `reference` (`host:port/repo:tag`); returns the manifest's digest.
pub async fn push_artifact(
    client: &oci_client::Client,
    reference: &str,
    m: &[u8],
    auth: &oci_client::secrets::RegistryAuth,
) -> String {
    use oci_client::client::{Config, ImageLayer};
    let r: oci_client::Reference = reference.parse().unwrap();
    let layers = vec![ImageLayer::new(m.to_vec(), WASM_LAYER.to_string(), None)];
    let config = Config::new(b"{}".to_vec(), WASM_CONFIG.to_string(), None);
    let resp = client.push(&r, &layers, config, auth, None).await.unwrap();
    digest_of(client, &r, auth)
        .await
        .unwrap_or_else(|| panic!("no digest for {}", resp.manifest_url))
}

/// The digest of the manifest `r` names, if the registry has it.
pub async fn digest_of(
    client: &oci_client::Client,
    r: &oci_client::Reference,
    auth: &oci_client::secrets::RegistryAuth,
) -> Option<String> {
    client.fetch_manifest_digest(r, auth).await.ok()
}
