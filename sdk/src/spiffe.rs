//! SPIFFE identities as Istio uses them: `spiffe://<trust-domain>/ns/<namespace>/sa/<service-account>`.
//!
//! ```
//! use weft_plugin_sdk::spiffe::SpiffeId;
//! let id: SpiffeId = "spiffe://cluster.local/ns/shop/sa/frontend".parse().unwrap();
//! assert_eq!((id.namespace(), id.service_account()), ("shop", "frontend"));
//! assert_eq!(id.to_string(), "spiffe://cluster.local/ns/shop/sa/frontend");
//! ```

use std::fmt;
use std::str::FromStr;

/// A parsed Istio SPIFFE identity.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SpiffeId {
    trust_domain: String,
    namespace: String,
    service_account: String,
}

/// Why a string is not an Istio SPIFFE identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpiffeError(pub String);

impl fmt::Display for SpiffeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SpiffeError {}

impl SpiffeId {
    /// An identity from its parts.
    pub fn new(trust_domain: &str, namespace: &str, service_account: &str) -> Self {
        Self {
            trust_domain: trust_domain.to_string(),
            namespace: namespace.to_string(),
            service_account: service_account.to_string(),
        }
    }
    /// The trust domain (`cluster.local`).
    pub fn trust_domain(&self) -> &str {
        &self.trust_domain
    }
    /// The namespace.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }
    /// The service account.
    pub fn service_account(&self) -> &str {
        &self.service_account
    }
}

impl FromStr for SpiffeId {
    type Err = SpiffeError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || SpiffeError(format!("not an Istio SPIFFE identity: `{s}`"));
        let rest = s.strip_prefix("spiffe://").ok_or_else(err)?;
        let mut parts = rest.split('/');
        let (Some(td), Some("ns"), Some(ns), Some("sa"), Some(sa), None) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) else {
            return Err(err());
        };
        if td.is_empty() || ns.is_empty() || sa.is_empty() {
            return Err(err());
        }
        Ok(Self::new(td, ns, sa))
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
