//! The `istio-authz` plugin's engine compiled natively (the very same source file), with the conversion from the
//! state's policies and the connection records the host sees: the reference the Wasm plugin is checked against
//! in `tests/istio_authz.rs` and benchmarked against in `benches/istio_authz.rs`.
#![allow(clippy::unwrap_used)] // a test panics to fail
#![allow(dead_code)]

#[path = "../../../../../plugins/istio-authz/src/engine.rs"]
pub mod engine;
/// The SDK's hasher, which the engine's maps use (`super::hash`).
#[path = "../../../../../sdk/src/hash.rs"]
mod hash;

use engine::{
    Action, Conn, Denial, IgnoreDryRun, Index, Match, Net, Policy, SaMatch, Scope, StrMatch,
};
use ipnet::IpNet;
use weft_hooks::{ConnectionRecord, Direction};
use weft_state as state;

fn string_match(m: &state::StringMatch) -> StrMatch {
    match m {
        state::StringMatch::Exact(s) => StrMatch::Exact(s.clone()),
        state::StringMatch::Prefix(s) => StrMatch::Prefix(s.clone()),
        state::StringMatch::Suffix(s) => StrMatch::Suffix(s.clone()),
        state::StringMatch::Presence => StrMatch::Presence,
    }
}

fn strings(list: &[state::StringMatch]) -> Vec<StrMatch> {
    list.iter().map(string_match).collect()
}

fn sas(list: &[state::ServiceAccountMatch]) -> Vec<SaMatch> {
    list.iter()
        .map(|m| SaMatch {
            namespace: m.namespace.clone(),
            service_account: m.service_account.clone(),
        })
        .collect()
}

fn nets(list: &[IpNet]) -> Vec<Net> {
    list.iter()
        .map(|n| Net::new(n.addr(), n.prefix_len()))
        .collect()
}

fn policy_match(m: &state::PolicyMatch) -> Match {
    Match {
        namespaces: strings(&m.namespaces),
        not_namespaces: strings(&m.not_namespaces),
        principals: strings(&m.principals),
        not_principals: strings(&m.not_principals),
        service_accounts: sas(&m.service_accounts),
        not_service_accounts: sas(&m.not_service_accounts),
        source_ips: nets(&m.source_ips),
        not_source_ips: nets(&m.not_source_ips),
        destination_ips: nets(&m.destination_ips),
        not_destination_ips: nets(&m.not_destination_ips),
        destination_ports: m.destination_ports.clone(),
        not_destination_ports: m.not_destination_ports.clone(),
    }
}

/// The engine's form of a state policy.
pub fn convert(p: &state::Policy) -> Policy {
    Policy {
        name: p.name.clone(),
        namespace: p.namespace.clone(),
        scope: match p.scope {
            state::PolicyScope::Global => Scope::Global,
            state::PolicyScope::Namespace => Scope::Namespace,
            state::PolicyScope::WorkloadSelector => Scope::WorkloadSelector,
        },
        action: match p.action {
            state::PolicyAction::Allow => Action::Allow,
            state::PolicyAction::Deny => Action::Deny,
        },
        dry_run: p.dry_run,
        rules: p
            .rules
            .iter()
            .map(|rule| {
                rule.iter()
                    .map(|clause| clause.iter().map(policy_match).collect())
                    .collect()
            })
            .collect(),
    }
}

/// Indexes state policies natively.
pub fn index<'a>(policies: impl IntoIterator<Item = &'a state::Policy>) -> Index {
    Index::build(policies.into_iter().map(convert).collect())
}

/// The native decision on a connection record (what the plugin decides in the sandbox): `Ok` or the deny reason.
pub fn decide(index: &Index, conn: &ConnectionRecord) -> Result<(), String> {
    if conn.direction == Direction::Outbound {
        return Ok(());
    }
    let c = Conn::new(conn.src, conn.dst, conn.peer_identity.as_deref());
    let (ns, selected): (Option<&str>, &[String]) = match conn.dst_workload.as_deref() {
        Some(w) => (Some(w.namespace.as_str()), &w.authorization_policies),
        None => (None, &[]),
    };
    index
        .decide(&c, ns, selected, &mut IgnoreDryRun)
        .map_err(|d: Denial| d.to_string())
}

fn policy(
    name: &str,
    namespace: &str,
    scope: state::PolicyScope,
    action: state::PolicyAction,
    rules: Vec<Vec<Vec<state::PolicyMatch>>>,
) -> state::Policy {
    state::Policy {
        name: name.to_string(),
        namespace: namespace.to_string(),
        scope,
        action,
        dry_run: false,
        rules,
    }
}

fn principals(ns: &str, sas: &[&str]) -> Vec<state::StringMatch> {
    sas.iter()
        .map(|sa| state::StringMatch::Exact(format!("cluster.local/ns/{ns}/sa/{sa}")))
        .collect()
}

/// A mesh of `n` policies (n ≥ 10) of which exactly 10 apply to the benchmark's destination workload
/// (`server` in `shop`, selecting `shop/sel-deny` and `shop/sel-allow`): a global DENY, three namespace DENYs,
/// a selected DENY, a selected ALLOW and four namespace ALLOWs, none matching [`synthetic_conn`] but the last
/// ALLOW, so a decision evaluates all ten. The other `n - 10` are namespace policies of `n / 10` other
/// namespaces.
pub fn synthetic(n: usize) -> Vec<state::Policy> {
    use state::PolicyAction::{Allow, Deny};
    use state::PolicyScope::{Global, Namespace, WorkloadSelector};
    let m = state::PolicyMatch::default;
    let net = |s: &str| s.parse::<IpNet>().expect("cidr");
    let mut out = vec![
        policy(
            "deny-external",
            "istio-system",
            Global,
            Deny,
            vec![vec![vec![state::PolicyMatch {
                source_ips: vec![net("192.168.0.0/16"), net("172.16.0.0/12")],
                ..m()
            }]]],
        ),
        policy(
            "deny-admin-ports",
            "shop",
            Namespace,
            Deny,
            vec![vec![vec![state::PolicyMatch {
                destination_ports: vec![22, 2379, 6443],
                ..m()
            }]]],
        ),
        policy(
            "deny-batch",
            "shop",
            Namespace,
            Deny,
            vec![vec![vec![state::PolicyMatch {
                principals: principals("batch", &["cron", "etl", "report"]),
                ..m()
            }]]],
        ),
        policy(
            "deny-untrusted-ns",
            "shop",
            Namespace,
            Deny,
            vec![vec![vec![state::PolicyMatch {
                namespaces: vec![
                    state::StringMatch::Prefix("sandbox-".into()),
                    state::StringMatch::Suffix("-untrusted".into()),
                ],
                ..m()
            }]]],
        ),
        policy(
            "sel-deny",
            "shop",
            WorkloadSelector,
            Deny,
            vec![vec![vec![state::PolicyMatch {
                service_accounts: vec![state::ServiceAccountMatch {
                    namespace: "shop".into(),
                    service_account: "legacy".into(),
                }],
                ..m()
            }]]],
        ),
        policy(
            "sel-allow",
            "shop",
            WorkloadSelector,
            Allow,
            vec![vec![
                vec![state::PolicyMatch {
                    principals: principals("ops", &["prometheus", "grafana"]),
                    ..m()
                }],
                vec![state::PolicyMatch {
                    destination_ports: vec![9090],
                    ..m()
                }],
            ]],
        ),
    ];
    for (i, ns) in ["payments", "search", "catalog"].iter().enumerate() {
        out.push(policy(
            &format!("allow-{ns}"),
            "shop",
            Namespace,
            Allow,
            vec![vec![
                vec![state::PolicyMatch {
                    principals: principals(ns, &["api", "worker", "web"]),
                    ..m()
                }],
                vec![state::PolicyMatch {
                    destination_ports: vec![8080 + i as u16 + 1, 8443],
                    ..m()
                }],
            ]],
        ));
    }
    out.push(policy(
        "allow-frontend",
        "shop",
        Namespace,
        Allow,
        vec![vec![
            vec![state::PolicyMatch {
                principals: principals("shop", &["checkout", "cart", "frontend"]),
                ..m()
            }],
            vec![state::PolicyMatch {
                destination_ports: vec![8080, 8443],
                not_source_ips: vec![net("10.99.0.0/16")],
                ..m()
            }],
        ]],
    ));
    let others = (n.saturating_sub(out.len()) / 10).max(1);
    let mut i = 0;
    while out.len() < n {
        let ns = format!("team-{}", i % others);
        let action = if i % 4 == 0 { Deny } else { Allow };
        out.push(policy(
            &format!("policy-{i}"),
            &ns,
            Namespace,
            action,
            vec![vec![vec![state::PolicyMatch {
                principals: principals(&ns, &["api", "worker"]),
                destination_ports: vec![8000 + (i % 100) as u16],
                ..m()
            }]]],
        ));
        i += 1;
    }
    out
}

/// The benchmark's connection: inbound HBONE from `shop/frontend` to `server` (namespace `shop`, selecting
/// `shop/sel-deny` and `shop/sel-allow`) on port 8080; [`synthetic`] allows it after evaluating 10 policies.
pub fn synthetic_conn() -> ConnectionRecord {
    let mut meta = (*weft_plugin_host::testing::workload("server", "shop", "backend")).clone();
    meta.authorization_policies = vec!["shop/sel-deny".into(), "shop/sel-allow".into()];
    ConnectionRecord {
        dst_workload: Some(std::sync::Arc::new(meta)),
        ..weft_plugin_host::testing::conn(8080, Some("spiffe://cluster.local/ns/shop/sa/frontend"))
    }
}
