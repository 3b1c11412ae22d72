//! The node's resolvers from a resolv.conf: `nameserver` lines (port 53) and `options timeout:` / `attempts:`.
//! Search domains are not used: clients apply their own before they ask.

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::time::Duration;

/// What a resolv.conf says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvConf {
    /// The name servers, in order.
    pub nameservers: Vec<SocketAddr>,
    /// `options timeout:` (default 5 s).
    pub timeout: Duration,
    /// `options attempts:` (default 2).
    pub attempts: usize,
}

impl Default for ResolvConf {
    fn default() -> Self {
        Self {
            nameservers: Vec::new(),
            timeout: Duration::from_secs(5),
            attempts: 2,
        }
    }
}

/// Why a resolv.conf could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ResolvError {
    /// Reading it failed.
    #[error("reading {file}: {source}")]
    Read {
        /// The file.
        file: std::path::PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// It names no usable server.
    #[error("{file} has no nameserver line weft can use")]
    NoServer {
        /// The file.
        file: std::path::PathBuf,
    },
}

/// Parse resolv.conf text. Unknown lines and options are ignored, as the C library does; a nameserver that is not
/// an IP address is skipped with a warning. (`fe80::1%eth0` keeps its address and drops the zone.)
pub fn parse(text: &str) -> ResolvConf {
    let mut out = ResolvConf::default();
    for line in text.lines() {
        let line = line.split(['#', ';']).next().unwrap_or("").trim();
        let mut words = line.split_whitespace();
        match words.next() {
            Some("nameserver") => {
                let Some(v) = words.next() else { continue };
                let addr = v.split('%').next().unwrap_or(v);
                match addr.parse::<IpAddr>() {
                    Ok(ip) => out.nameservers.push(SocketAddr::new(ip, 53)),
                    Err(_) => tracing::warn!(
                        nameserver = v,
                        "resolv.conf nameserver is not an IP address; skipped"
                    ),
                }
            }
            Some("options") => {
                for o in words {
                    if let Some(v) = o
                        .strip_prefix("timeout:")
                        .and_then(|v| v.parse::<u64>().ok())
                    {
                        out.timeout = Duration::from_secs(v.clamp(1, 30));
                    } else if let Some(v) = o
                        .strip_prefix("attempts:")
                        .and_then(|v| v.parse::<usize>().ok())
                    {
                        out.attempts = v.clamp(1, 5);
                    }
                }
            }
            _ => {}
        }
    }
    out
}

/// Read and parse `path`; a file without a usable server is an error (the proxy could forward nothing).
pub fn load(path: &Path) -> Result<ResolvConf, ResolvError> {
    let text = std::fs::read_to_string(path).map_err(|source| ResolvError::Read {
        file: path.to_path_buf(),
        source,
    })?;
    let conf = parse(&text);
    if conf.nameservers.is_empty() {
        return Err(ResolvError::NoServer {
            file: path.to_path_buf(),
        });
    }
    Ok(conf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_servers_and_options() {
        let c = parse(
            "# generated\nsearch default.svc.cluster.local svc.cluster.local\nnameserver 10.96.0.10\n\
             nameserver fe80::1%eth0 ; link-local\nnameserver bogus\noptions ndots:5 timeout:3 attempts:9\n",
        );
        assert_eq!(
            c.nameservers,
            vec![
                "10.96.0.10:53".parse().unwrap(),
                "[fe80::1]:53".parse().unwrap()
            ]
        );
        assert_eq!(c.timeout, Duration::from_secs(3));
        assert_eq!(c.attempts, 5);
        assert_eq!(parse("").nameservers, vec![]);
    }
}
