//! `istio.workload.Workload` → [`Workload`].

use std::collections::BTreeMap;

use weft_proto::istio::workload::{
    ApplicationTunnel as PbTunnel, NetworkMode as PbNetworkMode, TunnelProtocol as PbProtocol,
    Workload as Pb, WorkloadStatus, WorkloadType as PbType, application_tunnel,
};

use super::gateway::gateway;
use super::{InvalidResource, check, ip};
use crate::local::{DEFAULT_SERVICE_ACCOUNT, DEFAULT_TRUST_DOMAIN};
use crate::model::{
    AppTunnelProtocol, ApplicationTunnel, DEFAULT_CLUSTER_ID, TunnelProtocol, Workload,
};
use crate::topology::{Locality, NetworkMode};
use crate::validate;

/// Convert and check a workload (field paths relative to the Workload message).
pub fn workload(w: Pb) -> Result<Workload, InvalidResource> {
    if w.uid.is_empty() {
        return Err(InvalidResource::new("uid", "must not be empty"));
    }
    let addresses = w
        .addresses
        .iter()
        .enumerate()
        .map(|(i, b)| check(&format!("addresses[{i}]"), ip(b)))
        .collect::<Result<Vec<_>, _>>()?;
    let protocol = match PbProtocol::try_from(w.tunnel_protocol) {
        Ok(PbProtocol::None) => TunnelProtocol::Tcp,
        Ok(PbProtocol::Hbone) => TunnelProtocol::Hbone,
        Ok(PbProtocol::LegacyIstioMtls) => {
            return Err(InvalidResource::new(
                "tunnel_protocol",
                "LEGACY_ISTIO_MTLS is not supported",
            ));
        }
        Err(_) => return Err(unknown("tunnel_protocol", w.tunnel_protocol)),
    };
    let trust_domain = if w.trust_domain.is_empty() {
        DEFAULT_TRUST_DOMAIN.to_owned()
    } else {
        w.trust_domain
    };
    let service_account = if w.service_account.is_empty() {
        DEFAULT_SERVICE_ACCOUNT.to_owned()
    } else {
        w.service_account
    };
    let waypoint = w
        .waypoint
        .as_ref()
        .map(|g| gateway("waypoint", g))
        .transpose()?;
    let network_gateway = w
        .network_gateway
        .as_ref()
        .map(|g| gateway("network_gateway", g))
        .transpose()?;
    let healthy = match WorkloadStatus::try_from(w.status) {
        Ok(WorkloadStatus::Healthy) => true,
        Ok(WorkloadStatus::Unhealthy) => false,
        Err(_) => return Err(unknown("status", w.status)),
    };
    let mut services = BTreeMap::new();
    for (key, list) in &w.services {
        let field = format!("services[{key:?}]");
        check(&field, validate::namespaced_hostname(key))?;
        let mut ports = BTreeMap::new();
        for (i, p) in list.ports.iter().enumerate() {
            let sp = check(
                &format!("{field}.ports[{i}].service_port"),
                validate::port("service port", p.service_port),
            )?;
            let tp = check(
                &format!("{field}.ports[{i}].target_port"),
                validate::port_or_zero("target port", p.target_port),
            )?;
            ports.insert(sp, tp);
        }
        services.insert(key.clone(), ports);
    }
    let application_tunnel = w
        .application_tunnel
        .as_ref()
        .map(tunnel)
        .transpose()
        .map_err(|e| e.within("application_tunnel"))?;
    let network_mode = match PbNetworkMode::try_from(w.network_mode) {
        Ok(PbNetworkMode::Standard) => NetworkMode::Standard,
        Ok(PbNetworkMode::HostNetwork) => NetworkMode::HostNetwork,
        Err(_) => return Err(unknown("network_mode", w.network_mode)),
    };
    // As ztunnel names it: the enum's name in lowercase; an unknown value reads as the default, DEPLOYMENT.
    let workload_type = PbType::try_from(w.workload_type)
        .unwrap_or_default()
        .as_str_name()
        .to_ascii_lowercase();
    let locality = w
        .locality
        .map(|l| Locality {
            region: l.region,
            zone: l.zone,
            subzone: l.subzone,
        })
        .unwrap_or_default();
    let cluster_id = if w.cluster_id.is_empty() {
        DEFAULT_CLUSTER_ID.to_owned()
    } else {
        w.cluster_id
    };
    Ok(Workload {
        uid: w.uid,
        name: w.name,
        namespace: w.namespace,
        service_account,
        trust_domain,
        addresses,
        network: w.network,
        protocol,
        node: w.node,
        waypoint,
        network_gateway,
        services,
        healthy,
        application_tunnel,
        workload_type,
        workload_name: w.workload_name,
        canonical_name: w.canonical_name,
        canonical_revision: w.canonical_revision,
        cluster_id,
        hostname: w.hostname,
        native_tunnel: w.native_tunnel,
        locality,
        network_mode,
        authorization_policies: w.authorization_policies,
        capacity: w.capacity.unwrap_or(1),
        meta: Default::default(),
    }
    .with_meta(Vec::new()))
}

fn tunnel(t: &PbTunnel) -> Result<ApplicationTunnel, InvalidResource> {
    let protocol = match application_tunnel::Protocol::try_from(t.protocol) {
        Ok(application_tunnel::Protocol::None) => AppTunnelProtocol::None,
        Ok(application_tunnel::Protocol::Proxy) => AppTunnelProtocol::Proxy,
        Err(_) => return Err(unknown("protocol", t.protocol)),
    };
    let port = check("port", validate::port_or_zero("port", t.port))?;
    Ok(ApplicationTunnel {
        protocol,
        port: (port != 0).then_some(port),
    })
}

pub(crate) fn unknown(field: &str, v: i32) -> InvalidResource {
    InvalidResource::new(field, format!("unknown enum value {v}"))
}
