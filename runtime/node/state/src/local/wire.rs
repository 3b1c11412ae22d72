//! The serde shape of the local config file: ztunnel's local-config format (`workloads`, `services`, `policies`,
//! camelCase, as ztunnel's `LocalConfig` reads it) plus weft's `plugins` section (see `plugins.rs`).
//!
//! Fields ztunnel accepts but weft does not use yet are still parsed (and so validated) and then ignored.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;

use serde::{Deserialize, Deserializer};

use super::checked::deserialize_checked_list;
use super::plugins::PluginWire;
use super::values::{
    CidrValue, GatewayDestinationValue, IpValue, LabelValue, NamespacedHost, ServicePort,
    StringMatchWire, VipValue,
};

/// The whole file.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct FileWire {
    #[serde(default, deserialize_with = "deserialize_workloads")]
    pub workloads: Vec<WorkloadWire>,
    #[serde(default)]
    pub services: Vec<ServiceWire>,
    #[serde(default)]
    pub policies: Vec<PolicyWire>,
    #[serde(default, deserialize_with = "super::plugins::deserialize_plugins")]
    pub plugins: Vec<PluginWire>,
}

/// ztunnel's `InboundProtocol`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub(crate) enum ProtocolWire {
    #[default]
    #[serde(rename = "TCP")]
    Tcp,
    #[serde(rename = "HBONE")]
    Hbone,
}

/// ztunnel's `HealthStatus`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub(crate) enum HealthWire {
    #[default]
    Healthy,
    Unhealthy,
}

/// ztunnel's `NetworkMode`.
#[derive(Debug, Clone, Copy, Default, Deserialize)]
pub(crate) enum NetworkModeWire {
    #[default]
    Standard,
    HostNetwork,
}

/// ztunnel's `Locality` (ztunnel requires all three fields; weft defaults them to empty).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct LocalityWire {
    #[serde(default)]
    pub region: String,
    #[serde(default)]
    pub zone: String,
    #[serde(default)]
    pub subzone: String,
}

/// ztunnel's `GatewayAddress`: `destination` is `network/IP` or `namespace/hostname`.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct GatewayWire {
    pub destination: GatewayDestinationValue,
    #[serde(default = "default_hbone_port")]
    pub hbone_mtls_port: u16,
}

fn default_hbone_port() -> u16 {
    15008
}

/// ztunnel's `ApplicationTunnel`: how inbound HBONE traffic is handed to the application (`port` 0 or absent: the
/// CONNECT port, as xDS's unset 0 means).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct ApplicationTunnelWire {
    pub protocol: AppTunnelProtocolWire,
    #[serde(default)]
    pub port: Option<u16>,
}

/// ztunnel's application tunnel protocol.
#[derive(Debug, Clone, Copy, Deserialize)]
pub(crate) enum AppTunnelProtocolWire {
    #[serde(rename = "NONE")]
    None,
    #[serde(rename = "PROXY")]
    Proxy,
}

/// One workload (ztunnel's `LocalWorkload`: the `Workload` fields plus `services`), plus weft's `labels`.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct WorkloadWire {
    #[serde(default)]
    pub uid: String,
    #[serde(default)]
    pub name: String,
    pub namespace: String,
    #[serde(default)]
    pub service_account: String,
    #[serde(default)]
    pub trust_domain: String,
    #[serde(default)]
    pub workload_ips: Vec<IpValue>,
    #[serde(default)]
    pub protocol: ProtocolWire,
    #[serde(default)]
    pub network_mode: NetworkModeWire,
    #[serde(default)]
    pub node: String,
    #[serde(default)]
    pub network: String,
    #[serde(default)]
    pub waypoint: Option<GatewayWire>,
    #[serde(default)]
    pub network_gateway: Option<GatewayWire>,
    #[serde(default)]
    pub workload_name: String,
    #[serde(default)]
    pub workload_type: String,
    #[serde(default)]
    pub canonical_name: String,
    #[serde(default)]
    pub canonical_revision: String,
    #[serde(default)]
    pub hostname: String,
    #[serde(default)]
    pub native_tunnel: bool,
    #[serde(default)]
    pub application_tunnel: Option<ApplicationTunnelWire>,
    #[serde(default)]
    pub authorization_policies: Vec<String>,
    #[serde(default)]
    pub status: HealthWire,
    #[serde(default)]
    pub cluster_id: String,
    #[serde(default)]
    pub locality: LocalityWire,
    #[serde(default)]
    pub capacity: Option<u32>,
    /// `namespace/hostname` → service port → target port. ztunnel requires it; weft defaults it to `{}`.
    #[serde(default)]
    pub services: BTreeMap<NamespacedHost, BTreeMap<ServicePort, u16>>,
    /// weft extension: labels handed to plugins.
    #[serde(default)]
    pub labels: BTreeMap<String, LabelValue>,
}

impl WorkloadWire {
    /// The uid, or Istio's `cluster//Pod/namespace/name` form when the file leaves it out.
    pub fn effective_uid(&self) -> String {
        if self.uid.is_empty() {
            format!("{}//Pod/{}/{}", self.cluster_id, self.namespace, self.name)
        } else {
            self.uid.clone()
        }
    }
}

/// Uids and IPs seen so far in `workloads`, to refuse duplicates while the position is still known (the IPs of
/// host-network workloads are not counted: see `check`).
#[derive(Default)]
struct SeenWorkloads {
    uids: HashMap<String, usize>,
    ips: HashMap<IpAddr, usize>,
}

impl SeenWorkloads {
    fn check(&mut self, index: usize, w: &WorkloadWire) -> Result<(), String> {
        let uid = w.effective_uid();
        if let Some(first) = self.uids.get(&uid) {
            return Err(format!(
                "duplicate workload uid {uid:?} (already used by workloads[{first}])"
            ));
        }
        // A host-network workload's addresses are the node's: shared with other host-network pods (and maybe with
        // a workload that is indexed there), never indexed by IP, so they claim nothing. Its own list still may not
        // repeat an address.
        let host_network = matches!(w.network_mode, NetworkModeWire::HostNetwork);
        for (i, ip) in w.workload_ips.iter().enumerate() {
            if host_network {
                if w.workload_ips[..i].iter().any(|before| before.0 == ip.0) {
                    return Err(format!("workload IP {} is listed twice", ip.0));
                }
                continue;
            }
            match self.ips.get(&ip.0) {
                Some(&first) if first == index => {
                    return Err(format!("workload IP {} is listed twice", ip.0));
                }
                Some(first) => {
                    return Err(format!(
                        "duplicate workload IP {} (already used by workloads[{first}])",
                        ip.0
                    ));
                }
                None => {
                    self.ips.insert(ip.0, index);
                }
            }
        }
        self.uids.insert(uid, index);
        Ok(())
    }
}

fn deserialize_workloads<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<WorkloadWire>, D::Error> {
    let mut seen = SeenWorkloads::default();
    deserialize_checked_list(d, "workload", move |index, w: WorkloadWire| {
        seen.check(index, &w)?;
        Ok(w)
    })
}

/// ztunnel's `NetworkCidr`: a CIDR VIP, routed by longest prefix when no exact VIP matches.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct CidrVipWire {
    #[serde(default)]
    pub network: String,
    pub cidr: CidrValue,
}

/// ztunnel's `Endpoint`: a workload backing the service, listed on the service's side.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[allow(
    dead_code,
    reason = "status is accepted for ztunnel compatibility; the workload's own status is used"
)]
pub(crate) struct EndpointWire {
    pub workload_uid: String,
    #[serde(default)]
    pub port: BTreeMap<ServicePort, u16>,
    #[serde(default)]
    pub status: HealthWire,
}

/// ztunnel's `WeightedWaypoint`.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct WeightedWaypointWire {
    pub destination: GatewayWire,
    #[serde(default)]
    pub weight: u32,
}

/// ztunnel's `LoadBalancer` (routing preferences, mode, health policy).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct LoadBalancerWire {
    #[serde(default)]
    pub routing_preferences: Vec<LoadBalancerScopeWire>,
    #[serde(default)]
    pub mode: Option<LoadBalancerModeWire>,
    #[serde(default)]
    pub health_policy: Option<LoadBalancerHealthWire>,
}

/// ztunnel's `LoadBalancerScopes`.
#[derive(Debug, Clone, Copy, Deserialize)]
pub(crate) enum LoadBalancerScopeWire {
    Region,
    Zone,
    Subzone,
    Node,
    Cluster,
    Network,
}

/// ztunnel's `LoadBalancerMode`.
#[derive(Debug, Clone, Copy, Deserialize)]
pub(crate) enum LoadBalancerModeWire {
    Standard,
    Strict,
    Failover,
    Passthrough,
}

/// ztunnel's `LoadBalancerHealthPolicy`.
#[derive(Debug, Clone, Copy, Deserialize)]
pub(crate) enum LoadBalancerHealthWire {
    OnlyHealthy,
    AllowAll,
}

/// ztunnel's `IpFamily`.
#[derive(Debug, Clone, Copy, Deserialize)]
pub(crate) enum IpFamilyWire {
    Dual,
    #[serde(rename = "IPv4")]
    Ipv4,
    #[serde(rename = "IPv6")]
    Ipv6,
}

/// ztunnel's `Visibility`.
#[derive(Debug, Clone, Copy, Default, Deserialize)]
pub(crate) enum VisibilityWire {
    #[default]
    Public,
    Namespace,
}

/// One service (ztunnel's `Service`). ztunnel requires `vips` and `ports`; weft defaults them to empty.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct ServiceWire {
    pub name: String,
    pub namespace: String,
    pub hostname: String,
    #[serde(default)]
    pub vips: Vec<VipValue>,
    #[serde(default)]
    pub cidr_vips: Vec<CidrVipWire>,
    #[serde(default)]
    pub ports: BTreeMap<ServicePort, u16>,
    #[serde(default)]
    pub endpoints: BTreeMap<String, EndpointWire>,
    #[serde(default)]
    pub subject_alt_names: Vec<String>,
    #[serde(default)]
    pub waypoint: Option<GatewayWire>,
    #[serde(default)]
    pub weighted_waypoints: Vec<WeightedWaypointWire>,
    #[serde(default)]
    pub load_balancer: Option<LoadBalancerWire>,
    #[serde(default)]
    pub ip_families: Option<IpFamilyWire>,
    #[serde(default)]
    pub canonical: bool,
    #[serde(default)]
    pub visibility: VisibilityWire,
}

/// ztunnel's `RbacScope`.
#[derive(Debug, Clone, Copy, Deserialize)]
pub(crate) enum ScopeWire {
    Global,
    Namespace,
    WorkloadSelector,
}

/// ztunnel's `RbacAction`.
#[derive(Debug, Clone, Copy, Deserialize)]
pub(crate) enum ActionWire {
    Allow,
    Deny,
}

/// ztunnel's `ServiceAccountMatch`.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct ServiceAccountMatchWire {
    pub namespace: String,
    pub service_account: String,
}

/// ztunnel's `RbacMatch`. Unlike ztunnel, unknown keys are refused: a misspelt key would silently widen a match.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct MatchWire {
    #[serde(default)]
    pub namespaces: Vec<StringMatchWire>,
    #[serde(default)]
    pub not_namespaces: Vec<StringMatchWire>,
    #[serde(default)]
    pub service_accounts: Vec<ServiceAccountMatchWire>,
    #[serde(default)]
    pub not_service_accounts: Vec<ServiceAccountMatchWire>,
    #[serde(default)]
    pub principals: Vec<StringMatchWire>,
    #[serde(default)]
    pub not_principals: Vec<StringMatchWire>,
    #[serde(default)]
    pub source_ips: Vec<CidrValue>,
    #[serde(default)]
    pub not_source_ips: Vec<CidrValue>,
    #[serde(default)]
    pub destination_ips: Vec<CidrValue>,
    #[serde(default)]
    pub not_destination_ips: Vec<CidrValue>,
    #[serde(default)]
    pub destination_ports: Vec<u16>,
    #[serde(default)]
    pub not_destination_ports: Vec<u16>,
}

/// ztunnel's `Authorization`. ztunnel requires `dryRun`; weft defaults it to false.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct PolicyWire {
    pub name: String,
    pub namespace: String,
    pub scope: ScopeWire,
    pub action: ActionWire,
    pub rules: Vec<Vec<Vec<MatchWire>>>,
    #[serde(default)]
    pub dry_run: bool,
}
