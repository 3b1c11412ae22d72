//! Where workloads and services sit and how their traffic may be steered, as the control plane describes it:
//! waypoints and network gateways, locality, load-balancing preferences, workload kind and network mode. Routing
//! through waypoints is in `mesh::waypoint`, locality-aware picking in `balance`; network
//! gateways in `mesh` (an endpoint or service waypoint on another network).

use std::fmt;
use std::net::IpAddr;

use serde::{Serialize, Serializer};

/// Where a waypoint or network gateway is.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum GatewayDestination {
    /// An address on a network (`network/IP`).
    Address {
        /// Network (empty: the default one).
        network: String,
        /// IP.
        ip: IpAddr,
    },
    /// A service by `namespace/hostname`.
    Hostname {
        /// Namespace.
        namespace: String,
        /// Hostname.
        hostname: String,
    },
}

impl fmt::Display for GatewayDestination {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GatewayDestination::Address { network, ip } => write!(f, "{network}/{ip}"),
            GatewayDestination::Hostname {
                namespace,
                hostname,
            } => write!(f, "{namespace}/{hostname}"),
        }
    }
}

impl Serialize for GatewayDestination {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// A waypoint or a network gateway (xDS `GatewayAddress`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GatewayAddress {
    /// Where it is.
    pub destination: GatewayDestination,
    /// Its HBONE port (xDS: 0 when unset).
    pub hbone_mtls_port: u16,
}

/// One of a service's weighted waypoints.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WeightedWaypoint {
    /// The waypoint.
    pub destination: GatewayAddress,
    /// Its weight.
    pub weight: u32,
}

/// A workload's locality.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Locality {
    /// Region.
    pub region: String,
    /// Zone.
    pub zone: String,
    /// Subzone.
    pub subzone: String,
}

/// A workload's network mode (dumped as ztunnel's `Standard` / `HostNetwork`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub enum NetworkMode {
    /// Its own network namespace.
    #[default]
    Standard,
    /// The node's network (hostNetwork pods).
    HostNetwork,
}

/// A tier of locality-aware endpoint picking.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum LbScope {
    /// Same region.
    Region,
    /// Same zone.
    Zone,
    /// Same subzone.
    Subzone,
    /// Same node.
    Node,
    /// Same cluster.
    Cluster,
    /// Same network.
    Network,
}

/// How routing preferences apply.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub enum LbMode {
    /// No preference (xDS `UNSPECIFIED_MODE`).
    #[default]
    Standard,
    /// Only endpoints matching every preference.
    Strict,
    /// The best-matching tier first, then the next.
    Failover,
    /// The original destination, no picking.
    Passthrough,
}

/// Which endpoints may be picked.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub enum LbHealthPolicy {
    /// Healthy endpoints only.
    #[default]
    OnlyHealthy,
    /// Every endpoint.
    AllowAll,
}

/// A service's load-balancing settings (xDS `LoadBalancing`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LoadBalancing {
    /// Preference tiers, in order (ztunnel's `routingPreferences`).
    #[serde(rename = "routingPreferences")]
    pub routing_preference: Vec<LbScope>,
    /// How they apply.
    pub mode: LbMode,
    /// Which endpoints count.
    pub health_policy: LbHealthPolicy,
}
