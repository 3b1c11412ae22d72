//! An immutable snapshot of the mesh with the indexes the data path needs (workload by IP, service by VIP or by
//! CIDR VIP).

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use ipnet::IpNet;

use crate::balance;
use crate::model::{LocalPod, PluginSpec, Policy, Service, TunnelProtocol, Visibility, Workload};
use crate::topology::{LbMode, NetworkMode};

mod waypoint;

pub use waypoint::{DEFAULT_WAYPOINT_PORT, WaypointHop};

/// One consistent view of the mesh. Built once per config change and shared read-only.
#[derive(Debug, Default)]
pub struct MeshState {
    /// Monotonic version of this snapshot (1 for the first load).
    pub version: u64,
    /// Workloads by uid.
    pub workloads: BTreeMap<String, Arc<Workload>>,
    /// Services by `namespace/hostname`.
    pub services: BTreeMap<String, Arc<Service>>,
    /// Policies by `namespace/name`.
    pub policies: BTreeMap<String, Arc<Policy>>,
    /// Plugin specs by name.
    pub plugins: BTreeMap<String, Arc<PluginSpec>>,
    /// The workload that owns each IP. HOST_NETWORK workloads are left out (their IP is the node's), and of
    /// several workloads claiming one IP the one [`claim_rank`] ranks highest owns it.
    by_ip: HashMap<IpAddr, Arc<Workload>>,
    /// Services by exact VIP, in the order they were indexed (services of several namespaces may share one).
    by_vip: HashMap<IpAddr, Vec<Arc<Service>>>,
    /// Services by CIDR VIP, in the order they were indexed: looked through when no exact VIP matches.
    by_cidr: Vec<(IpNet, Arc<Service>)>,
    /// Services by hostname, lowercased (one hostname may exist in several namespaces).
    by_host: HashMap<String, Vec<Arc<Service>>>,
    endpoints: HashMap<String, Vec<Arc<Workload>>>,
    rr: AtomicUsize,
}

/// Where a connection to some `ip:port` really goes.
#[derive(Debug, Clone)]
pub struct Resolved {
    /// The destination workload, if the address is (or the service resolved to) a known workload.
    pub workload: Option<Arc<Workload>>,
    /// The service, when a service VIP was targeted.
    pub service: Option<Arc<Service>>,
    /// The address to reach: workload IP and target port (or the original address for unknown destinations and
    /// for traffic handed to a waypoint, whose CONNECT authority it is).
    pub addr: SocketAddr,
    /// The waypoint the connection must go through, if any.
    pub waypoint: Option<WaypointHop>,
    /// The network gateway the connection must go through (the endpoint picked is on another network than the
    /// client's: HBONE inside HBONE, the inner tunnel to the endpoint, by service hostname), if any.
    pub network_gateway: Option<WaypointHop>,
}

impl Resolved {
    /// Whether the destination must be reached over HBONE.
    pub fn is_hbone(&self) -> bool {
        self.waypoint.is_some()
            || self.network_gateway.is_some()
            || self
                .workload
                .as_ref()
                .is_some_and(|w| w.protocol == TunnelProtocol::Hbone)
    }
}

/// Why a destination could not be resolved.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResolveError {
    /// A service VIP with no healthy endpoint.
    #[error("service {0} has no healthy endpoint")]
    NoHealthyEndpoint(String),
    /// A destination's waypoint is not in the state (or, as a service, has no instance serving its HBONE port).
    #[error("unknown waypoint {0}")]
    UnknownWaypoint(String),
    /// A destination's waypoint instance has no address.
    #[error("waypoint {0} has no address")]
    WaypointWithoutAddress(String),
    /// A workload's waypoint is on another network (only a service's waypoint is reached through a network gateway,
    /// as in ztunnel).
    #[error("waypoint {waypoint} is on network {network:?}, not the client's")]
    WaypointOnOtherNetwork {
        /// The waypoint.
        waypoint: String,
        /// Its network.
        network: String,
    },
    /// An endpoint on another network without a network gateway.
    #[error("workload {workload} is on network {network:?} and has no network gateway")]
    NoNetworkGateway {
        /// The endpoint.
        workload: String,
        /// Its network.
        network: String,
    },
    /// A network gateway is not in the state, or has no usable instance or address.
    #[error("unknown network gateway {0}")]
    UnknownNetworkGateway(String),
    /// A service VIP whose port is not declared.
    #[error("service {service} has no port {port}")]
    UnknownServicePort {
        /// Service key.
        service: String,
        /// Port asked for.
        port: u16,
    },
}

impl MeshState {
    /// Build a snapshot and its indexes.
    pub fn new(
        version: u64,
        workloads: Vec<Workload>,
        services: Vec<Service>,
        policies: Vec<Policy>,
        plugins: Vec<PluginSpec>,
    ) -> Self {
        Self::from_shared(
            version,
            workloads.into_iter().map(Arc::new),
            services.into_iter().map(Arc::new),
            policies.into_iter().map(Arc::new),
            plugins.into_iter().map(Arc::new),
        )
    }

    /// Build a snapshot from shared parts (the store's sources keep theirs, so a change copies no resource).
    pub fn from_shared(
        version: u64,
        workloads: impl IntoIterator<Item = Arc<Workload>>,
        services: impl IntoIterator<Item = Arc<Service>>,
        policies: impl IntoIterator<Item = Arc<Policy>>,
        plugins: impl IntoIterator<Item = Arc<PluginSpec>>,
    ) -> Self {
        let mut s = MeshState {
            version,
            ..Default::default()
        };
        for w in workloads {
            if w.network_mode == NetworkMode::HostNetwork {
                // Its addresses are the node's, shared with every other host-network pod: an address says nothing
                // about which of them a connection is for (ztunnel does not index these either). It is still a
                // service endpoint below, picked by uid.
                tracing::trace!(workload = %w.uid, "host-network workload: not indexed by IP");
            } else {
                for ip in &w.addresses {
                    s.claim_ip(*ip, &w);
                }
            }
            for svc in w.services.keys() {
                s.endpoints.entry(svc.clone()).or_default().push(w.clone());
            }
            s.workloads.insert(w.uid.clone(), w);
        }
        for svc in services {
            for (_, vip) in &svc.vips {
                let at = s.by_vip.entry(*vip).or_default();
                if !at.iter().any(|other| Arc::ptr_eq(other, &svc)) {
                    at.push(svc.clone());
                }
            }
            for (_, net) in &svc.cidr_vips {
                s.by_cidr.push((*net, svc.clone()));
            }
            s.by_host
                .entry(svc.hostname.to_ascii_lowercase())
                .or_default()
                .push(svc.clone());
            s.services.insert(svc.key(), svc);
        }
        for p in policies {
            s.policies.insert(p.key(), p);
        }
        for p in plugins {
            s.plugins.insert(p.name.clone(), p);
        }
        s
    }

    /// Index `w` under `ip`, unless a workload that ranks higher already owns it.
    fn claim_ip(&mut self, ip: IpAddr, w: &Arc<Workload>) {
        match self.by_ip.entry(ip) {
            Entry::Vacant(e) => {
                e.insert(w.clone());
            }
            Entry::Occupied(mut e) => {
                let other = e.get();
                if other.uid == w.uid {
                    return;
                }
                let (owner, loser) = if claim_rank(w) >= claim_rank(other) {
                    (w.clone(), other.clone())
                } else {
                    (other.clone(), w.clone())
                };
                tracing::debug!(%ip, owner = %owner.uid, other = %loser.uid,
                    "two workloads claim one IP; a Pod, then an HBONE workload, then the later one (by uid) owns it");
                e.insert(owner);
            }
        }
    }

    /// The workload that owns `ip`, if any (never a HOST_NETWORK workload).
    pub fn workload_by_ip(&self, ip: IpAddr) -> Option<&Arc<Workload>> {
        self.by_ip.get(&ip)
    }

    /// The service at `ip` as no particular client sees it (visibility does not apply): see
    /// [`MeshState::service_for`].
    pub fn service_by_vip(&self, ip: IpAddr) -> Option<&Arc<Service>> {
        self.service_at(ip, Viewer::Anyone)
    }

    /// The service a connection from the client `src` to `ip` is for, if any, as ztunnel picks it: of the services
    /// with the exact VIP `ip` that the client may see (a NAMESPACE service only from its own namespace; a client
    /// that is not a known workload sees PUBLIC services only), the one in the client's namespace, else a canonical
    /// one, else the first indexed; when none, the same among the CIDR VIPs containing `ip`, the client's
    /// namespace first, then the longest prefix, then a canonical one.
    pub fn service_for(&self, src: Option<&Workload>, ip: IpAddr) -> Option<&Arc<Service>> {
        self.service_at(ip, Viewer::client(src))
    }

    /// The service at `ip` for `viewer` (see [`MeshState::service_for`]).
    fn service_at(&self, ip: IpAddr, viewer: Viewer<'_>) -> Option<&Arc<Service>> {
        let ns = viewer.namespace();
        if let Some(found) = self
            .by_vip
            .get(&ip)
            .and_then(|at| best_match(at.iter().filter(|svc| viewer.sees(svc, ip)), ns))
        {
            return Some(found);
        }
        let mut best: Option<(CidrRank, &Arc<Service>)> = None;
        for (net, svc) in &self.by_cidr {
            if !net.contains(&ip) || !viewer.sees(svc, ip) {
                continue;
            }
            let rank = (
                ns.is_some_and(|n| svc.namespace == n),
                net.prefix_len(),
                svc.canonical,
            );
            if best.as_ref().is_none_or(|(r, _)| rank > *r) {
                best = Some((rank, svc));
            }
        }
        best.map(|(_, svc)| svc)
    }

    /// The services with this hostname (compared without case), in the order the source listed them.
    pub fn services_by_host(&self, hostname: &str) -> &[Arc<Service>] {
        let found = if hostname.bytes().any(|b| b.is_ascii_uppercase()) {
            self.by_host.get(&hostname.to_ascii_lowercase())
        } else {
            self.by_host.get(hostname)
        };
        found.map(Vec::as_slice).unwrap_or_default()
    }

    /// Every workload that backs the service `key` (`namespace/hostname`), healthy or not.
    pub fn endpoints_of(&self, key: &str) -> &[Arc<Workload>] {
        self.endpoints
            .get(key)
            .map(Vec::as_slice)
            .unwrap_or_default()
    }

    /// The workload that is `pod` on `node`, asked from `src` (the pod's own address when known): by uid, then
    /// by the source address, then by name, namespace and service account.
    pub fn local_pod(
        &self,
        node: &str,
        pod: &LocalPod,
        src: Option<IpAddr>,
    ) -> Option<&Arc<Workload>> {
        if let Some(w) = self
            .workloads
            .get(&pod.uid)
            .filter(|w| pod.matches(node, w))
        {
            return Some(w);
        }
        if let Some(w) = src
            .and_then(|ip| self.by_ip.get(&ip.to_canonical()))
            .filter(|w| pod.matches(node, w))
        {
            return Some(w);
        }
        self.workloads.values().find(|w| pod.matches(node, w))
    }

    /// Workloads that run on `node`.
    pub fn local_workloads<'a>(
        &'a self,
        node: &'a str,
    ) -> impl Iterator<Item = &'a Arc<Workload>> + 'a {
        self.workloads.values().filter(move |w| w.node == node)
    }

    /// Resolve an original destination as seen by no particular client (see [`MeshState::resolve_from`]).
    pub fn resolve(&self, dst: SocketAddr) -> Result<Resolved, ResolveError> {
        self.resolve_from(None, dst)
    }

    /// Resolve an original destination for the client workload `src` (when known): a service VIP or CIDR VIP the
    /// client may see (→ an endpoint of the best locality tier for `src`, round robin, with the endpoint's target
    /// port; or the original address for a PASSTHROUGH service; see [`MeshState::service_for`]), a workload IP, or
    /// an address outside the mesh (passed through as is).
    pub fn resolve_from(
        &self,
        src: Option<&Workload>,
        dst: SocketAddr,
    ) -> Result<Resolved, ResolveError> {
        if let Some(svc) = self.service_for(src, dst.ip()) {
            // Service-addressed: the service's waypoint, if it has one (a workload's own waypoint is for traffic
            // addressed to the workload: Istio sets each one by the waypoint's traffic type).
            if let Some(gw) = self.service_waypoint(svc) {
                let hop = self.waypoint_hop(gw, src, true)?;
                // A waypoint on another network is reached through that network's gateway (double HBONE).
                let network_gateway = match src {
                    Some(src) if src.network != hop.workload.network => {
                        let Some(ngw) = &hop.workload.network_gateway else {
                            return Err(ResolveError::NoNetworkGateway {
                                workload: hop.workload.uid.clone(),
                                network: hop.workload.network.clone(),
                            });
                        };
                        Some(self.gateway_hop(ngw, Some(src))?)
                    }
                    _ => None,
                };
                return Ok(Resolved {
                    workload: None,
                    service: Some(svc.clone()),
                    addr: dst,
                    waypoint: Some(hop),
                    network_gateway,
                });
            }
            return self.resolve_service(src, svc, dst);
        }
        let workload = self.by_ip.get(&dst.ip()).cloned();
        let waypoint = match &workload {
            Some(w) if !self.is_from_waypoint(w, src) => match &w.waypoint {
                Some(gw) => Some(self.waypoint_hop(gw, src, false)?),
                None => None,
            },
            _ => None,
        };
        Ok(Resolved {
            workload,
            service: None,
            addr: dst,
            waypoint,
            network_gateway: None,
        })
    }

    fn resolve_service(
        &self,
        src: Option<&Workload>,
        svc: &Arc<Service>,
        dst: SocketAddr,
    ) -> Result<Resolved, ResolveError> {
        if svc
            .load_balancing
            .as_ref()
            .is_some_and(|lb| lb.mode == LbMode::Passthrough)
        {
            // No endpoint picking: the client's own destination, as it dialled it.
            return Ok(Resolved {
                workload: None,
                service: Some(svc.clone()),
                addr: dst,
                waypoint: None,
                network_gateway: None,
            });
        }
        let key = svc.key();
        let Some(&svc_target) = svc.ports.get(&dst.port()) else {
            return Err(ResolveError::UnknownServicePort {
                service: key,
                port: dst.port(),
            });
        };
        let eligible = self
            .endpoints_of(&key)
            .iter()
            .filter(|w| balance::eligible(svc, w, src));
        let tier = balance::best_tier(src, svc, eligible);
        let turn = self.rr.fetch_add(1, Ordering::Relaxed);
        let Some(pick) = balance::pick(&tier, turn) else {
            return Err(ResolveError::NoHealthyEndpoint(key));
        };
        if let Some(src) = src
            && pick.network != src.network
        {
            // Another network: through the endpoint's network gateway, to the service by hostname and port.
            let Some(gw) = &pick.network_gateway else {
                return Err(ResolveError::NoNetworkGateway {
                    workload: pick.uid.clone(),
                    network: pick.network.clone(),
                });
            };
            let hop = self.gateway_hop(gw, Some(src))?;
            return Ok(Resolved {
                workload: Some(pick.clone()),
                service: Some(svc.clone()),
                addr: dst,
                waypoint: None,
                network_gateway: Some(hop),
            });
        }
        // The endpoint's own port map wins; then the service's target port; then the service port.
        let port = pick
            .services
            .get(&key)
            .and_then(|m| m.get(&dst.port()).copied())
            .filter(|p| *p != 0)
            .or(Some(svc_target).filter(|p| *p != 0))
            .unwrap_or(dst.port());
        Ok(Resolved {
            workload: Some(pick.clone()),
            service: Some(svc.clone()),
            addr: SocketAddr::new(pick.addresses[0], port),
            waypoint: None,
            network_gateway: None,
        })
    }
}

/// How strongly a workload claims an IP it shares with others (higher wins), as ztunnel ranks them: a Pod (istiod
/// names pod workloads `<cluster>//Pod/<namespace>/<name>`), which cannot be spoofed the way an EndpointSlice or a
/// WorkloadEntry address can, then a workload in the mesh (HBONE).
fn claim_rank(w: &Workload) -> (bool, bool) {
    (
        w.uid.contains("//Pod/"),
        w.protocol == TunnelProtocol::Hbone,
    )
}

/// How well a CIDR VIP containing an address matches for a client, compared in order: the service is in the
/// client's namespace, the prefix length, the service is canonical (ztunnel's `CidrMatchRank`).
type CidrRank = (bool, u8, bool);

/// Of services sharing one address, the one a client in `namespace` means: its own namespace's at once, else the
/// last canonical one, else the first (ztunnel's `find_best_match`).
fn best_match<'a>(
    services: impl Iterator<Item = &'a Arc<Service>>,
    namespace: Option<&str>,
) -> Option<&'a Arc<Service>> {
    let mut first = None;
    let mut canonical = None;
    for svc in services {
        if namespace == Some(svc.namespace.as_str()) {
            return Some(svc);
        }
        if svc.canonical {
            canonical = Some(svc);
        }
        first.get_or_insert(svc);
    }
    canonical.or(first)
}

/// Who looks a service up by address: service visibility applies to clients only.
#[derive(Debug, Clone, Copy)]
enum Viewer<'a> {
    /// No client: the inbound side checking what a CONNECT names, or an inspection. Every service is visible.
    Anyone,
    /// A client, with its namespace when it is a known workload (one that is not sees PUBLIC services only).
    Client(Option<&'a str>),
}

impl<'a> Viewer<'a> {
    /// The viewer for the client workload `src`.
    fn client(src: Option<&'a Workload>) -> Self {
        Viewer::Client(src.map(|w| w.namespace.as_str()))
    }

    fn namespace(self) -> Option<&'a str> {
        match self {
            Viewer::Anyone => None,
            Viewer::Client(ns) => ns,
        }
    }

    /// Whether this viewer may see `svc` (found at `ip`, for the log).
    fn sees(self, svc: &Service, ip: IpAddr) -> bool {
        let visible = match self {
            Viewer::Anyone => true,
            Viewer::Client(Some(ns)) => svc.visible_to(ns),
            Viewer::Client(None) => svc.visibility == Visibility::Public,
        };
        if !visible {
            tracing::debug!(service = %svc.key(), client_namespace = self.namespace().unwrap_or(""), %ip,
                "service not visible to the client's namespace: not routed to it");
        }
        visible
    }
}
