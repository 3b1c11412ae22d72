//! The model → Istio's xDS messages (`istio.workload.Address`, `istio.security.Authorization`), the way istiod builds
//! them for ztunnel (a workload is named by its uid, a service by `namespace/hostname`, a policy by
//! `namespace/name`): what weft-control serves. The reverse, what a node reads, is the rest of this module; the round
//! trip is tested in `tests/xds_roundtrip.rs`. Plugins as ECDS extension configs: [`plugin`].

use std::net::IpAddr;

use crate::{
    AppTunnelProtocol, GatewayAddress, GatewayDestination, IpFamilies, LbHealthPolicy, LbMode,
    LbScope, Locality, NetworkMode, Policy, PolicyAction, PolicyMatch, PolicyScope, Service,
    ServiceAccountMatch, StringMatch, TunnelProtocol, Visibility, Workload,
};
use ipnet::IpNet;
use weft_proto::istio::security as sec;
use weft_proto::istio::workload as wl;

pub mod plugin;

fn ip_bytes(ip: &IpAddr) -> Vec<u8> {
    match ip {
        IpAddr::V4(v4) => v4.octets().to_vec(),
        IpAddr::V6(v6) => v6.octets().to_vec(),
    }
}

/// A waypoint or network gateway.
fn gateway(g: &GatewayAddress) -> wl::GatewayAddress {
    let destination = match &g.destination {
        GatewayDestination::Address { network, ip } => {
            wl::gateway_address::Destination::Address(wl::NetworkAddress {
                network: network.clone(),
                address: ip_bytes(ip),
                length: None,
            })
        }
        GatewayDestination::Hostname {
            namespace,
            hostname,
        } => wl::gateway_address::Destination::Hostname(wl::NamespacedHostname {
            namespace: namespace.clone(),
            hostname: hostname.clone(),
        }),
    };
    wl::GatewayAddress {
        destination: Some(destination),
        hbone_mtls_port: g.hbone_mtls_port.into(),
    }
}

fn workload_type(t: &str) -> wl::WorkloadType {
    wl::WorkloadType::from_str_name(&t.to_ascii_uppercase()).unwrap_or_default()
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
        waypoint: w.waypoint.as_ref().map(gateway),
        network_gateway: w.network_gateway.as_ref().map(gateway),
        workload_type: workload_type(&w.workload_type) as i32,
        hostname: w.hostname.clone(),
        native_tunnel: w.native_tunnel,
        network_mode: match w.network_mode {
            NetworkMode::Standard => wl::NetworkMode::Standard,
            NetworkMode::HostNetwork => wl::NetworkMode::HostNetwork,
        } as i32,
        application_tunnel: w.application_tunnel.map(|t| wl::ApplicationTunnel {
            protocol: match t.protocol {
                AppTunnelProtocol::None => wl::application_tunnel::Protocol::None,
                AppTunnelProtocol::Proxy => wl::application_tunnel::Protocol::Proxy,
            } as i32,
            port: t.port.map_or(0, u32::from),
        }),
        capacity: (w.capacity != 1).then_some(w.capacity),
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
        locality: (w.locality != Locality::default()).then(|| wl::Locality {
            region: w.locality.region.clone(),
            zone: w.locality.zone.clone(),
            subzone: w.locality.subzone.clone(),
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
            .chain(s.cidr_vips.iter().map(|(network, net)| wl::NetworkAddress {
                network: network.clone(),
                address: ip_bytes(&net.addr()),
                length: Some(net.prefix_len().into()),
            }))
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
        waypoint: s.waypoint.as_ref().map(gateway),
        weighted_waypoints: s
            .weighted_waypoints
            .iter()
            .map(|w| wl::WeightedWaypoint {
                destination: Some(gateway(&w.destination)),
                weight: w.weight,
            })
            .collect(),
        load_balancing: s.load_balancing.as_ref().map(|l| wl::LoadBalancing {
            routing_preference: l
                .routing_preference
                .iter()
                .map(|r| {
                    use wl::load_balancing::Scope;
                    (match r {
                        LbScope::Region => Scope::Region,
                        LbScope::Zone => Scope::Zone,
                        LbScope::Subzone => Scope::Subzone,
                        LbScope::Node => Scope::Node,
                        LbScope::Cluster => Scope::Cluster,
                        LbScope::Network => Scope::Network,
                    }) as i32
                })
                .collect(),
            mode: match l.mode {
                LbMode::Standard => wl::load_balancing::Mode::UnspecifiedMode,
                LbMode::Strict => wl::load_balancing::Mode::Strict,
                LbMode::Failover => wl::load_balancing::Mode::Failover,
                LbMode::Passthrough => wl::load_balancing::Mode::Passthrough,
            } as i32,
            health_policy: match l.health_policy {
                LbHealthPolicy::OnlyHealthy => wl::load_balancing::HealthPolicy::OnlyHealthy,
                LbHealthPolicy::AllowAll => wl::load_balancing::HealthPolicy::AllowAll,
            } as i32,
        }),
        ip_families: match s.ip_families {
            None => wl::IpFamilies::Automatic,
            Some(IpFamilies::Ipv4) => wl::IpFamilies::Ipv4Only,
            Some(IpFamilies::Ipv6) => wl::IpFamilies::Ipv6Only,
            Some(IpFamilies::Dual) => wl::IpFamilies::Dual,
        } as i32,
        canonical: s.canonical,
        ingress_use_waypoint: s.ingress_use_waypoint,
        visibility: match s.visibility {
            Visibility::Public => wl::service::Visibility::Public,
            Visibility::Namespace => wl::service::Visibility::Namespace,
        } as i32,
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
