//! Fetching plugin code off the data path: `https://` URLs and OCI registries (`oci://registry/repo:tag` or
//! `@sha256:` digests, Wasm images in the formats Istio's agent pulls), verified, cached on disk by digest,
//! retried with backoff, bounded in size and time.
//!
//! What is verified: the module's sha256 when the resource names one (always, cached or not); for OCI, the
//! manifest's digest (against the reference's `@sha256:` and the registry's `Docker-Content-Digest`) and every
//! blob's digest. A cached module is re-hashed on every read. Registry auth: the bearer token challenge
//! (`WWW-Authenticate: Bearer realm=...`) and basic auth, with credentials from a docker `config.json` pull secret.
//! Nothing here touches the data path: callers run it from a control-plane task and hand the verified bytes on.

mod archive;
mod auth;
mod cache;
mod error;
mod http;
mod oci;
mod reference;
mod retry;
#[cfg(feature = "testing")]
pub mod testing;
mod tls;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

pub use error::FetchError;
pub use reference::{OciReference, Source};
pub use retry::Backoff;

/// Where the trust roots for `https://` fetches come from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Roots {
    /// The system bundle (`$SSL_CERT_FILE`, else the usual Debian, Red Hat and Alpine paths).
    #[default]
    System,
    /// A PEM file of root certificates (only these are trusted).
    File(PathBuf),
}

/// How the fetcher works. `Default` gives production values.
#[derive(Debug, Clone)]
pub struct FetchConfig {
    /// Where fetched modules are cached by digest (created 0700; refused if a symlink, not ours, or writable by
    /// others). `None`: no disk cache.
    pub cache_dir: Option<PathBuf>,
    /// A docker `config.json` with registry credentials, re-read on every fetch (a rotated secret is picked up).
    pub pull_secret: Option<PathBuf>,
    /// Trust roots for https.
    pub roots: Roots,
    /// Largest module (and OCI layer) accepted, in bytes.
    pub max_bytes: u64,
    /// Largest OCI manifest or token response accepted, in bytes.
    pub max_manifest_bytes: u64,
    /// Time one attempt (every request it makes) may take, unless the resource sets its own.
    pub timeout: Duration,
    /// Retries after a failed attempt (connection errors, timeouts, 5xx, 429), unless the resource sets its own.
    pub retries: u32,
    /// Backoff between attempts, unless the resource sets its own.
    pub backoff: Backoff,
}

impl Default for FetchConfig {
    fn default() -> Self {
        Self {
            cache_dir: None,
            pull_secret: None,
            roots: Roots::System,
            max_bytes: 64 << 20,
            max_manifest_bytes: 4 << 20,
            timeout: Duration::from_secs(30),
            retries: 3,
            backoff: Backoff {
                base: Duration::from_millis(500),
                max: Duration::from_secs(10),
            },
        }
    }
}

/// One fetch: where from, what to expect, and the resource's own limits.
#[derive(Debug, Clone, Default)]
pub struct Request {
    /// `https://...` or `oci://registry/repo[:tag][@sha256:...]`.
    pub uri: String,
    /// Expected lowercase hex sha256 of the module (verified; also the cache key that avoids the network).
    pub sha256: Option<String>,
    /// Time for one attempt (`HttpUri.timeout`).
    pub timeout: Option<Duration>,
    /// Retries (`RetryPolicy.num_retries`).
    pub retries: Option<u32>,
    /// Backoff (`RetryPolicy.retry_back_off`).
    pub backoff: Option<Backoff>,
    /// A docker `config.json` that came with the resource (Istio's `ISTIO_META_WASM_IMAGE_PULL_SECRET`); used
    /// before the node's configured pull secret.
    pub pull_secret: Option<Vec<u8>>,
}

impl Request {
    /// A request for `uri` with nothing else set.
    pub fn new(uri: impl Into<String>) -> Self {
        Self {
            uri: uri.into(),
            ..Self::default()
        }
    }

    /// The same request expecting this sha256.
    pub fn with_sha256(mut self, sha256: impl Into<String>) -> Self {
        self.sha256 = Some(sha256.into());
        self
    }
}

/// A fetched, verified module.
#[derive(Debug, Clone)]
pub struct Fetched {
    /// The module's bytes.
    pub bytes: Arc<Vec<u8>>,
    /// Their lowercase hex sha256.
    pub sha256: String,
    /// For OCI: the manifest's digest (`sha256:...`).
    pub manifest_digest: Option<String>,
    /// Served from the disk cache without touching the network.
    pub from_cache: bool,
    /// Attempts it took (1 when the first one succeeded; 0 from the cache).
    pub attempts: u32,
}

/// Fetches and caches plugin code. Cheap to share.
#[derive(Debug, Clone)]
pub struct Fetcher {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    config: FetchConfig,
    http: http::Client,
    cache: Option<cache::DiskCache>,
}

/// Lowercase hex sha256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(bytes))
}

impl Fetcher {
    /// Loads the trust roots and opens (creating) the cache directory.
    pub fn new(config: FetchConfig) -> Result<Self, FetchError> {
        let tls = tls::client_config(&config.roots)?;
        let cache = match &config.cache_dir {
            Some(dir) => Some(cache::DiskCache::open(dir)?),
            None => None,
        };
        Ok(Self {
            inner: Arc::new(Inner {
                http: http::Client::new(tls),
                cache,
                config,
            }),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &FetchConfig {
        &self.inner.config
    }

    /// Fetches, verifies and caches the module `req` names. A module the cache holds under the expected sha256
    /// (or, for an OCI digest reference, under the manifest digest) is returned without touching the network.
    pub async fn fetch(&self, req: &Request) -> Result<Fetched, FetchError> {
        let source = Source::parse(&req.uri)?;
        let expected = match &req.sha256 {
            Some(s) if !s.trim().is_empty() => Some(normalize_sha256(s)?),
            _ => None,
        };
        if let Some(hit) = self.lookup_cache(&source, expected.as_deref()) {
            tracing::debug!(uri = %req.uri, sha256 = %hit.sha256, "plugin code from the disk cache");
            return Ok(hit);
        }
        let policy = retry::Policy {
            retries: req.retries.unwrap_or(self.inner.config.retries),
            backoff: req.backoff.unwrap_or(self.inner.config.backoff),
        };
        let timeout = req.timeout.unwrap_or(self.inner.config.timeout);
        let (mut fetched, attempts) = policy
            .run(&req.uri, || async {
                match tokio::time::timeout(timeout, self.attempt(&source, req)).await {
                    Ok(r) => r,
                    Err(_) => Err(FetchError::Timeout {
                        url: req.uri.clone(),
                        after: timeout,
                    }),
                }
            })
            .await?;
        fetched.attempts = attempts;
        if let Some(expected) = &expected
            && *expected != fetched.sha256
        {
            return Err(FetchError::Sha256Mismatch {
                uri: req.uri.clone(),
                expected: expected.clone(),
                actual: fetched.sha256,
            });
        }
        if let Some(cache) = &self.inner.cache {
            if let Err(e) = cache.put_module(&fetched.sha256, &fetched.bytes) {
                tracing::warn!(error = %e, uri = %req.uri, "cannot write the plugin code cache");
            } else if let (Source::Oci(r), Some(d)) = (&source, &fetched.manifest_digest)
                && r.digest.is_some()
                && let Err(e) = cache.put_manifest_link(d, &fetched.sha256)
            {
                tracing::warn!(error = %e, uri = %req.uri, "cannot write the plugin code cache");
            }
        }
        tracing::info!(uri = %req.uri, sha256 = %fetched.sha256, bytes = fetched.bytes.len(),
            attempts = fetched.attempts, "plugin code fetched");
        Ok(fetched)
    }

    fn lookup_cache(&self, source: &Source, expected: Option<&str>) -> Option<Fetched> {
        let cache = self.inner.cache.as_ref()?;
        let manifest_digest = match source {
            Source::Oci(r) => r.digest.clone(),
            Source::Https(_) => None,
        };
        let sha = match (expected, &manifest_digest) {
            (Some(sha), _) => sha.to_string(),
            (None, Some(d)) => cache.manifest_link(d)?,
            (None, None) => return None,
        };
        let bytes = cache.module(&sha)?;
        Some(Fetched {
            bytes: Arc::new(bytes),
            sha256: sha,
            manifest_digest,
            from_cache: true,
            attempts: 0,
        })
    }

    async fn attempt(&self, source: &Source, req: &Request) -> Result<Fetched, FetchError> {
        let limit = self.inner.config.max_bytes;
        match source {
            Source::Https(uri) => {
                let resp = self
                    .inner
                    .http
                    .get(uri, http::Headers::new(), limit)
                    .await?;
                if !resp.status.is_success() {
                    return Err(FetchError::status(uri.to_string(), &resp));
                }
                let sha256 = sha256_hex(&resp.body);
                Ok(Fetched {
                    bytes: Arc::new(resp.body.to_vec()),
                    sha256,
                    manifest_digest: None,
                    from_cache: false,
                    attempts: 1,
                })
            }
            Source::Oci(r) => {
                let creds = auth::credentials_for(
                    &r.registry,
                    req.pull_secret.as_deref(),
                    self.inner.config.pull_secret.as_deref(),
                )?;
                let pulled = oci::pull(
                    &self.inner.http,
                    r,
                    creds,
                    limit,
                    self.inner.config.max_manifest_bytes,
                )
                .await?;
                let sha256 = sha256_hex(&pulled.module);
                Ok(Fetched {
                    bytes: Arc::new(pulled.module),
                    sha256,
                    manifest_digest: Some(pulled.manifest_digest),
                    from_cache: false,
                    attempts: 1,
                })
            }
        }
    }
}

/// `sha256:` prefix dropped, lowercase, 64 hex digits.
fn normalize_sha256(s: &str) -> Result<String, FetchError> {
    let s = s.trim();
    let s = s.strip_prefix("sha256:").unwrap_or(s).to_ascii_lowercase();
    if s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit()) {
        Ok(s)
    } else {
        Err(FetchError::BadSha256(s))
    }
}
