//! Waypoints as ztunnel finds them: which waypoint a destination is reached through (a service's for traffic to
//! its VIP, a workload's for traffic to its own address), the waypoint instance picked behind a waypoint service,
//! and whether a client or a local workload *is* a destination's waypoint (sandwich checks).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::{MeshState, ResolveError, Viewer};
use crate::balance;
use crate::model::{Service, Workload};
use crate::topology::{GatewayAddress, GatewayDestination};

/// The HBONE port of a waypoint whose address leaves it unset (xDS sends 0 then).
pub const DEFAULT_WAYPOINT_PORT: u16 = 15008;

/// Where a connection is handed to its destination's waypoint.
#[derive(Debug, Clone)]
pub struct WaypointHop {
    /// The waypoint instance (a workload: its identity is the one the tunnel must present).
    pub workload: Arc<Workload>,
    /// The waypoint's service, when the waypoint was named as one (its SANs are accepted too).
    pub service: Option<Arc<Service>>,
    /// The address HBONE is opened to: the instance's address and its HBONE port (unspecified for an instance on
    /// another network without an address: it is reached through its network gateway).
    pub addr: SocketAddr,
}

impl WaypointHop {
    /// Every identity the waypoint may present: the instance's and its service's SANs.
    pub fn identities(&self) -> Vec<String> {
        let mut ids = vec![self.workload.spiffe_id()];
        if let Some(svc) = &self.service {
            ids.extend(svc.subject_alt_names.iter().cloned());
        }
        ids
    }
}

/// What a gateway address names in the state.
enum Named<'a> {
    Service(&'a Arc<Service>),
    Workload(&'a Arc<Workload>),
}

impl MeshState {
    /// The waypoint a service's traffic goes through: one of its weighted waypoints (by weight, in turn) when it
    /// has a usable set, else its `waypoint`.
    pub(super) fn service_waypoint<'a>(&self, svc: &'a Service) -> Option<&'a GatewayAddress> {
        let total: u64 = svc
            .weighted_waypoints
            .iter()
            .map(|w| u64::from(w.weight))
            .sum();
        if total > 0 {
            let mut at = (self.rr.fetch_add(1, Ordering::Relaxed) as u64) % total;
            for w in &svc.weighted_waypoints {
                let weight = u64::from(w.weight);
                if at < weight {
                    return Some(&w.destination);
                }
                at -= weight;
            }
        }
        svc.waypoint.as_ref()
    }

    /// What `dest` names for `viewer`: by address, a service it may see (see [`MeshState::service_for`]), else a
    /// workload; by hostname, the service of that namespace (visibility does not apply, as in ztunnel), else a
    /// workload.
    fn named(&self, dest: &GatewayDestination, viewer: Viewer<'_>) -> Option<Named<'_>> {
        match dest {
            GatewayDestination::Address { ip, .. } => self
                .service_at(*ip, viewer)
                .map(Named::Service)
                .or_else(|| self.by_ip.get(ip).map(Named::Workload)),
            GatewayDestination::Hostname {
                namespace,
                hostname,
            } => self
                .services_by_host(hostname)
                .iter()
                .find(|s| &s.namespace == namespace)
                .map(Named::Service)
                .or_else(|| {
                    self.workloads
                        .values()
                        .find(|w| w.hostname == *hostname && w.namespace == *namespace)
                        .map(Named::Workload)
                }),
        }
    }

    /// The waypoint instance for `gw` as seen by the client `src`: a waypoint service picks one of its instances
    /// (the client's best locality tier, round robin; instances must serve the HBONE port or have an application
    /// tunnel), a waypoint workload is itself. Unknown, or a service with no usable instance: `UnknownWaypoint`
    /// (ztunnel fails the connection rather than bypass the waypoint).
    ///
    /// An instance on another network than the client's is `WaypointOnOtherNetwork` unless `through_gateway` (then
    /// the caller reaches it through that network's gateway, and `addr` is unspecified when it has no address).
    pub(super) fn waypoint_hop(
        &self,
        gw: &GatewayAddress,
        src: Option<&Workload>,
        through_gateway: bool,
    ) -> Result<WaypointHop, ResolveError> {
        self.hop(gw, src, Viewer::client(src), through_gateway)
    }

    /// [`MeshState::waypoint_hop`], with `src` the client whose locality and network count (none for a network
    /// gateway) and `viewer` the one whose service visibility applies to a waypoint named by address.
    fn hop(
        &self,
        gw: &GatewayAddress,
        src: Option<&Workload>,
        viewer: Viewer<'_>,
        through_gateway: bool,
    ) -> Result<WaypointHop, ResolveError> {
        let port = match gw.hbone_mtls_port {
            0 => DEFAULT_WAYPOINT_PORT,
            p => p,
        };
        let unknown = || ResolveError::UnknownWaypoint(gw.destination.to_string());
        let (workload, service, port) =
            match self.named(&gw.destination, viewer).ok_or_else(unknown)? {
                Named::Workload(w) => (w.clone(), None, port),
                Named::Service(svc) => {
                    let key = svc.key();
                    let svc_target = svc.ports.get(&port).copied();
                    let eligible = self.endpoints_of(&key).iter().filter(|w| {
                        balance::eligible(svc, w, src)
                            && (svc_target.is_some() || w.application_tunnel.is_some())
                    });
                    let tier = balance::best_tier(src, svc, eligible);
                    let pick = balance::pick(&tier, self.rr.fetch_add(1, Ordering::Relaxed))
                        .ok_or_else(unknown)?;
                    let target = pick
                        .services
                        .get(&key)
                        .and_then(|m| m.get(&port).copied())
                        .filter(|p| *p != 0)
                        .or(svc_target.filter(|p| *p != 0))
                        .unwrap_or(port);
                    (pick.clone(), Some(svc.clone()), target)
                }
            };
        let remote = src.is_some_and(|src| src.network != workload.network);
        if remote && !through_gateway {
            return Err(ResolveError::WaypointOnOtherNetwork {
                waypoint: gw.destination.to_string(),
                network: workload.network.clone(),
            });
        }
        let ip = match workload.addresses.first().copied() {
            Some(ip) => ip,
            // Reached through its network's gateway: its own address is not dialled (and may be unknown here).
            None if remote => IpAddr::from([0, 0, 0, 0]),
            None => {
                return Err(ResolveError::WaypointWithoutAddress(
                    gw.destination.to_string(),
                ));
            }
        };
        Ok(WaypointHop {
            workload,
            service,
            addr: SocketAddr::new(ip, port),
        })
    }

    /// The network gateway instance for `gw` (named like a waypoint: an address or a hostname) as the client `src`
    /// finds it (its service visibility applies to a gateway named by address). A gateway lives on the remote
    /// network, so there is no network check, and its instances are picked without the client's locality; every
    /// failure is `UnknownNetworkGateway`.
    pub(super) fn gateway_hop(
        &self,
        gw: &GatewayAddress,
        src: Option<&Workload>,
    ) -> Result<WaypointHop, ResolveError> {
        self.hop(gw, None, Viewer::client(src), false)
            .map_err(|_| ResolveError::UnknownNetworkGateway(gw.destination.to_string()))
    }

    /// Whether the workload `wl` is one of the instances of the waypoint `gw`.
    fn is_instance_of(&self, gw: &GatewayAddress, wl: &Workload) -> bool {
        match self.named(&gw.destination, Viewer::Anyone) {
            Some(Named::Workload(w)) => w.uid == wl.uid,
            Some(Named::Service(svc)) => wl.services.contains_key(&svc.key()),
            None => false,
        }
    }

    /// Whether the client `src` is the waypoint of `dst` (a waypoint's own outbound traffic to its destination
    /// must not be sent to the waypoint again).
    pub(super) fn is_from_waypoint(&self, dst: &Workload, src: Option<&Workload>) -> bool {
        match (src, &dst.waypoint) {
            (Some(src), Some(gw)) => self.is_instance_of(gw, src),
            _ => false,
        }
    }

    /// Whether the local workload `wl` is the waypoint of what `target` addresses (a service VIP or a workload
    /// IP): the one case where an inbound CONNECT may name an address that is not the workload's own.
    pub fn is_waypoint_for(&self, target: IpAddr, wl: &Workload) -> bool {
        let gw = match self.service_at(target, Viewer::Anyone) {
            Some(svc) => svc.waypoint.as_ref(),
            None => self.by_ip.get(&target).and_then(|w| w.waypoint.as_ref()),
        };
        gw.is_some_and(|gw| self.is_instance_of(gw, wl))
    }
}
