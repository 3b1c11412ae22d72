//! How to reach one control plane: address, TLS root, token, server name, cluster id, node, reconnect backoff.

use std::path::PathBuf;
use std::time::Duration;

use crate::error::Error;
use crate::node::NodeInfo;

/// ztunnel's first reconnect delay.
pub const INITIAL_BACKOFF: Duration = Duration::from_millis(10);
/// ztunnel's longest reconnect delay.
pub const MAX_BACKOFF: Duration = Duration::from_secs(15);
/// The largest response accepted (ztunnel's limit).
pub const MAX_MESSAGE_SIZE: usize = 200 * 1024 * 1024;

/// One xDS source.
#[derive(Debug, Clone)]
pub struct SourceConfig {
    /// A short name for logs, metrics and `/config_dump` (e.g. `mesh`, `plugins`).
    pub name: String,
    /// `https://host:port` (a bare `host:port` gets `https://`, as in ztunnel). `http://` is for tests only: the
    /// token would travel in clear.
    pub address: String,
    /// PEM roots trusted for the server's certificate; re-read on every connect. Required for https.
    pub root_cert: Option<PathBuf>,
    /// Bearer token file (Kubernetes: the projected token, audience `istio-ca`), re-read on every connect. With a
    /// token, the `clusterid` header is sent too (as ztunnel does).
    pub token_file: Option<PathBuf>,
    /// TLS name to verify when it differs from the address's host.
    pub server_name: Option<String>,
    /// The `clusterid` header.
    pub cluster_id: String,
    /// The node id and metadata inputs.
    pub node: NodeInfo,
    /// First reconnect delay (doubles per failed attempt).
    pub initial_backoff: Duration,
    /// Longest reconnect delay.
    pub max_backoff: Duration,
    /// Deadline for the TCP connect and the TLS handshake.
    pub connect_timeout: Duration,
}

impl SourceConfig {
    /// A source named `name` at `address`, with ztunnel's defaults (cluster `Kubernetes`, backoff 10 ms → 15 s,
    /// 5 s connect timeout).
    pub fn new(name: impl Into<String>, address: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            address: address.into(),
            root_cert: None,
            token_file: None,
            server_name: None,
            cluster_id: "Kubernetes".into(),
            node: NodeInfo::default(),
            initial_backoff: INITIAL_BACKOFF,
            max_backoff: MAX_BACKOFF,
            connect_timeout: Duration::from_secs(5),
        }
    }

    /// The address with a scheme (`https://` added to a bare `host:port`), checked.
    pub fn uri(&self) -> Result<http::Uri, Error> {
        let with_scheme = if self.address.contains("://") {
            self.address.clone()
        } else {
            format!("https://{}", self.address)
        };
        let uri: http::Uri = with_scheme
            .parse()
            .map_err(|e| Error::Config(format!("xDS address {:?}: {e}", self.address)))?;
        match uri.scheme_str() {
            Some("https") if self.root_cert.is_none() => Err(Error::Config(format!(
                "xDS source {}: an https address needs a root certificate file to trust",
                self.name
            ))),
            Some("https" | "http") if uri.host().is_some() => Ok(uri),
            _ => Err(Error::Config(format!(
                "xDS address {:?}: expected https://host:port",
                self.address
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn bare_address_gets_https() {
        let mut c = SourceConfig::new("mesh", "istiod.istio-system.svc:15012");
        assert!(c.uri().is_err(), "https without a root is refused");
        c.root_cert = Some("/dev/null".into());
        assert_eq!(
            c.uri().unwrap().to_string(),
            "https://istiod.istio-system.svc:15012/"
        );
        c.address = "ftp://x:1".into();
        assert!(c.uri().is_err());
        c.address = "http://127.0.0.1:1".into();
        c.root_cert = None;
        assert!(c.uri().is_ok());
    }
}
