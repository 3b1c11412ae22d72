//! `istio.workload.Service` → [`Service`].

use std::collections::BTreeMap;

use ipnet::IpNet;
use weft_proto::istio::workload::{
    IpFamilies as PbFamilies, Service as Pb, load_balancing, service,
};

use super::gateway::gateway;
use super::workload::unknown;
use super::{InvalidResource, check, ip};
use crate::model::{IpFamilies, Service, Visibility};
use crate::topology::{LbHealthPolicy, LbMode, LbScope, LoadBalancing, WeightedWaypoint};
use crate::validate;

/// Convert and check a service (field paths relative to the Service message).
pub fn service(s: Pb) -> Result<Service, InvalidResource> {
    let mut vips = Vec::new();
    let mut cidr_vips = Vec::new();
    for (i, a) in s.addresses.iter().enumerate() {
        let addr = check(&format!("addresses[{i}].address"), ip(&a.address))?;
        let full = if addr.is_ipv4() { 32 } else { 128 };
        match a.length {
            Some(len) if len != full => {
                let net = u8::try_from(len)
                    .ok()
                    .and_then(|l| IpNet::new(addr, l).ok())
                    .ok_or_else(|| {
                        InvalidResource::new(
                            format!("addresses[{i}].length"),
                            format!("prefix length {len} is too long for {addr}"),
                        )
                    })?;
                cidr_vips.push((a.network.clone(), net));
            }
            _ => vips.push((a.network.clone(), addr)),
        }
    }
    let mut ports = BTreeMap::new();
    for (i, p) in s.ports.iter().enumerate() {
        let sp = check(
            &format!("ports[{i}].service_port"),
            validate::port("service port", p.service_port),
        )?;
        let tp = check(
            &format!("ports[{i}].target_port"),
            validate::port_or_zero("target port", p.target_port),
        )?;
        ports.insert(sp, tp);
    }
    let waypoint = s
        .waypoint
        .as_ref()
        .map(|g| gateway("waypoint", g))
        .transpose()?;
    let weighted_waypoints = s
        .weighted_waypoints
        .iter()
        .enumerate()
        .map(|(i, w)| {
            let field = format!("weighted_waypoints[{i}].destination");
            let dest = w.destination.as_ref().ok_or_else(|| {
                InvalidResource::new(&field, "a weighted waypoint needs a destination")
            })?;
            Ok(WeightedWaypoint {
                destination: gateway(&field, dest)?,
                weight: w.weight,
            })
        })
        .collect::<Result<Vec<_>, InvalidResource>>()?;
    let load_balancing = s
        .load_balancing
        .as_ref()
        .map(lb)
        .transpose()
        .map_err(|e| e.within("load_balancing"))?;
    let ip_families = match PbFamilies::try_from(s.ip_families) {
        Ok(PbFamilies::Automatic) => None,
        Ok(PbFamilies::Ipv4Only) => Some(IpFamilies::Ipv4),
        Ok(PbFamilies::Ipv6Only) => Some(IpFamilies::Ipv6),
        Ok(PbFamilies::Dual) => Some(IpFamilies::Dual),
        Err(_) => return Err(unknown("ip_families", s.ip_families)),
    };
    // An unknown visibility is PUBLIC (ztunnel fails open rather than dropping the service).
    let visibility = match service::Visibility::try_from(s.visibility).unwrap_or_default() {
        service::Visibility::Public => Visibility::Public,
        service::Visibility::Namespace => Visibility::Namespace,
    };
    Ok(Service {
        name: s.name,
        namespace: s.namespace,
        hostname: s.hostname,
        vips,
        cidr_vips,
        ports,
        subject_alt_names: s.subject_alt_names,
        waypoint,
        weighted_waypoints,
        load_balancing,
        ingress_use_waypoint: s.ingress_use_waypoint,
        ip_families,
        visibility,
        canonical: s.canonical,
    })
}

fn lb(l: &weft_proto::istio::workload::LoadBalancing) -> Result<LoadBalancing, InvalidResource> {
    use load_balancing::{HealthPolicy, Mode, Scope};
    let routing_preference = l
        .routing_preference
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let field = format!("routing_preference[{i}]");
            match Scope::try_from(*v) {
                Ok(Scope::Region) => Ok(LbScope::Region),
                Ok(Scope::Zone) => Ok(LbScope::Zone),
                Ok(Scope::Subzone) => Ok(LbScope::Subzone),
                Ok(Scope::Node) => Ok(LbScope::Node),
                Ok(Scope::Cluster) => Ok(LbScope::Cluster),
                Ok(Scope::Network) => Ok(LbScope::Network),
                Ok(Scope::UnspecifiedScope) => Err(InvalidResource::new(
                    field,
                    "UNSPECIFIED_SCOPE is not a routing preference",
                )),
                Err(_) => Err(unknown(&field, *v)),
            }
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mode = match Mode::try_from(l.mode) {
        Ok(Mode::UnspecifiedMode) => LbMode::Standard,
        Ok(Mode::Strict) => LbMode::Strict,
        Ok(Mode::Failover) => LbMode::Failover,
        Ok(Mode::Passthrough) => LbMode::Passthrough,
        Err(_) => return Err(unknown("mode", l.mode)),
    };
    let health_policy = match HealthPolicy::try_from(l.health_policy) {
        Ok(HealthPolicy::OnlyHealthy) => LbHealthPolicy::OnlyHealthy,
        Ok(HealthPolicy::AllowAll) => LbHealthPolicy::AllowAll,
        Err(_) => return Err(unknown("health_policy", l.health_policy)),
    };
    Ok(LoadBalancing {
        routing_preference,
        mode,
        health_policy,
    })
}
