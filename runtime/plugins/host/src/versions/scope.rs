//! Which connections a policy plugin version is asked about: its answer to the optional `authorize-scope` export,
//! kept in the form the data path checks, and the check.

use std::collections::HashSet;

use weft_hooks::ConnectionRecord;

use crate::wit::bindings::types as wit;

/// A policy plugin version's scope. It is fixed for the version: a new config or new state makes a new version,
/// which asks again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Scope {
    /// Every connection the spec selects (also what a plugin without `authorize-scope` gets).
    All,
    /// Connections to these destinations only.
    Destinations {
        namespaces: HashSet<String>,
        policies: HashSet<String>,
        unknown_destination: bool,
    },
}

impl Scope {
    /// The scope a plugin declared (`None`: it does not export `authorize-scope`).
    pub fn declared(s: Option<wit::ConnectionScope>) -> Self {
        match s {
            None | Some(wit::ConnectionScope::All) => Scope::All,
            Some(wit::ConnectionScope::Destinations(d)) => Scope::Destinations {
                namespaces: d.namespaces.into_iter().collect(),
                policies: d.policies.into_iter().collect(),
                unknown_destination: d.unknown_destination,
            },
        }
    }

    /// Whether no connection is in the scope (a policy plugin with no policy to enforce on this node).
    pub fn is_empty(&self) -> bool {
        match self {
            Scope::All => false,
            Scope::Destinations {
                namespaces,
                policies,
                unknown_destination,
            } => namespaces.is_empty() && policies.is_empty() && !unknown_destination,
        }
    }

    /// Whether the plugin must be asked about `conn`.
    pub fn covers(&self, conn: &ConnectionRecord) -> bool {
        match self {
            Scope::All => true,
            Scope::Destinations {
                namespaces,
                policies,
                unknown_destination,
            } => match &conn.dst_workload {
                None => *unknown_destination,
                Some(w) => {
                    (!namespaces.is_empty() && namespaces.contains(&w.namespace))
                        || (!policies.is_empty()
                            && w.authorization_policies
                                .iter()
                                .any(|p| policies.contains(p)))
                }
            },
        }
    }

    /// For `/config_dump`: `all`, or what the destinations are.
    pub fn describe(&self) -> String {
        match self {
            Scope::All => "all".to_string(),
            Scope::Destinations {
                namespaces,
                policies,
                unknown_destination,
            } => {
                let sorted = |s: &HashSet<String>| {
                    let mut v: Vec<&str> = s.iter().map(String::as_str).collect();
                    v.sort_unstable();
                    v.join(",")
                };
                format!(
                    "namespaces=[{}] policies=[{}] unknown_destination={unknown_destination}",
                    sorted(namespaces),
                    sorted(policies)
                )
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test code: a panic fails the test

    use std::sync::Arc;

    use super::*;
    use crate::testing::{conn, workload};

    fn to(ns: &str, policies: &[&str]) -> ConnectionRecord {
        let mut w = (*workload("server", ns, "backend")).clone();
        w.authorization_policies = policies.iter().map(|p| p.to_string()).collect();
        ConnectionRecord {
            dst_workload: Some(Arc::new(w)),
            ..conn(8080, None)
        }
    }

    fn destinations(namespaces: &[&str], policies: &[&str], unknown: bool) -> Scope {
        Scope::declared(Some(wit::ConnectionScope::Destinations(
            wit::DestinationScope {
                namespaces: namespaces.iter().map(|s| s.to_string()).collect(),
                policies: policies.iter().map(|s| s.to_string()).collect(),
                unknown_destination: unknown,
            },
        )))
    }

    /// A plugin without the export, or one that says `all`, is asked about everything.
    #[test]
    fn all_covers_every_connection() {
        for s in [
            Scope::declared(None),
            Scope::declared(Some(wit::ConnectionScope::All)),
        ] {
            assert_eq!(s, Scope::All);
            assert!(s.covers(&to("shop", &[])));
            assert!(s.covers(&conn(80, None)));
        }
    }

    /// Destinations are matched by namespace, by a listed policy, and (when asked) with no destination workload;
    /// nothing else is covered.
    #[test]
    fn destinations_cover_their_namespaces_policies_and_the_unknown_when_asked() {
        let s = destinations(&["shop"], &["bank/vault-only"], false);
        assert!(s.covers(&to("shop", &[])));
        assert!(s.covers(&to("bank", &["bank/other", "bank/vault-only"])));
        assert!(!s.covers(&to("bank", &["bank/other"])));
        assert!(!s.covers(&to("other", &[])));
        let unknown = ConnectionRecord {
            dst_workload: None,
            ..conn(80, None)
        };
        assert!(!s.covers(&unknown));
        assert!(destinations(&[], &[], true).covers(&unknown));
        let nothing = destinations(&[], &[], false);
        assert!(!nothing.covers(&to("shop", &["shop/any"])));
        assert_eq!(
            nothing.describe(),
            "namespaces=[] policies=[] unknown_destination=false"
        );
        assert_eq!(
            destinations(&["b", "a"], &[], false).describe(),
            "namespaces=[a,b] policies=[] unknown_destination=false"
        );
    }
}
