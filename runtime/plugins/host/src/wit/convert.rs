//! Conversions from the data path's and the state's types into the WIT types plugins see.

use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;
use weft_hooks::{CloseRecord, ConnectionRecord, Direction, Verdict, WorkloadMeta};
use weft_state as state;

use crate::wit::bindings::types as wit;

pub(crate) fn ip(ip: IpAddr) -> wit::IpAddress {
    match ip {
        IpAddr::V4(v4) => wit::IpAddress::Ipv4(u32::from(v4)),
        IpAddr::V6(v6) => {
            let bits = u128::from(v6);
            wit::IpAddress::Ipv6(((bits >> 64) as u64, bits as u64))
        }
    }
}

fn socket(sa: SocketAddr) -> wit::SocketAddress {
    wit::SocketAddress {
        address: ip(sa.ip()),
        port: sa.port(),
    }
}

/// The scalar part of a connection (workloads travel separately).
pub(crate) fn connection(c: &ConnectionRecord) -> wit::Connection {
    wit::Connection {
        id: c.id,
        direction: direction(c.direction),
        source: socket(c.src),
        destination: socket(c.dst),
        peer_identity: c.peer_identity.as_deref().map(str::to_owned),
        destination_service: c.dst_service.clone(),
        hbone: c.hbone,
    }
}

pub(crate) fn workload_meta(w: &WorkloadMeta) -> wit::WorkloadMeta {
    wit::WorkloadMeta {
        uid: w.uid.clone(),
        name: w.name.clone(),
        namespace: w.namespace.clone(),
        service_account: w.service_account.clone(),
        trust_domain: w.trust_domain.clone(),
        node: w.node.clone(),
        workload_name: w.workload_name.clone(),
        canonical_name: w.canonical_name.clone(),
        canonical_revision: w.canonical_revision.clone(),
        cluster_id: w.cluster_id.clone(),
        region: w.region.clone(),
        zone: w.zone.clone(),
        labels: w.labels.clone(),
        authorization_policies: w.authorization_policies.clone(),
    }
}

/// A connection's fields for a `telemetry-batches` event, without its strings and workloads (the batch fills those
/// in as positions).
pub(crate) fn batch_connection(c: &ConnectionRecord) -> wit::BatchConnection {
    wit::BatchConnection {
        id: c.id,
        direction: direction(c.direction),
        source: socket(c.src),
        destination: socket(c.dst),
        peer_identity: None,
        destination_service: None,
        hbone: c.hbone,
        source_workload: None,
        destination_workload: None,
    }
}

/// How a connection ended, for a `telemetry-batches` event, without its strings (the batch fills those in as
/// positions).
pub(crate) fn batch_close(close: &CloseRecord) -> wit::BatchClose {
    wit::BatchClose {
        bytes_sent: close.bytes_sent,
        bytes_received: close.bytes_received,
        duration_ns: duration_ns(close),
        verdict: verdict(&close.verdict),
        error: None,
        response_flags: 0,
    }
}

fn duration_ns(close: &CloseRecord) -> u64 {
    close.duration.as_nanos().min(u128::from(u64::MAX)) as u64
}

fn verdict(v: &Verdict) -> wit::Verdict {
    match v {
        Verdict::Allow => wit::Verdict::Allow,
        Verdict::Deny { by, reason } => wit::Verdict::Deny((by.clone(), reason.clone())),
    }
}

fn direction(d: Direction) -> wit::Direction {
    match d {
        Direction::Inbound => wit::Direction::Inbound,
        Direction::Outbound => wit::Direction::Outbound,
    }
}

fn string_match(m: &state::StringMatch) -> wit::StringMatch {
    match m {
        state::StringMatch::Exact(s) => wit::StringMatch::Exact(s.clone()),
        state::StringMatch::Prefix(s) => wit::StringMatch::Prefix(s.clone()),
        state::StringMatch::Suffix(s) => wit::StringMatch::Suffix(s.clone()),
        state::StringMatch::Presence => wit::StringMatch::Presence,
    }
}

fn sa_match(m: &state::ServiceAccountMatch) -> wit::ServiceAccountMatch {
    wit::ServiceAccountMatch {
        namespace: m.namespace.clone(),
        service_account: m.service_account.clone(),
    }
}

fn cidr(n: &IpNet) -> wit::Cidr {
    wit::Cidr {
        address: ip(n.addr()),
        prefix_len: n.prefix_len(),
    }
}

fn policy_match(m: &state::PolicyMatch) -> wit::PolicyMatch {
    let sm = |v: &[state::StringMatch]| v.iter().map(string_match).collect();
    let sa = |v: &[state::ServiceAccountMatch]| v.iter().map(sa_match).collect();
    let ips = |v: &[IpNet]| v.iter().map(cidr).collect();
    wit::PolicyMatch {
        namespaces: sm(&m.namespaces),
        not_namespaces: sm(&m.not_namespaces),
        principals: sm(&m.principals),
        not_principals: sm(&m.not_principals),
        service_accounts: sa(&m.service_accounts),
        not_service_accounts: sa(&m.not_service_accounts),
        source_ips: ips(&m.source_ips),
        not_source_ips: ips(&m.not_source_ips),
        destination_ips: ips(&m.destination_ips),
        not_destination_ips: ips(&m.not_destination_ips),
        destination_ports: m.destination_ports.clone(),
        not_destination_ports: m.not_destination_ports.clone(),
    }
}

/// An authorization policy in its WIT form (converted once per state change, never per decision).
pub(crate) fn policy(p: &state::Policy) -> wit::AuthorizationPolicy {
    wit::AuthorizationPolicy {
        name: p.name.clone(),
        namespace: p.namespace.clone(),
        scope: match p.scope {
            state::PolicyScope::Global => wit::PolicyScope::Global,
            state::PolicyScope::Namespace => wit::PolicyScope::Namespace,
            state::PolicyScope::WorkloadSelector => wit::PolicyScope::WorkloadSelector,
        },
        action: match p.action {
            state::PolicyAction::Allow => wit::PolicyAction::Allow,
            state::PolicyAction::Deny => wit::PolicyAction::Deny,
        },
        dry_run: p.dry_run,
        rules: p
            .rules
            .iter()
            .map(|rule| wit::PolicyRule {
                clauses: rule
                    .iter()
                    .map(|clause| wit::PolicyClause {
                        matches: clause.iter().map(policy_match).collect(),
                    })
                    .collect(),
            })
            .collect(),
    }
}
