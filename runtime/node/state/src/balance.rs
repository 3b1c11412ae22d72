//! Service endpoint picking as ztunnel does it: which endpoints are eligible (health, an address), which of them
//! form the best locality tier for the client (the service's `loadBalancing` routing preferences with STRICT or
//! FAILOVER), and a capacity-weighted round robin within that tier only.

use std::sync::Arc;

use crate::model::{Service, Workload};
use crate::topology::{LbMode, LbScope};

/// Whether `wl` may be picked at all for `svc` by the client `src`: healthy (or the service allows every endpoint)
/// and reachable: at an address of its own, or (on another network than the client's) through its network gateway.
pub(crate) fn eligible(svc: &Service, wl: &Workload, src: Option<&Workload>) -> bool {
    let other_network = src.is_some_and(|s| s.network != wl.network);
    svc.includes_endpoint(wl)
        && (!wl.addresses.is_empty() || (other_network && wl.network_gateway.is_some()))
}

/// Whether `wl` is in `scope` of the client `src`.
fn same(scope: LbScope, src: &Workload, wl: &Workload) -> bool {
    match scope {
        LbScope::Region => src.locality.region == wl.locality.region,
        LbScope::Zone => src.locality.zone == wl.locality.zone,
        LbScope::Subzone => src.locality.subzone == wl.locality.subzone,
        LbScope::Node => src.node == wl.node,
        LbScope::Cluster => src.cluster_id == wl.cluster_id,
        LbScope::Network => src.network == wl.network,
    }
}

/// How well `wl` matches the client's preferences: `(rank, every preference matched)`; a higher rank is a better
/// tier.
///
/// Preferences count from the first one until the first that does not match (so `[region, zone]` ranks "same zone
/// in another region" like "another region"). A leading `network` preference is special, as in ztunnel: an endpoint
/// on the client's network outranks every endpoint on another network, and for endpoints on another network the
/// remaining preferences still count (so failover to another network still prefers the closest locality there).
pub(crate) fn rank(src: &Workload, wl: &Workload, prefs: &[LbScope]) -> (usize, bool) {
    let network_first = prefs.first() == Some(&LbScope::Network);
    if !network_first {
        let leading = prefs.iter().take_while(|s| same(**s, src, wl)).count();
        return (leading, leading == prefs.len());
    }
    let on_network = src.network == wl.network;
    let rest = &prefs[1..];
    let mut leading = 0;
    for scope in rest {
        if same(*scope, src, wl) {
            leading += 1;
        } else if *scope == LbScope::Network {
            // Another network: a repeated network preference is skipped rather than ending the count.
            continue;
        } else {
            break;
        }
    }
    if on_network {
        // Above any endpoint on another network, whose rank is at most `rest.len()`.
        (1 + leading + rest.len(), leading == rest.len())
    } else {
        (leading, false)
    }
}

/// The endpoints a client `src` may be sent to: the eligible ones of the best tier the service's load balancing
/// allows. No settings, or mode STANDARD: every eligible endpoint. STRICT: only endpoints matching every preference.
/// FAILOVER: the best-ranked endpoints. Without a known client (`src` None) no preference matches, so STRICT leaves
/// nothing and FAILOVER keeps every eligible endpoint.
pub(crate) fn best_tier<'a>(
    src: Option<&Workload>,
    svc: &Service,
    eligible: impl Iterator<Item = &'a Arc<Workload>>,
) -> Vec<&'a Arc<Workload>> {
    let lb = match &svc.load_balancing {
        Some(lb) if matches!(lb.mode, LbMode::Strict | LbMode::Failover) => lb,
        _ => return eligible.collect(),
    };
    let ranked: Vec<(usize, &'a Arc<Workload>)> = eligible
        .filter_map(|wl| {
            let (rank, all) = match src {
                Some(src) => rank(src, wl, &lb.routing_preference),
                None => (0, lb.routing_preference.is_empty()),
            };
            (lb.mode != LbMode::Strict || all).then_some((rank, wl))
        })
        .collect();
    let Some(best) = ranked.iter().map(|(r, _)| *r).max() else {
        return Vec::new();
    };
    ranked
        .into_iter()
        .filter(|(r, _)| *r == best)
        .map(|(_, wl)| wl)
        .collect()
}

/// The endpoint for round-robin turn `turn` among `tier`, each endpoint taking as many turns as its capacity
/// (capacity 0: never picked; `None` when no endpoint has capacity, as ztunnel's weighted choice fails then).
pub(crate) fn pick<'a>(tier: &[&'a Arc<Workload>], turn: usize) -> Option<&'a Arc<Workload>> {
    let total: u64 = tier.iter().map(|w| u64::from(w.capacity)).sum();
    if total == 0 {
        return None;
    }
    let mut at = (turn as u64) % total;
    for wl in tier {
        let c = u64::from(wl.capacity);
        if at < c {
            return Some(wl);
        }
        at -= c;
    }
    None
}

#[cfg(test)]
mod tests;
