//! Why a fetch failed, and whether trying again may help.

use std::time::Duration;

/// Why plugin code could not be fetched. The message names the URI and what was wrong.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// The URI does not parse or names nothing fetchable.
    #[error("invalid plugin code URI {uri:?}: {reason}")]
    BadUri {
        /// The URI.
        uri: String,
        /// What is wrong.
        reason: String,
    },
    /// The expected sha256 is not 64 hex digits.
    #[error("invalid sha256 {0:?}: expected 64 hex digits")]
    BadSha256(String),
    /// The trust roots could not be loaded.
    #[error("cannot load the trust roots: {0}")]
    Roots(String),
    /// The cache directory is unusable.
    #[error("plugin code cache: {0}")]
    Cache(String),
    /// The pull secret could not be read or parsed.
    #[error("pull secret {source_name}: {reason}")]
    PullSecret {
        /// The file (or "the resource's pull secret").
        source_name: String,
        /// What is wrong.
        reason: String,
    },
    /// No TCP connection or TLS session.
    #[error("cannot connect to {url}: {reason}")]
    Connect {
        /// The URL.
        url: String,
        /// Why.
        reason: String,
    },
    /// The HTTP exchange broke (reset, bad response).
    #[error("HTTP request to {url} failed: {reason}")]
    Transport {
        /// The URL.
        url: String,
        /// Why.
        reason: String,
    },
    /// The server answered with an error status.
    #[error("{url} answered {status}{}", if detail.is_empty() { String::new() } else { format!(": {detail}") })]
    Status {
        /// The URL.
        url: String,
        /// The status code.
        status: u16,
        /// The start of the body (registries explain their errors there).
        detail: String,
    },
    /// An attempt ran out of time.
    #[error("fetching {url} timed out after {after:?}")]
    Timeout {
        /// The URL.
        url: String,
        /// The limit.
        after: Duration,
    },
    /// More bytes than allowed.
    #[error("{what} from {url} exceeds the limit of {limit} bytes")]
    TooLarge {
        /// What was being read.
        what: &'static str,
        /// The URL.
        url: String,
        /// The limit.
        limit: u64,
    },
    /// Too many redirects, or a redirect to something other than https.
    #[error("redirect from {url} refused: {reason}")]
    Redirect {
        /// The URL.
        url: String,
        /// Why.
        reason: String,
    },
    /// The module's sha256 is not the expected one.
    #[error("sha256 mismatch for {uri}: expected {expected}, got {actual}")]
    Sha256Mismatch {
        /// The URI.
        uri: String,
        /// Expected.
        expected: String,
        /// Computed.
        actual: String,
    },
    /// An OCI manifest or blob does not match its digest.
    #[error("OCI {what} digest mismatch at {url}: expected {expected}, got {actual}")]
    DigestMismatch {
        /// `manifest` or `blob`.
        what: &'static str,
        /// The URL.
        url: String,
        /// Expected.
        expected: String,
        /// Computed.
        actual: String,
    },
    /// The registry's auth handshake failed.
    #[error("registry {registry} auth: {reason}")]
    Auth {
        /// The registry.
        registry: String,
        /// What failed.
        reason: String,
    },
    /// The image is not a Wasm image weft understands.
    #[error("image {image}: {reason}")]
    Image {
        /// The reference.
        image: String,
        /// What is wrong.
        reason: String,
    },
    /// Every attempt failed; the last error.
    #[error("{last} (gave up after {attempts} attempts)")]
    GaveUp {
        /// Attempts made.
        attempts: u32,
        /// The last attempt's error.
        last: Box<FetchError>,
    },
}

impl FetchError {
    /// Whether another attempt may succeed (connection trouble, timeouts, 5xx, 408, 429).
    pub fn is_retryable(&self) -> bool {
        match self {
            FetchError::Connect { .. }
            | FetchError::Transport { .. }
            | FetchError::Timeout { .. } => true,
            FetchError::Status { status, .. } => *status >= 500 || *status == 408 || *status == 429,
            _ => false,
        }
    }

    pub(crate) fn status(url: String, resp: &crate::http::Response) -> Self {
        let detail = String::from_utf8_lossy(&resp.body[..resp.body.len().min(256)])
            .trim()
            .to_string();
        FetchError::Status {
            url,
            status: resp.status.as_u16(),
            detail,
        }
    }
}
