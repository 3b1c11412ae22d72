//! Waypoints and network gateways (`GatewayAddress`): by address or by `namespace/hostname`, with an HBONE port.

use weft_proto::istio::workload::GatewayAddress as Pb;
use weft_proto::istio::workload::gateway_address::Destination;

use super::{InvalidResource, check, ip};
use crate::topology::{GatewayAddress, GatewayDestination};
use crate::validate;

/// Convert a gateway at `field`; a gateway without a destination is refused (as ztunnel does).
pub(crate) fn gateway(field: &str, g: &Pb) -> Result<GatewayAddress, InvalidResource> {
    let destination = match &g.destination {
        Some(Destination::Address(a)) => GatewayDestination::Address {
            network: a.network.clone(),
            ip: check(&format!("{field}.address.address"), ip(&a.address))?,
        },
        Some(Destination::Hostname(h)) => GatewayDestination::Hostname {
            namespace: h.namespace.clone(),
            hostname: h.hostname.clone(),
        },
        None => {
            return Err(InvalidResource::new(
                field,
                "the gateway has neither an address nor a hostname",
            ));
        }
    };
    Ok(GatewayAddress {
        destination,
        hbone_mtls_port: check(
            &format!("{field}.hbone_mtls_port"),
            validate::port_or_zero("HBONE port", g.hbone_mtls_port),
        )?,
    })
}
