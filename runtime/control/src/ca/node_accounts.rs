//! Trusted node-agent accounts: the service accounts (`namespace/name`) that may ask for a certificate for another
//! identity than their own (impersonation), and then only for an identity a workload on their own node has. This
//! is istiod's `CA_TRUSTED_NODE_ACCOUNTS` (which ztunnel's installation sets to `istio-system/ztunnel`); an empty
//! set allows no impersonation at all, so a caller may only obtain its own identity.

use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;

use weft_identity::SpiffeId;

/// Why a `--trusted-node-accounts` entry was not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NodeAccountError {
    /// An empty entry (`a/b,,c/d`, or an empty flag value).
    #[error("empty entry: give a service account as namespace/name")]
    Empty,
    /// No `/`, or more than one.
    #[error("{0:?} is not namespace/name (one '/', e.g. weft-system/weft)")]
    Shape(String),
    /// A namespace or name Kubernetes would not accept.
    #[error(
        "{part} {value:?} in {entry:?} is not a Kubernetes name (lowercase letters, digits, '-' and '.'; at most 253 characters; starts and ends with a letter or digit)"
    )]
    Name {
        /// `namespace` or `service account name`.
        part: &'static str,
        /// The offending part.
        value: String,
        /// The whole entry.
        entry: String,
    },
}

/// One service account, `namespace/name`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NodeAccount {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
}

fn valid_name(s: &str) -> bool {
    let ends_ok = |c: Option<char>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    !s.is_empty()
        && s.len() <= 253
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
        && ends_ok(s.chars().next())
        && ends_ok(s.chars().last())
}

impl FromStr for NodeAccount {
    type Err = NodeAccountError;

    fn from_str(entry: &str) -> Result<Self, Self::Err> {
        let entry = entry.trim();
        if entry.is_empty() {
            return Err(NodeAccountError::Empty);
        }
        let Some((namespace, name)) = entry.split_once('/') else {
            return Err(NodeAccountError::Shape(entry.to_owned()));
        };
        if name.contains('/') {
            return Err(NodeAccountError::Shape(entry.to_owned()));
        }
        for (part, value) in [("namespace", namespace), ("service account name", name)] {
            if !valid_name(value) {
                return Err(NodeAccountError::Name {
                    part,
                    value: value.to_owned(),
                    entry: entry.to_owned(),
                });
            }
        }
        Ok(Self {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        })
    }
}

impl fmt::Display for NodeAccount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// The set of trusted node-agent accounts (empty: nobody may impersonate).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TrustedNodeAccounts(BTreeSet<NodeAccount>);

impl TrustedNodeAccounts {
    /// No account is trusted: every caller may only obtain its own identity.
    pub fn none() -> Self {
        Self::default()
    }

    /// Parse `ns/sa,ns/sa,...` (every entry must be valid; an empty list is an error, since an operator who
    /// passes the flag means to trust someone).
    pub fn parse_list(list: &str) -> Result<Self, NodeAccountError> {
        list.split(',')
            .map(str::parse)
            .collect::<Result<BTreeSet<_>, _>>()
            .map(Self)
    }

    /// Whether `caller` (its identity's namespace and service account, as istiod compares them) is trusted.
    pub fn trusts(&self, caller: &SpiffeId) -> bool {
        self.0
            .iter()
            .any(|a| a.namespace == caller.namespace() && a.name == caller.service_account())
    }

    /// Whether no account is trusted.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The accounts, sorted.
    pub fn iter(&self) -> impl Iterator<Item = &NodeAccount> {
        self.0.iter()
    }
}

impl FromIterator<NodeAccount> for TrustedNodeAccounts {
    fn from_iter<I: IntoIterator<Item = NodeAccount>>(iter: I) -> Self {
        Self(iter.into_iter().collect())
    }
}

impl fmt::Display for TrustedNodeAccounts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for a in &self.0 {
            if !first {
                f.write_str(",")?;
            }
            first = false;
            write!(f, "{a}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn parses_a_list_and_matches_namespace_and_service_account() {
        let t = TrustedNodeAccounts::parse_list("istio-system/ztunnel, weft-system/weft").unwrap();
        assert_eq!(t.to_string(), "istio-system/ztunnel,weft-system/weft");
        let id = |ns, sa| SpiffeId::new("cluster.local", ns, sa).unwrap();
        assert!(t.trusts(&id("weft-system", "weft")));
        assert!(t.trusts(&id("istio-system", "ztunnel")));
        assert!(!t.trusts(&id("weft-system", "ztunnel")));
        assert!(!t.trusts(&id("default", "weft")));
        assert!(!TrustedNodeAccounts::none().trusts(&id("weft-system", "weft")));
    }

    #[test]
    fn bad_entries_are_refused_with_a_clear_error() {
        for (input, want) in [
            ("", "empty entry"),
            ("a/b,,c/d", "empty entry"),
            ("weft", "is not namespace/name"),
            ("a/b/c", "is not namespace/name"),
            ("/weft", "namespace \"\""),
            ("weft-system/", "service account name \"\""),
            ("Weft/x", "namespace \"Weft\""),
            ("ns/sa*", "service account name \"sa*\""),
            ("ns/-sa", "service account name \"-sa\""),
        ] {
            let err = TrustedNodeAccounts::parse_list(input)
                .unwrap_err()
                .to_string();
            assert!(err.contains(want), "{input:?}: {err}");
        }
    }
}
