//! SPIFFE identities of the shape Istio uses: `spiffe://<trust-domain>/ns/<namespace>/sa/<service-account>`.

use std::fmt;
use std::str::FromStr;

/// A workload identity. Only Istio's shape is accepted; anything else is an error.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SpiffeId {
    trust_domain: String,
    namespace: String,
    service_account: String,
}

/// Why a string is not an Istio SPIFFE identity.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not an Istio SPIFFE identity ({reason}): {input:?}")]
pub struct SpiffeIdError {
    input: String,
    reason: &'static str,
}

impl SpiffeId {
    /// Build from parts; each must be non-empty and free of `/`.
    pub fn new(
        trust_domain: &str,
        namespace: &str,
        service_account: &str,
    ) -> Result<Self, SpiffeIdError> {
        let bad = |reason| SpiffeIdError {
            input: format!("spiffe://{trust_domain}/ns/{namespace}/sa/{service_account}"),
            reason,
        };
        for part in [trust_domain, namespace, service_account] {
            if part.is_empty() {
                return Err(bad("empty segment"));
            }
            if part.contains('/') || part.chars().any(char::is_whitespace) {
                return Err(bad("segment contains '/' or whitespace"));
            }
        }
        Ok(Self {
            trust_domain: trust_domain.to_owned(),
            namespace: namespace.to_owned(),
            service_account: service_account.to_owned(),
        })
    }

    /// Trust domain.
    pub fn trust_domain(&self) -> &str {
        &self.trust_domain
    }

    /// Namespace.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// Service account.
    pub fn service_account(&self) -> &str {
        &self.service_account
    }
}

impl FromStr for SpiffeId {
    type Err = SpiffeIdError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = |reason| SpiffeIdError {
            input: s.to_owned(),
            reason,
        };
        let rest = s
            .strip_prefix("spiffe://")
            .ok_or_else(|| bad("missing spiffe:// scheme"))?;
        let parts: Vec<&str> = rest.split('/').collect();
        match parts.as_slice() {
            [td, "ns", ns, "sa", sa] => Self::new(td, ns, sa).map_err(|e| SpiffeIdError {
                input: s.to_owned(),
                reason: e.reason,
            }),
            _ => Err(bad("expected spiffe://<td>/ns/<ns>/sa/<sa>")),
        }
    }
}

impl fmt::Display for SpiffeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "spiffe://{}/ns/{}/sa/{}",
            self.trust_domain, self.namespace, self.service_account
        )
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn parses_and_prints() {
        let id: SpiffeId = "spiffe://cluster.local/ns/default/sa/echo".parse().unwrap();
        assert_eq!(id.trust_domain(), "cluster.local");
        assert_eq!(id.namespace(), "default");
        assert_eq!(id.service_account(), "echo");
        assert_eq!(id.to_string(), "spiffe://cluster.local/ns/default/sa/echo");
    }

    #[test]
    fn rejects_other_shapes() {
        for s in [
            "spiffe://cluster.local/ns/default",
            "spiffe://cluster.local/ns/default/sa/echo/extra",
            "https://cluster.local/ns/default/sa/echo",
            "spiffe://cluster.local/ns//sa/echo",
            "spiffe://cluster.local/sa/default/ns/echo",
            "spiffe:///ns/a/sa/b",
        ] {
            assert!(s.parse::<SpiffeId>().is_err(), "{s} should be rejected");
        }
    }
}
