//! weft-state's model → Istio's xDS messages (`istio.workload.Address`, `istio.security.Authorization`), the way
//! istiod builds them for ztunnel: a workload is named by its uid, a service by `namespace/hostname`, a policy by
//! `namespace/name`. The node side does the reverse (weft-xds); the round trip is tested there and here.

use std::net::IpAddr;

use ipnet::IpNet;
use weft_proto::istio::security as sec;
use weft_proto::istio::workload as wl;
use weft_state::{
    Policy, PolicyAction, PolicyMatch, PolicyScope, Service, ServiceAccountMatch, StringMatch,
    TunnelProtocol, Workload,
};

fn ip_bytes(ip: &IpAddr) -> Vec<u8> {
    match ip {
        IpAddr::V4(v4) => v4.octets().to_vec(),
        IpAddr::V6(v6) => v6.octets().to_vec(),
    }
}

/// A waypoint as the model keeps it (`network/IP` or `namespace/hostname`, ztunnel's local-config form).
fn gateway(destination: &str) -> wl::GatewayAddress {
    let (left, right) = destination.split_once('/').unwrap_or(("", destination));
    let destination = match right.parse::<IpAddr>() {
        Ok(ip) => wl::gateway_address::Destination::Address(wl::NetworkAddress {
            network: left.to_owned(),
            address: ip_bytes(&ip),
            length: None,
        }),
        Err(_) => wl::gateway_address::Destination::Hostname(wl::NamespacedHostname {
            namespace: left.to_owned(),
            hostname: right.to_owned(),
        }),
    };
    wl::GatewayAddress {
        destination: Some(destination),
        hbone_mtls_port: 15008,
    }
}

/// A workload as `istio.workload.Workload`.
pub fn workload(w: &Workload) -> wl::Workload {
    let meta = &w.meta;
    wl::Workload {
        uid: w.uid.clone(),
        name: w.name.clone(),
        namespace: w.namespace.clone(),
        addresses: w.addresses.iter().map(ip_bytes).collect(),
        network: w.network.clone(),
        tunnel_protocol: match w.protocol {
            TunnelProtocol::Hbone => wl::TunnelProtocol::Hbone,
            TunnelProtocol::Tcp => wl::TunnelProtocol::None,
        } as i32,
        trust_domain: w.trust_domain.clone(),
        service_account: w.service_account.clone(),
        waypoint: w.waypoint.as_deref().map(gateway),
        node: w.node.clone(),
        canonical_name: meta.canonical_name.clone(),
        canonical_revision: meta.canonical_revision.clone(),
        workload_name: meta.workload_name.clone(),
        authorization_policies: meta.authorization_policies.clone(),
        status: if w.healthy {
            wl::WorkloadStatus::Healthy
        } else {
            wl::WorkloadStatus::Unhealthy
        } as i32,
        cluster_id: meta.cluster_id.clone(),
        services: w
            .services
            .iter()
            .map(|(key, ports)| {
                let ports = ports
                    .iter()
                    .map(|(&service_port, &target_port)| wl::Port {
                        service_port: service_port.into(),
                        target_port: target_port.into(),
                        app_protocol: 0,
                    })
                    .collect();
                (key.clone(), wl::PortList { ports })
            })
            .collect(),
        locality: (!meta.region.is_empty() || !meta.zone.is_empty()).then(|| wl::Locality {
            region: meta.region.clone(),
            zone: meta.zone.clone(),
            subzone: String::new(),
        }),
        ..Default::default()
    }
}

/// A service as `istio.workload.Service`.
pub fn service(s: &Service) -> wl::Service {
    wl::Service {
        name: s.name.clone(),
        namespace: s.namespace.clone(),
        hostname: s.hostname.clone(),
        addresses: s
            .vips
            .iter()
            .map(|(network, ip)| wl::NetworkAddress {
                network: network.clone(),
                address: ip_bytes(ip),
                length: None,
            })
            .collect(),
        ports: s
            .ports
            .iter()
            .map(|(&service_port, &target_port)| wl::Port {
                service_port: service_port.into(),
                target_port: target_port.into(),
                app_protocol: 0,
            })
            .collect(),
        subject_alt_names: s.subject_alt_names.clone(),
        ..Default::default()
    }
}

fn string_match(m: &StringMatch) -> sec::StringMatch {
    use sec::string_match::MatchType;
    sec::StringMatch {
        match_type: Some(match m {
            StringMatch::Exact(s) => MatchType::Exact(s.clone()),
            StringMatch::Prefix(s) => MatchType::Prefix(s.clone()),
            StringMatch::Suffix(s) => MatchType::Suffix(s.clone()),
            StringMatch::Presence => MatchType::Presence(()),
        }),
    }
}

fn string_matches(v: &[StringMatch]) -> Vec<sec::StringMatch> {
    v.iter().map(string_match).collect()
}

fn nets(v: &[IpNet]) -> Vec<sec::Address> {
    v.iter()
        .map(|n| sec::Address {
            address: ip_bytes(&n.addr()),
            length: n.prefix_len().into(),
        })
        .collect()
}

fn accounts(v: &[ServiceAccountMatch]) -> Vec<sec::ServiceAccountMatch> {
    v.iter()
        .map(|m| sec::ServiceAccountMatch {
            namespace: m.namespace.clone(),
            service_account: m.service_account.clone(),
        })
        .collect()
}

fn policy_match(m: &PolicyMatch) -> sec::Match {
    sec::Match {
        namespaces: string_matches(&m.namespaces),
        not_namespaces: string_matches(&m.not_namespaces),
        principals: string_matches(&m.principals),
        not_principals: string_matches(&m.not_principals),
        source_ips: nets(&m.source_ips),
        not_source_ips: nets(&m.not_source_ips),
        destination_ips: nets(&m.destination_ips),
        not_destination_ips: nets(&m.not_destination_ips),
        destination_ports: m.destination_ports.iter().map(|&p| p.into()).collect(),
        not_destination_ports: m.not_destination_ports.iter().map(|&p| p.into()).collect(),
        service_accounts: accounts(&m.service_accounts),
        not_service_accounts: accounts(&m.not_service_accounts),
        extensions: Vec::new(),
    }
}

/// A policy as `istio.security.Authorization`: the model's rules (OR) → clauses (AND) → matches (OR) are Istio's
/// groups → rules → matches.
pub fn authorization(p: &Policy) -> sec::Authorization {
    sec::Authorization {
        name: p.name.clone(),
        namespace: p.namespace.clone(),
        scope: match p.scope {
            PolicyScope::Global => sec::Scope::Global,
            PolicyScope::Namespace => sec::Scope::Namespace,
            PolicyScope::WorkloadSelector => sec::Scope::WorkloadSelector,
        } as i32,
        action: match p.action {
            PolicyAction::Allow => sec::Action::Allow,
            PolicyAction::Deny => sec::Action::Deny,
        } as i32,
        groups: p
            .rules
            .iter()
            .map(|clauses| sec::Group {
                rules: clauses
                    .iter()
                    .map(|matches| sec::Rules {
                        matches: matches.iter().map(policy_match).collect(),
                    })
                    .collect(),
            })
            .collect(),
        dry_run: p.dry_run,
        extensions: Vec::new(),
    }
}
