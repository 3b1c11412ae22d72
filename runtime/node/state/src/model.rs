//! The mesh model: workloads, services, authorization policies and plugin specs, as weft uses them at run time.
//! Sources (the local YAML file today, xDS later) convert into these types; nothing here knows about a source.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;
use serde::Serialize;
use weft_hooks::WorkloadMeta;

use crate::topology::{
    GatewayAddress, LbHealthPolicy, LoadBalancing, Locality, NetworkMode, WeightedWaypoint,
};

/// How a workload is reached by peers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum TunnelProtocol {
    /// Plain TCP (not in the mesh).
    #[default]
    Tcp,
    /// HBONE: HTTP/2 CONNECT over mutual TLS to port 15008.
    Hbone,
}

/// A workload (a pod).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Workload {
    /// Unique id; the resource name in xDS.
    pub uid: String,
    /// Pod name.
    pub name: String,
    /// Namespace.
    pub namespace: String,
    /// Service account (default `default`).
    pub service_account: String,
    /// Trust domain (default `cluster.local`).
    pub trust_domain: String,
    /// IP addresses (`workloadIps`, as ztunnel and the local config file name them).
    #[serde(rename = "workloadIps")]
    pub addresses: Vec<IpAddr>,
    /// Network name (empty: the default network).
    pub network: String,
    /// HBONE or plain TCP.
    pub protocol: TunnelProtocol,
    /// The node it runs on.
    pub node: String,
    /// Its waypoint, if it has one: traffic addressed to this workload goes through it.
    pub waypoint: Option<GatewayAddress>,
    /// The gateway that reaches it from other networks.
    pub network_gateway: Option<GatewayAddress>,
    /// Services this workload backs: `namespace/hostname` → service port → target port.
    pub services: BTreeMap<String, BTreeMap<u16, u16>>,
    /// Whether it is healthy (unhealthy workloads are not picked as service endpoints); dumped as ztunnel's
    /// `status` (`Healthy` / `Unhealthy`).
    #[serde(rename = "status", serialize_with = "health_status")]
    pub healthy: bool,
    /// How inbound HBONE traffic is handed to the application, when not as plain TCP to the CONNECT port
    /// (ztunnel's `applicationTunnel`; xDS `Workload.application_tunnel`).
    pub application_tunnel: Option<ApplicationTunnel>,
    /// The kind of its owner, lowercase as ztunnel names it (`deployment`, `cronjob`, `pod`, `job`).
    pub workload_type: String,
    /// Its owner's name (e.g. the Deployment).
    pub workload_name: String,
    /// Canonical service (`service.istio.io/canonical-name`).
    pub canonical_name: String,
    /// Canonical revision (`service.istio.io/canonical-revision`).
    pub canonical_revision: String,
    /// Cluster id (default `Kubernetes`).
    pub cluster_id: String,
    /// Its hostname, when it has one.
    pub hostname: String,
    /// Whether it speaks HBONE itself (no node proxy in front of it).
    pub native_tunnel: bool,
    /// Locality.
    pub locality: Locality,
    /// Network mode.
    pub network_mode: NetworkMode,
    /// `namespace/name` of the WORKLOAD_SELECTOR authorization policies that select it.
    pub authorization_policies: Vec<String>,
    /// Relative capacity for load balancing (default 1).
    pub capacity: u32,
    /// Metadata handed to hooks (built once from the fields above).
    #[serde(skip)]
    pub meta: Arc<WorkloadMeta>,
}

/// The protocol of a workload's application tunnel (xDS `ApplicationTunnel.Protocol`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum AppTunnelProtocol {
    /// Plain bytes (only the port may differ from the CONNECT port).
    None,
    /// A PROXY protocol v2 header first (source, destination, TLV 0xD0 = the peer's SPIFFE id), then the bytes.
    Proxy,
}

/// How inbound HBONE traffic reaches a workload's application (ztunnel's `ApplicationTunnel`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ApplicationTunnel {
    /// What is written before the bytes.
    pub protocol: AppTunnelProtocol,
    /// The port the application listens on for tunnelled traffic; `None`: the CONNECT port.
    pub port: Option<u16>,
}

/// The cluster id of a workload that leaves it empty (ztunnel's default).
pub const DEFAULT_CLUSTER_ID: &str = "Kubernetes";

impl Workload {
    /// Set `meta` from the fields (and `labels`, which only plugins see).
    pub fn with_meta(mut self, labels: Vec<(String, String)>) -> Self {
        self.meta = Arc::new(WorkloadMeta {
            uid: self.uid.clone(),
            name: self.name.clone(),
            namespace: self.namespace.clone(),
            service_account: self.service_account.clone(),
            trust_domain: self.trust_domain.clone(),
            node: self.node.clone(),
            workload_name: self.workload_name.clone(),
            workload_type: self.workload_type.clone(),
            canonical_name: self.canonical_name.clone(),
            canonical_revision: self.canonical_revision.clone(),
            cluster_id: self.cluster_id.clone(),
            region: self.locality.region.clone(),
            zone: self.locality.zone.clone(),
            labels,
            authorization_policies: self.authorization_policies.clone(),
            identity: Arc::from(self.spiffe_id()),
        });
        self
    }

    /// Whether `id` is this workload's SPIFFE identity: the same answer as `self.spiffe_id() == id`, against the
    /// string its metadata formed once (every state source builds the metadata), so the data path builds none.
    pub fn has_identity(&self, id: &str) -> bool {
        *self.meta.identity == *id
    }

    /// `spiffe://<td>/ns/<ns>/sa/<sa>`.
    pub fn spiffe_id(&self) -> String {
        format!(
            "spiffe://{}/ns/{}/sa/{}",
            self.trust_domain, self.namespace, self.service_account
        )
    }
}

/// A service.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Service {
    /// Short name.
    pub name: String,
    /// Namespace.
    pub namespace: String,
    /// Hostname (e.g. `echo.default.svc.cluster.local`).
    pub hostname: String,
    /// Virtual IPs, each with its network (dumped as ztunnel's `network/IP` strings).
    #[serde(serialize_with = "network_slashed")]
    pub vips: Vec<(String, IpAddr)>,
    /// Virtual address ranges, each with its network (an xDS address with a prefix length; dumped as ztunnel's
    /// `network/CIDR` strings).
    #[serde(serialize_with = "network_slashed")]
    pub cidr_vips: Vec<(String, IpNet)>,
    /// Service port → target port (0 = same as the service port, or as the endpoint declares).
    pub ports: BTreeMap<u16, u16>,
    /// Extra identities a server for this service may present.
    pub subject_alt_names: Vec<String>,
    /// The address families the service serves (`None`: as its addresses are); decides the DNS record types of a
    /// headless service, whose endpoints may be dual-stack.
    pub ip_families: Option<IpFamilies>,
    /// Which clients may resolve it by name or reach it at its VIPs.
    pub visibility: Visibility,
    /// Preferred over same-hostname services of other namespaces (the client's own namespace wins first).
    pub canonical: bool,
    /// Its waypoint, if it has one: traffic addressed to the service goes through it.
    pub waypoint: Option<GatewayAddress>,
    /// Weighted waypoints (preferred over `waypoint` when their weights sum above 0).
    pub weighted_waypoints: Vec<WeightedWaypoint>,
    /// Load-balancing settings (ztunnel's `loadBalancer`).
    #[serde(rename = "loadBalancer")]
    pub load_balancing: Option<LoadBalancing>,
    /// Whether traffic from ingress goes through the waypoint.
    pub ingress_use_waypoint: bool,
}

impl Service {
    /// `namespace/hostname`, the key workloads use to name the services they back.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.hostname)
    }

    /// Headless: no VIP; a name lookup returns the endpoints' addresses.
    pub fn is_headless(&self) -> bool {
        self.vips.is_empty()
    }

    /// Whether a client in `namespace` may see this service.
    pub fn visible_to(&self, namespace: &str) -> bool {
        self.visibility == Visibility::Public || self.namespace == namespace
    }

    /// Whether the endpoint `wl` counts for this service at all, for load balancing and headless DNS answers
    /// alike: it is healthy, or the service's health policy is ALLOW_ALL (ztunnel's `should_include_endpoint`).
    pub fn includes_endpoint(&self, wl: &Workload) -> bool {
        wl.healthy
            || self
                .load_balancing
                .as_ref()
                .is_some_and(|lb| lb.health_policy == LbHealthPolicy::AllowAll)
    }
}

/// A service's address families (xDS `IPFamilies`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum IpFamilies {
    /// IPv4 and IPv6.
    Dual,
    /// IPv4 only.
    #[serde(rename = "IPv4")]
    Ipv4,
    /// IPv6 only.
    #[serde(rename = "IPv6")]
    Ipv6,
}

impl IpFamilies {
    /// Whether an address of this kind belongs to the families.
    pub fn accepts(&self, ip: IpAddr) -> bool {
        match self {
            IpFamilies::Dual => true,
            IpFamilies::Ipv4 => ip.is_ipv4(),
            IpFamilies::Ipv6 => ip.is_ipv6(),
        }
    }
}

/// Who may resolve a service by name or reach it at its VIPs (xDS `Service.visibility`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub enum Visibility {
    /// Every client.
    #[default]
    Public,
    /// Clients in the service's own namespace only.
    Namespace,
}

/// Where a policy applies (dumped as ztunnel's `Global` / `Namespace` / `WorkloadSelector`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum PolicyScope {
    /// Every workload in the mesh (policies in the root namespace).
    Global,
    /// Every workload of the policy's namespace.
    Namespace,
    /// Only workloads that list this policy in their `authorization_policies`.
    WorkloadSelector,
}

/// What a matching policy does (dumped as ztunnel's `Allow` / `Deny`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum PolicyAction {
    /// Allow matching connections (and deny non-matching ones, when any ALLOW applies).
    Allow,
    /// Deny matching connections.
    Deny,
}

/// A string match on a principal or namespace. Dumped as ztunnel's: `{"Exact": "..."}`, ..., `{"Presence": []}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StringMatch {
    /// Equal.
    Exact(String),
    /// Starts with.
    Prefix(String),
    /// Ends with.
    Suffix(String),
    /// Any non-empty value.
    Presence,
}

impl Serialize for StringMatch {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeTupleVariant;
        match self {
            StringMatch::Exact(v) => s.serialize_newtype_variant("StringMatch", 0, "Exact", v),
            StringMatch::Prefix(v) => s.serialize_newtype_variant("StringMatch", 1, "Prefix", v),
            StringMatch::Suffix(v) => s.serialize_newtype_variant("StringMatch", 2, "Suffix", v),
            // ztunnel's `Presence()`, an empty tuple variant.
            StringMatch::Presence => s
                .serialize_tuple_variant("StringMatch", 3, "Presence", 0)?
                .end(),
        }
    }
}

fn health_status<S: serde::Serializer>(healthy: &bool, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(if *healthy { "Healthy" } else { "Unhealthy" })
}

/// `[(network, address)]` as ztunnel's `["network/address"]`.
fn network_slashed<S: serde::Serializer, A: std::fmt::Display>(
    v: &[(String, A)],
    s: S,
) -> Result<S::Ok, S::Error> {
    s.collect_seq(v.iter().map(|(network, a)| format!("{network}/{a}")))
}

/// A service-account match (trust domain ignored).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceAccountMatch {
    /// Namespace.
    pub namespace: String,
    /// Service account name.
    pub service_account: String,
}

/// One match: every field kind must pass (AND); values within one kind OR.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PolicyMatch {
    /// Source namespaces (from the peer identity).
    pub namespaces: Vec<StringMatch>,
    /// Negated namespaces.
    pub not_namespaces: Vec<StringMatch>,
    /// Source principals (`spiffe://` stripped before matching).
    pub principals: Vec<StringMatch>,
    /// Negated principals.
    pub not_principals: Vec<StringMatch>,
    /// Source service accounts.
    pub service_accounts: Vec<ServiceAccountMatch>,
    /// Negated service accounts.
    pub not_service_accounts: Vec<ServiceAccountMatch>,
    /// Source IP ranges.
    pub source_ips: Vec<IpNet>,
    /// Negated source IP ranges.
    pub not_source_ips: Vec<IpNet>,
    /// Destination IP ranges.
    pub destination_ips: Vec<IpNet>,
    /// Negated destination IP ranges.
    pub not_destination_ips: Vec<IpNet>,
    /// Destination (target) ports.
    pub destination_ports: Vec<u16>,
    /// Negated destination ports.
    pub not_destination_ports: Vec<u16>,
}

/// An L4 authorization policy (Istio's `istio.security.Authorization`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Policy {
    /// Name.
    pub name: String,
    /// Namespace.
    pub namespace: String,
    /// Scope.
    pub scope: PolicyScope,
    /// Action.
    pub action: PolicyAction,
    /// Only log what it would do.
    pub dry_run: bool,
    /// Rules (OR) → clauses (AND) → matches (OR).
    pub rules: Vec<Vec<Vec<PolicyMatch>>>,
}

impl Policy {
    /// `namespace/name`, the key workloads use in `authorization_policies`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// What kind of plugin a spec loads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum PluginKind {
    /// Decides on connections (transport-policy world).
    Policy,
    /// Observes connection open and close (telemetry world).
    Telemetry,
}

/// What happens when a plugin call fails (trap, timeout, bad output).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum FailurePolicy {
    /// Deny the connection (default for policy plugins).
    FailClosed,
    /// Allow the connection (policy) / drop the event (telemetry).
    FailOpen,
}

/// Where a plugin's code comes from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum PluginSource {
    /// A file on the node, relative paths resolved against the config file's directory.
    Path(std::path::PathBuf),
    /// The component bytes themselves (base64 in the file).
    Inline(#[serde(serialize_with = "inline_len")] Arc<Vec<u8>>),
}

/// Which workloads a plugin applies to. Empty lists mean "all".
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadSelector {
    /// Namespaces of the local workload the connection belongs to.
    pub namespaces: Vec<String>,
    /// Workload names (pod names) or uids.
    pub workloads: Vec<String>,
}

/// Which connections a policy plugin sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PluginDirections {
    /// Run on inbound connections (destination side).
    pub inbound: bool,
    /// Run on outbound connections (source side; egress policy).
    pub outbound: bool,
}

impl Default for PluginDirections {
    fn default() -> Self {
        Self {
            inbound: true,
            outbound: false,
        }
    }
}

/// A plugin the node should run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PluginSpec {
    /// Unique name; a new spec with the same name replaces the old one (hot swap).
    pub name: String,
    /// Policy or telemetry.
    pub kind: PluginKind,
    /// The code.
    pub source: PluginSource,
    /// Expected sha256 of the code (hex), checked before compiling when present.
    pub sha256: Option<String>,
    /// The plugin's own configuration, handed to `configure` as a string (JSON).
    pub config: String,
    /// Failure policy.
    pub failure_policy: FailurePolicy,
    /// Lower runs first.
    pub priority: i32,
    /// Which workloads it applies to.
    pub selector: WorkloadSelector,
    /// Which directions (policy plugins).
    pub directions: PluginDirections,
    /// Re-check live connections when this plugin or its state changes (default true).
    pub recheck: bool,
    /// Probation of a new version of it (automatic rollback); `None`: the node's defaults.
    pub rollout: Option<PluginRollout>,
    /// A version decided beside this one, off the data path and never enforced (policy plugins); `None`: none.
    #[serde(skip_serializing_if = "Option::is_none", serialize_with = "shadow_ref")]
    pub shadow: Option<Arc<PluginShadow>>,
}

fn shadow_ref<S: serde::Serializer>(
    shadow: &Option<Arc<PluginShadow>>,
    s: S,
) -> Result<S::Ok, S::Error> {
    shadow.as_deref().serialize(s)
}

/// A shadow version of a plugin: other code or config, run on the same connections as the serving version and
/// compared with it, never enforced. Everything else (name, kind, selector, directions) is the serving spec's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PluginShadow {
    /// The shadow's code.
    pub source: PluginSource,
    /// Expected sha256 of the shadow's code (hex), checked before compiling when present.
    pub sha256: Option<String>,
    /// The shadow's configuration, handed to `configure`.
    pub config: String,
}

/// Probation of a newly swapped plugin version: if, within `window` after the swap and over at least `min_calls`
/// calls, the share of failed calls (traps, deadline overruns) exceeds `max_failure_ratio`, the node swaps the
/// previous version back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PluginRollout {
    /// How long after the swap the new version is on probation.
    pub window: std::time::Duration,
    /// Largest tolerated share of failed calls, in parts per million (integral so specs compare exactly).
    pub max_failure_ppm: u32,
    /// Calls needed before the ratio is judged.
    pub min_calls: u32,
    /// No probation for this plugin.
    pub disabled: bool,
}

impl PluginRollout {
    /// The tolerated failure ratio (0.0..=1.0).
    pub fn max_failure_ratio(&self) -> f64 {
        f64::from(self.max_failure_ppm) / 1e6
    }

    /// Parts per million of a ratio, clamped to 0..=1.
    pub fn ppm(ratio: f64) -> u32 {
        if ratio.is_nan() {
            return 0;
        }
        (ratio.clamp(0.0, 1.0) * 1e6).round() as u32
    }
}

fn inline_len<S: serde::Serializer>(bytes: &Arc<Vec<u8>>, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&format!("<{} bytes inline>", bytes.len()))
}

/// The one pod a per-pod data path (in-pod mode) serves, as the CNI node agent named it.
///
/// A workload of the mesh state is this pod when it runs on this node and either has the pod's uid or the pod's
/// name, namespace and service account (as ztunnel matches a ZDS pod to its xDS workload: the agent sends the
/// Kubernetes pod uid, istiod names workloads `<cluster>//Pod/<namespace>/<name>`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalPod {
    /// The pod uid the agent sent.
    pub uid: String,
    /// Pod name.
    pub name: String,
    /// Namespace.
    pub namespace: String,
    /// Service account.
    pub service_account: String,
}

impl LocalPod {
    /// Whether `w` is this pod (on node `node`).
    pub fn matches(&self, node: &str, w: &Workload) -> bool {
        w.node == node
            && (w.uid == self.uid
                || (w.name == self.name
                    && w.namespace == self.namespace
                    && w.service_account == self.service_account))
    }
}
