//! Unit tests of the engine: matching, ordering, and what `Index::reach` leaves out.

use super::*;

fn policy(action: Action, rules: Vec<Vec<Vec<Match>>>) -> Policy {
    Policy {
        name: "p".into(),
        namespace: "ns".into(),
        scope: Scope::Global,
        action,
        dry_run: false,
        rules,
    }
}

fn tls() -> Conn<'static> {
    Conn::new(
        "127.0.0.1:1234".parse().unwrap(),
        "127.0.0.2:8080".parse().unwrap(),
        Some("spiffe://td/ns/namespace/sa/account"),
    )
}

fn plain() -> Conn<'static> {
    Conn::new(
        "127.0.0.1:1234".parse().unwrap(),
        "127.0.0.2:8080".parse().unwrap(),
        None,
    )
}

#[test]
fn empty_shapes() {
    let m = |ms: Vec<Match>| policy(Action::Allow, vec![vec![ms]]);
    assert!(!m(vec![Match::default()]).matches(&plain()));
    assert!(m(vec![]).matches(&plain()));
    assert!(policy(Action::Allow, vec![vec![]]).matches(&plain()));
    assert!(!policy(Action::Allow, vec![]).matches(&plain()));
}

#[test]
fn principals_and_namespaces() {
    let p = |m: Match| policy(Action::Allow, vec![vec![vec![m]]]);
    let pr = p(Match {
        principals: vec![StrMatch::Exact("td/ns/namespace/sa/account".into())],
        ..Match::default()
    });
    assert!(pr.matches(&tls()) && !pr.matches(&plain()));
    let not_pr = p(Match {
        not_principals: vec![StrMatch::Presence],
        ..Match::default()
    });
    assert!(!not_pr.matches(&tls()) && not_pr.matches(&plain()));
    let ns = p(Match {
        namespaces: vec![StrMatch::Exact("namespace".into())],
        ..Match::default()
    });
    assert!(ns.matches(&tls()) && !ns.matches(&plain()));
    let sa = p(Match {
        not_service_accounts: vec![SaMatch {
            namespace: "namespace".into(),
            service_account: "account".into(),
        }],
        ..Match::default()
    });
    assert!(!sa.matches(&tls()) && sa.matches(&plain()));
}

/// Identities are split into the trust domain, namespace and service account only in Istio's exact shape.
#[test]
fn peer_identities() {
    let p = Peer::parse(Some("spiffe://td/ns/shop/sa/web"));
    assert_eq!(
        (p.principal, p.namespace, p.sa),
        (Some("td/ns/shop/sa/web"), "shop", Some(("shop", "web")))
    );
    for other in [
        "spiffe://td/ns/shop/sa/web/extra",
        "spiffe://td/ns/shop/sa/",
        "spiffe://td/ns//sa/web",
        "spiffe:///ns/shop/sa/web",
        "spiffe://td/NS/shop/sa/web",
        "spiffe://td/ns/shop/service-account/web",
        "spiffe://td/ns/shop/sa",
        "spiffe://td",
        "spiffe://",
        "spiffe://td/ns/shop/sa/web/",
        "spiffe://td//ns/shop/sa/web",
    ] {
        let p = Peer::parse(Some(other));
        assert_eq!(
            (p.principal, p.namespace, p.sa),
            (other.strip_prefix("spiffe://"), "", None),
            "{other}"
        );
    }
    for none in [
        None,
        Some("td/ns/shop/sa/web"),
        Some("SPIFFE://td/ns/a/sa/b"),
    ] {
        let p = Peer::parse(none);
        assert_eq!(
            (p.principal, p.namespace, p.sa),
            (None, "", None),
            "{none:?}"
        );
    }
}

/// `same` is byte equality at every length around its word size, wherever the first difference is.
#[test]
fn word_wise_equality() {
    for len in 0..40usize {
        let a: Vec<u8> = (0..len).map(|i| b'a' + (i % 26) as u8).collect();
        assert!(same(&a, &a.clone()), "{len}");
        for at in 0..len {
            let mut b = a.clone();
            b[at] ^= 0x20;
            assert!(!same(&a, &b), "{len} differing at {at}");
        }
        assert!(!same(&a, &a[..len.saturating_sub(1)]) || len == 0, "{len}");
    }
    let m = |x: StrMatch, s: &str| x.matches(s);
    assert!(m(StrMatch::Prefix("sandbox-".into()), "sandbox-1"));
    assert!(!m(StrMatch::Prefix("sandbox-".into()), "sandbox"));
    assert!(m(StrMatch::Suffix("-untrusted".into()), "x-untrusted"));
    assert!(!m(StrMatch::Suffix("-untrusted".into()), "untrusted"));
    assert!(m(StrMatch::Prefix(String::new()), "") && m(StrMatch::Suffix(String::new()), ""));
    assert!(m(StrMatch::Exact("abcdefghij".into()), "abcdefghij"));
    assert!(!m(StrMatch::Exact("abcdefghij".into()), "abcdefghiJ"));
}

#[test]
fn cidr() {
    let n = Net::new("10.1.0.0".parse().unwrap(), 16);
    assert!(n.contains(&Ip::from("10.1.200.3".parse::<IpAddr>().unwrap())));
    assert!(n.contains(&Ip::from("::ffff:10.1.0.9".parse::<IpAddr>().unwrap())));
    assert!(!n.contains(&Ip::from("10.2.0.1".parse::<IpAddr>().unwrap())));
    let all = Net::new("0.0.0.0".parse().unwrap(), 0);
    assert!(all.contains(&Ip::from("1.2.3.4".parse::<IpAddr>().unwrap())));
    assert!(!all.contains(&Ip::from("fd00::1".parse::<IpAddr>().unwrap())));
}

#[test]
fn order() {
    let deny = Policy {
        name: "d".into(),
        action: Action::Deny,
        scope: Scope::Namespace,
        ..policy(
            Action::Deny,
            vec![vec![vec![Match {
                destination_ports: vec![8080],
                ..Match::default()
            }]]],
        )
    };
    let allow = Policy {
        name: "a".into(),
        scope: Scope::Namespace,
        ..policy(Action::Allow, vec![vec![]])
    };
    let idx = Index::build(vec![deny, allow]);
    assert_eq!(
        idx.decide(&tls(), Some("ns"), &[], &mut IgnoreDryRun),
        Err(Denial::Explicit("ns/d".into()))
    );
    assert_eq!(
        idx.decide(&tls(), Some("other"), &[], &mut IgnoreDryRun),
        Ok(())
    );
}

/// Records whether `decide` reported anything about dry-run policies.
#[derive(Default)]
struct Seen(bool);

impl DryRun for Seen {
    fn matched(&mut self, _key: &str, _action: Action) {
        self.0 = true;
    }
    fn no_allow_matched(&mut self) {
        self.0 = true;
    }
}

/// Records what `decide` reported about dry-run policies, in order.
#[derive(Default)]
struct Log(Vec<String>);

impl DryRun for Log {
    fn matched(&mut self, key: &str, action: Action) {
        self.0.push(format!("{key} {}", action.as_str()));
    }
    fn no_allow_matched(&mut self) {
        self.0.push("no allow matched".into());
    }
}

/// What `reach` leaves out, `decide` allows with nothing to report: checked over every policy set of up to
/// two policies drawn from all scopes, actions and dry-run settings (allow-all, deny-all and never-matching
/// rules), and destinations in and out of their namespaces, listing them or not, or unknown.
#[test]
fn what_reach_leaves_out_is_allowed_with_nothing_reported() {
    let mut kinds = Vec::new();
    for (i, scope) in [Scope::Global, Scope::Namespace, Scope::WorkloadSelector]
        .into_iter()
        .enumerate()
    {
        for action in [Action::Allow, Action::Deny] {
            for dry_run in [false, true] {
                for (r, rules) in [vec![vec![]], vec![]].into_iter().enumerate() {
                    kinds.push(Policy {
                        name: format!("p{i}{}{}{r}", action.as_str(), u8::from(dry_run)),
                        namespace: if scope == Scope::Global { "root" } else { "ns" }.into(),
                        scope,
                        action,
                        dry_run,
                        rules,
                    });
                }
            }
        }
    }
    let mut sets: Vec<Vec<Policy>> = vec![vec![]];
    for a in &kinds {
        sets.push(vec![a.clone()]);
        for b in &kinds {
            sets.push(vec![a.clone(), b.clone()]);
        }
    }
    let (mut left_out, mut reached) = (0, 0);
    for set in sets {
        let keys: Vec<String> = set
            .iter()
            .map(|p| format!("{}/{}", p.namespace, p.name))
            .collect();
        let idx = Index::build(set);
        let reach = idx.reach();
        for namespace in [None, Some("ns"), Some("other")] {
            for listed in [vec![], keys.clone(), vec!["ns/unknown".to_string()]] {
                let covered = match (&reach, namespace) {
                    (Reach::Everything, _) => true,
                    (Reach::Destinations { .. }, None) => false,
                    (
                        Reach::Destinations {
                            namespaces,
                            policies,
                        },
                        Some(ns),
                    ) => {
                        namespaces.iter().any(|n| n == ns)
                            || listed.iter().any(|l| policies.contains(l))
                    }
                };
                // A destination resolved once decides as one looked up on every call, reports included.
                for conn in [tls(), plain()] {
                    let (mut looked_up, mut resolved) = (Log::default(), Log::default());
                    let target = idx.target(namespace, &listed);
                    assert_eq!(
                        idx.decide(&conn, namespace, &listed, &mut looked_up),
                        idx.decide_for(&conn, &target, &mut resolved)
                    );
                    assert_eq!(looked_up.0, resolved.0);
                }
                if covered {
                    reached += 1;
                    continue;
                }
                left_out += 1;
                for conn in [tls(), plain()] {
                    let mut seen = Seen::default();
                    let listed = if namespace.is_some() {
                        &listed[..]
                    } else {
                        &[]
                    };
                    assert_eq!(idx.decide(&conn, namespace, listed, &mut seen), Ok(()));
                    assert!(!seen.0, "a dry-run report outside the reach");
                }
            }
        }
    }
    // Both sides were exercised.
    assert!(
        left_out > 1000 && reached > 1000,
        "{left_out} left out, {reached} reached"
    );
}

/// Global policies reach everything; otherwise exactly their namespaces and keys.
#[test]
fn reach_of_global_namespace_and_selector_policies() {
    assert_eq!(
        Index::default().reach(),
        Reach::Destinations {
            namespaces: vec![],
            policies: vec![]
        }
    );
    let ns = Policy {
        scope: Scope::Namespace,
        ..policy(Action::Allow, vec![vec![]])
    };
    let sel = Policy {
        name: "s".into(),
        namespace: "shop".into(),
        scope: Scope::WorkloadSelector,
        ..policy(Action::Deny, vec![vec![]])
    };
    assert_eq!(
        Index::build(vec![ns.clone(), sel.clone()]).reach(),
        Reach::Destinations {
            namespaces: vec!["ns".into()],
            policies: vec!["ns/p".into(), "shop/s".into()]
        }
    );
    let global = Policy {
        name: "g".into(),
        ..policy(Action::Deny, vec![])
    };
    assert_eq!(
        Index::build(vec![ns, sel, global]).reach(),
        Reach::Everything
    );
}
