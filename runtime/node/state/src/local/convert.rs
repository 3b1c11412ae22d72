//! Conversion of the checked file (`wire`) into weft's model: defaults (trust domain, service account), hook
//! metadata, and endpoints a service lists for workloads.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use ipnet::IpNet;

use super::values::{CidrValue, StringMatchWire};
use super::wire::{
    ActionWire, AppTunnelProtocolWire, ApplicationTunnelWire, GatewayWire, HealthWire,
    IpFamilyWire, LoadBalancerHealthWire, LoadBalancerModeWire, LoadBalancerScopeWire,
    LoadBalancerWire, MatchWire, NetworkModeWire, PolicyWire, ProtocolWire, ScopeWire,
    ServiceAccountMatchWire, ServiceWire, VisibilityWire, WorkloadWire,
};
use crate::model::{
    AppTunnelProtocol, ApplicationTunnel, IpFamilies, Policy, PolicyAction, PolicyMatch,
    PolicyScope, Service, ServiceAccountMatch, StringMatch, TunnelProtocol, Visibility, Workload,
};
use crate::topology::{
    GatewayAddress, LbHealthPolicy, LbMode, LbScope, LoadBalancing, Locality, NetworkMode,
    WeightedWaypoint,
};

/// Trust domain of workloads that leave it empty.
pub const DEFAULT_TRUST_DOMAIN: &str = "cluster.local";
/// Service account of workloads that leave it empty.
pub const DEFAULT_SERVICE_ACCOUNT: &str = "default";

fn or_default(s: String, default: &str) -> String {
    if s.trim().is_empty() {
        default.to_owned()
    } else {
        s
    }
}

pub(crate) fn workload(w: WorkloadWire) -> Workload {
    let uid = w.effective_uid();
    let trust_domain = or_default(w.trust_domain, DEFAULT_TRUST_DOMAIN);
    let service_account = or_default(w.service_account, DEFAULT_SERVICE_ACCOUNT);
    let services: BTreeMap<String, BTreeMap<u16, u16>> = w
        .services
        .into_iter()
        .map(|(k, ports)| (k.0, ports.into_iter().map(|(p, t)| (p.0, t)).collect()))
        .collect();
    let labels = w.labels.into_iter().map(|(k, v)| (k, v.0)).collect();
    Workload {
        uid,
        name: w.name,
        namespace: w.namespace,
        service_account,
        trust_domain,
        addresses: w.workload_ips.into_iter().map(|ip| ip.0).collect(),
        network: w.network,
        protocol: match w.protocol {
            ProtocolWire::Tcp => TunnelProtocol::Tcp,
            ProtocolWire::Hbone => TunnelProtocol::Hbone,
        },
        node: w.node,
        waypoint: w.waypoint.map(gateway),
        network_gateway: w.network_gateway.map(gateway),
        services,
        healthy: w.status == HealthWire::Healthy,
        application_tunnel: w.application_tunnel.map(application_tunnel),
        workload_type: w.workload_type.to_ascii_lowercase(),
        workload_name: w.workload_name,
        canonical_name: w.canonical_name,
        canonical_revision: w.canonical_revision,
        cluster_id: w.cluster_id,
        hostname: w.hostname,
        native_tunnel: w.native_tunnel,
        locality: Locality {
            region: w.locality.region,
            zone: w.locality.zone,
            subzone: w.locality.subzone,
        },
        network_mode: match w.network_mode {
            NetworkModeWire::Standard => NetworkMode::Standard,
            NetworkModeWire::HostNetwork => NetworkMode::HostNetwork,
        },
        authorization_policies: w.authorization_policies,
        capacity: w.capacity.unwrap_or(1),
        meta: Arc::default(),
    }
    .with_meta(labels)
}

fn gateway(g: GatewayWire) -> GatewayAddress {
    GatewayAddress {
        destination: g.destination.0,
        hbone_mtls_port: g.hbone_mtls_port,
    }
}

fn application_tunnel(t: ApplicationTunnelWire) -> ApplicationTunnel {
    ApplicationTunnel {
        protocol: match t.protocol {
            AppTunnelProtocolWire::None => AppTunnelProtocol::None,
            AppTunnelProtocolWire::Proxy => AppTunnelProtocol::Proxy,
        },
        port: t.port.filter(|p| *p != 0),
    }
}

/// Endpoints a service lists in its own `endpoints` (ztunnel's form) become entries of the workload's `services`,
/// unless the workload already declares that service. Endpoints of unknown workloads are ignored.
pub(crate) fn fold_endpoints(workloads: &mut [Workload], services: &[ServiceWire]) {
    let by_uid: HashMap<String, usize> = workloads
        .iter()
        .enumerate()
        .map(|(i, w)| (w.uid.clone(), i))
        .collect();
    for svc in services {
        let key = format!("{}/{}", svc.namespace, svc.hostname);
        for (uid, ep) in &svc.endpoints {
            let uid = if ep.workload_uid.is_empty() {
                uid
            } else {
                &ep.workload_uid
            };
            let Some(&i) = by_uid.get(uid) else {
                tracing::warn!(service = %key, workload = %uid, "service endpoint names an unknown workload; ignored");
                continue;
            };
            let w = &mut workloads[i];
            if !w.services.contains_key(&key) {
                w.services.insert(
                    key.clone(),
                    ep.port.iter().map(|(p, t)| (p.0, *t)).collect(),
                );
            }
        }
    }
}

pub(crate) fn service(s: ServiceWire) -> Service {
    Service {
        name: s.name,
        namespace: s.namespace,
        hostname: s.hostname,
        vips: s.vips.into_iter().map(|v| (v.network, v.ip)).collect(),
        cidr_vips: s
            .cidr_vips
            .into_iter()
            .map(|c| (c.network, c.cidr.0))
            .collect(),
        ports: s.ports.into_iter().map(|(p, t)| (p.0, t)).collect(),
        subject_alt_names: s.subject_alt_names,
        ip_families: s.ip_families.map(|f| match f {
            IpFamilyWire::Dual => IpFamilies::Dual,
            IpFamilyWire::Ipv4 => IpFamilies::Ipv4,
            IpFamilyWire::Ipv6 => IpFamilies::Ipv6,
        }),
        visibility: match s.visibility {
            VisibilityWire::Public => Visibility::Public,
            VisibilityWire::Namespace => Visibility::Namespace,
        },
        canonical: s.canonical,
        waypoint: s.waypoint.map(gateway),
        weighted_waypoints: s
            .weighted_waypoints
            .into_iter()
            .map(|w| WeightedWaypoint {
                destination: gateway(w.destination),
                weight: w.weight,
            })
            .collect(),
        load_balancing: s.load_balancer.map(load_balancing),
        ingress_use_waypoint: false,
    }
}

fn load_balancing(l: LoadBalancerWire) -> LoadBalancing {
    LoadBalancing {
        routing_preference: l
            .routing_preferences
            .into_iter()
            .map(|r| match r {
                LoadBalancerScopeWire::Region => LbScope::Region,
                LoadBalancerScopeWire::Zone => LbScope::Zone,
                LoadBalancerScopeWire::Subzone => LbScope::Subzone,
                LoadBalancerScopeWire::Node => LbScope::Node,
                LoadBalancerScopeWire::Cluster => LbScope::Cluster,
                LoadBalancerScopeWire::Network => LbScope::Network,
            })
            .collect(),
        mode: match l.mode {
            None | Some(LoadBalancerModeWire::Standard) => LbMode::Standard,
            Some(LoadBalancerModeWire::Strict) => LbMode::Strict,
            Some(LoadBalancerModeWire::Failover) => LbMode::Failover,
            Some(LoadBalancerModeWire::Passthrough) => LbMode::Passthrough,
        },
        health_policy: match l.health_policy {
            None | Some(LoadBalancerHealthWire::OnlyHealthy) => LbHealthPolicy::OnlyHealthy,
            Some(LoadBalancerHealthWire::AllowAll) => LbHealthPolicy::AllowAll,
        },
    }
}

fn string_matches(v: Vec<StringMatchWire>) -> Vec<StringMatch> {
    v.into_iter()
        .map(|m| match m {
            StringMatchWire::Exact(s) => StringMatch::Exact(s),
            StringMatchWire::Prefix(s) => StringMatch::Prefix(s),
            StringMatchWire::Suffix(s) => StringMatch::Suffix(s),
            StringMatchWire::Presence() => StringMatch::Presence,
        })
        .collect()
}

fn sa_matches(v: Vec<ServiceAccountMatchWire>) -> Vec<ServiceAccountMatch> {
    v.into_iter()
        .map(|m| ServiceAccountMatch {
            namespace: m.namespace,
            service_account: m.service_account,
        })
        .collect()
}

fn nets(v: Vec<CidrValue>) -> Vec<IpNet> {
    v.into_iter().map(|c| c.0).collect()
}

fn policy_match(m: MatchWire) -> PolicyMatch {
    PolicyMatch {
        namespaces: string_matches(m.namespaces),
        not_namespaces: string_matches(m.not_namespaces),
        principals: string_matches(m.principals),
        not_principals: string_matches(m.not_principals),
        service_accounts: sa_matches(m.service_accounts),
        not_service_accounts: sa_matches(m.not_service_accounts),
        source_ips: nets(m.source_ips),
        not_source_ips: nets(m.not_source_ips),
        destination_ips: nets(m.destination_ips),
        not_destination_ips: nets(m.not_destination_ips),
        destination_ports: m.destination_ports,
        not_destination_ports: m.not_destination_ports,
    }
}

pub(crate) fn policy(p: PolicyWire) -> Policy {
    Policy {
        name: p.name,
        namespace: p.namespace,
        scope: match p.scope {
            ScopeWire::Global => PolicyScope::Global,
            ScopeWire::Namespace => PolicyScope::Namespace,
            ScopeWire::WorkloadSelector => PolicyScope::WorkloadSelector,
        },
        action: match p.action {
            ActionWire::Allow => PolicyAction::Allow,
            ActionWire::Deny => PolicyAction::Deny,
        },
        dry_run: p.dry_run,
        rules: p
            .rules
            .into_iter()
            .map(|clauses| {
                clauses
                    .into_iter()
                    .map(|matches| matches.into_iter().map(policy_match).collect())
                    .collect()
            })
            .collect(),
    }
}
