//! Finding a mesh service for a query as its client sees it (aliases, wildcards, visibility, the client's
//! namespace first), and the addresses to answer with (the VIPs on the client's network, or a headless
//! service's endpoint addresses, the endpoints it includes only), by record family.

use std::net::IpAddr;
use std::sync::Arc;

use rand::seq::SliceRandom;
use weft_state::{MeshState, Service, Workload};

use crate::names::{self, Alias, Labels};

/// The address family a query asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Family {
    /// A records.
    V4,
    /// AAAA records.
    V6,
}

impl Family {
    fn accepts(self, ip: IpAddr) -> bool {
        match self {
            Family::V4 => ip.is_ipv4(),
            Family::V6 => ip.is_ipv6(),
        }
    }
}

/// A mesh service that answers a query.
#[derive(Debug)]
pub(crate) struct Found {
    /// The service.
    pub service: Arc<Service>,
    /// The alias that found it.
    pub alias: Alias,
    /// Whether it was found through a wildcard host (`*.example.com`).
    pub wildcard: bool,
}

/// The service a client means by `query`, if any: every alias in order, each through its wildcards; among the
/// services of one hostname, those the client may see, its own namespace's first, then a canonical one, then the
/// first listed. A service with no VIP counts only when it is a Kubernetes (headless) service of the cluster
/// domain; other VIP-less hosts are left to the upstream resolvers.
pub(crate) fn find(
    state: &MeshState,
    client: &Workload,
    query: &Labels,
    cluster_domain: &str,
) -> Option<Found> {
    let svc_suffix = format!(".svc.{}", cluster_domain.trim_end_matches('.'));
    for alias in names::aliases(query, &client.namespace, cluster_domain) {
        for (i, host) in names::wildcards(&alias.labels).into_iter().enumerate() {
            let candidates = state.services_by_host(&host).iter().filter(|s| {
                (!s.is_headless() || s.hostname.to_ascii_lowercase().ends_with(&svc_suffix))
                    && s.visible_to(&client.namespace)
            });
            if let Some(service) = best_match(candidates, &client.namespace) {
                return Some(Found {
                    service: service.clone(),
                    alias,
                    wildcard: i > 0,
                });
            }
        }
    }
    None
}

/// The client's own namespace wins at once; otherwise a canonical service; otherwise the first.
fn best_match<'a>(
    services: impl Iterator<Item = &'a Arc<Service>>,
    namespace: &str,
) -> Option<&'a Arc<Service>> {
    let mut first = None;
    let mut canonical = None;
    for s in services {
        if s.namespace == namespace {
            return Some(s);
        }
        if s.canonical && canonical.is_none() {
            canonical = Some(s);
        }
        first.get_or_insert(s);
    }
    canonical.or(first)
}

/// Whether the service serves this family at all (its declared IP families; none declared: any).
pub(crate) fn family_allowed(service: &Service, family: Family) -> bool {
    match service.ip_families {
        Some(f) => match family {
            Family::V4 => f.accepts(IpAddr::from([0, 0, 0, 0])),
            Family::V6 => f.accepts(IpAddr::from([0u16; 8])),
        },
        None => true,
    }
}

/// The addresses to answer with, shuffled: a VIP service's VIPs on the client's network, or a headless service's
/// endpoints (each endpoint's first address of the family; an unhealthy endpoint only when the service's health
/// policy is ALLOW_ALL, as ztunnel, which leaves it out of the service's endpoints).
pub(crate) fn addresses(
    state: &MeshState,
    client: &Workload,
    service: &Service,
    family: Family,
) -> Vec<IpAddr> {
    let mut out: Vec<IpAddr> = if service.is_headless() {
        state
            .endpoints_of(&service.key())
            .iter()
            .filter(|w| service.includes_endpoint(w))
            .filter_map(|w| w.addresses.iter().copied().find(|ip| family.accepts(*ip)))
            .collect()
    } else {
        service
            .vips
            .iter()
            .filter(|(network, ip)| *network == client.network && family.accepts(*ip))
            .map(|(_, ip)| *ip)
            .collect()
    };
    out.shuffle(&mut rand::rng());
    out
}
