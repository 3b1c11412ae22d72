//! Table-driven tests of locality-aware endpoint picking through `MeshState::resolve_from`: many endpoints across
//! regions, zones, subzones, nodes, clusters and networks; STRICT, FAILOVER, STANDARD and no settings; health
//! policies; capacity-weighted round robin inside the best tier only.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::Path;

use crate::local::parse;
use crate::{MeshState, ResolveError};

/// Clients (no service) and endpoints of `ns/svc.example` (VIP 10.96.0.1:80 → 8080).
/// Columns: uid, region, zone, subzone, node, cluster, network, extra.
/// One row of [`WORKLOADS`].
type Row = (
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    &'static str,
);

const WORKLOADS: &[Row] = &[
    // clients
    ("client", "r1", "z1", "s1", "n1", "c1", "net1", "client"),
    ("client-r3", "r3", "z7", "s7", "n9", "c1", "net1", "client"),
    (
        "client-net3",
        "r1",
        "z1",
        "s1",
        "n9",
        "c1",
        "net3",
        "client",
    ),
    // endpoints
    ("e-node", "r1", "z1", "s1", "n1", "c1", "net1", ""),
    ("e-subzone", "r1", "z1", "s1", "n2", "c1", "net1", ""),
    ("e-zone", "r1", "z1", "s2", "n3", "c1", "net1", ""),
    ("e-region", "r1", "z2", "s1", "n4", "c1", "net1", ""),
    ("e-far", "r2", "z1", "s1", "n5", "c1", "net1", ""),
    ("e-cluster2", "r1", "z1", "s1", "n6", "c2", "net1", ""),
    ("e-net2-close", "r1", "z1", "s1", "n7", "c1", "net2", ""),
    ("e-net2-far", "r2", "z9", "s9", "n8", "c1", "net2", ""),
    ("e-sick-node", "r1", "z1", "s1", "n1", "c1", "net1", "sick"),
    ("e-noip-node", "r1", "z1", "s1", "n1", "c1", "net1", "noip"),
];

fn mesh(load_balancer: &str) -> MeshState {
    let mut y = String::from("workloads:\n");
    for (i, (uid, region, zone, subzone, node, cluster, network, extra)) in
        WORKLOADS.iter().enumerate()
    {
        y.push_str(&format!(
            "- uid: {uid}\n  name: {uid}\n  namespace: ns\n  protocol: HBONE\n  node: {node}\n  clusterId: {cluster}\n  \
             network: {network}\n  locality: {{region: {region}, zone: {zone}, subzone: {subzone}}}\n"
        ));
        if *extra != "noip" {
            y.push_str(&format!("  workloadIps: [10.0.0.{}]\n", i + 1));
        }
        if *extra == "sick" {
            y.push_str("  status: Unhealthy\n");
        }
        if *extra != "client" {
            y.push_str("  services: {ns/svc.example: {80: 8080}}\n");
        }
        if *extra != "client" {
            // Every network has a gateway (used only by clients on other networks).
            let gw = if *network == "net2" {
                "10.0.1.2"
            } else {
                "10.0.1.1"
            };
            y.push_str(&format!(
                "  networkGateway: {{destination: {network}/{gw}}}\n"
            ));
        }
    }
    y.push_str(
        "- {uid: gw-net1, namespace: istio-system, workloadIps: [10.0.1.1], network: net1}\n",
    );
    y.push_str(
        "- {uid: gw-net2, namespace: istio-system, workloadIps: [10.0.1.2], network: net2}\n",
    );
    y.push_str("services:\n- name: svc\n  namespace: ns\n  hostname: svc.example\n  vips: [/10.96.0.1]\n  ports: {80: 8080}\n");
    if !load_balancer.is_empty() {
        y.push_str(&format!("  loadBalancer: {load_balancer}\n"));
    }
    parse(&y, Path::new("/")).unwrap().into_state(1)
}

const VIP: &str = "10.96.0.1:80";

/// Every endpoint `client` is sent to over enough turns to cover the tier twice.
fn picked(state: &MeshState, client: &str) -> Result<BTreeSet<String>, ResolveError> {
    let src = state.workloads.get(client).unwrap().clone();
    let mut seen = BTreeSet::new();
    for _ in 0..2 * WORKLOADS.len() {
        let r = state.resolve_from(Some(&src), VIP.parse().unwrap())?;
        let wl = r.workload.unwrap();
        if wl.network == src.network {
            assert_eq!(r.addr, SocketAddr::new(wl.addresses[0], 8080));
        } else {
            // Another network: through its gateway, to the service as dialled.
            let gw = r.network_gateway.unwrap().workload;
            assert_eq!(gw.uid, format!("gw-{}", wl.network));
            assert_eq!(r.addr, VIP.parse().unwrap());
        }
        seen.insert(wl.uid.clone());
    }
    Ok(seen)
}

fn set(uids: &[&str]) -> BTreeSet<String> {
    uids.iter().map(|s| s.to_string()).collect()
}

const ALL_HEALTHY: &[&str] = &[
    "e-node",
    "e-subzone",
    "e-zone",
    "e-region",
    "e-far",
    "e-cluster2",
    "e-net2-close",
    "e-net2-far",
];

#[test]
fn the_best_tier_for_each_preference_and_mode() {
    // (what, loadBalancer, client, expected endpoints; empty: no endpoint at all)
    let table: &[(&str, &str, &str, &[&str])] = &[
        (
            "default: no settings, every healthy endpoint with an address",
            "",
            "client",
            ALL_HEALTHY,
        ),
        (
            "STANDARD ignores the preferences",
            "{mode: Standard, routingPreferences: [Node]}",
            "client",
            ALL_HEALTHY,
        ),
        (
            "FAILOVER region/zone/subzone: the closest tier, whatever node, cluster or network",
            "{mode: Failover, routingPreferences: [Region, Zone, Subzone]}",
            "client",
            &["e-node", "e-subzone", "e-cluster2", "e-net2-close"],
        ),
        (
            "FAILOVER down to the node",
            "{mode: Failover, routingPreferences: [Region, Zone, Subzone, Node]}",
            "client",
            &["e-node"],
        ),
        (
            "preferences count only until the first mismatch (zone z1 in region r2 is no better than r2)",
            "{mode: Failover, routingPreferences: [Zone, Region]}",
            "client",
            &[
                "e-node",
                "e-subzone",
                "e-zone",
                "e-cluster2",
                "e-net2-close",
            ],
        ),
        (
            "STRICT region: every endpoint in the region, none outside",
            "{mode: Strict, routingPreferences: [Region]}",
            "client",
            &[
                "e-node",
                "e-subzone",
                "e-zone",
                "e-region",
                "e-cluster2",
                "e-net2-close",
            ],
        ),
        (
            "FAILOVER cluster",
            "{mode: Failover, routingPreferences: [Cluster]}",
            "client",
            &[
                "e-node",
                "e-subzone",
                "e-zone",
                "e-region",
                "e-far",
                "e-net2-close",
                "e-net2-far",
            ],
        ),
        (
            "a leading network preference: the client's network first, then locality on it",
            "{mode: Failover, routingPreferences: [Network, Region, Zone, Subzone]}",
            "client",
            &["e-node", "e-subzone", "e-cluster2"],
        ),
        (
            "no endpoint on the client's network: locality still ranks the other networks (through their gateways: an endpoint without an address counts too)",
            "{mode: Failover, routingPreferences: [Network, Zone]}",
            "client-net3",
            &[
                "e-node",
                "e-noip-node",
                "e-subzone",
                "e-zone",
                "e-far",
                "e-cluster2",
                "e-net2-close",
            ],
        ),
        (
            "STRICT with a leading network and no endpoint on the client's network: nothing",
            "{mode: Strict, routingPreferences: [Network, Zone]}",
            "client-net3",
            &[],
        ),
        (
            "FAILOVER with nothing close: every endpoint (rank 0 is the best there is)",
            "{mode: Failover, routingPreferences: [Region, Zone]}",
            "client-r3",
            ALL_HEALTHY,
        ),
        (
            "STRICT with nothing close: no endpoint",
            "{mode: Strict, routingPreferences: [Region, Zone]}",
            "client-r3",
            &[],
        ),
        (
            "STRICT with no preferences: every endpoint matches all of none",
            "{mode: Strict}",
            "client",
            ALL_HEALTHY,
        ),
        (
            "ALLOW_ALL: the unhealthy endpoint on the node is picked too",
            "{mode: Failover, routingPreferences: [Region, Zone, Subzone, Node], healthPolicy: AllowAll}",
            "client",
            &["e-node", "e-sick-node"],
        ),
        (
            "ONLY_HEALTHY (explicit) as the default",
            "{mode: Strict, routingPreferences: [Node], healthPolicy: OnlyHealthy}",
            "client",
            &["e-node"],
        ),
    ];
    for (what, lb, client, expected) in table {
        let state = mesh(lb);
        let got = picked(&state, client);
        if expected.is_empty() {
            assert_eq!(
                got,
                Err(ResolveError::NoHealthyEndpoint("ns/svc.example".into())),
                "{what}"
            );
        } else {
            assert_eq!(got.unwrap(), set(expected), "{what}");
        }
    }
}

#[test]
fn failover_moves_to_the_next_tier_when_the_best_one_is_unhealthy() {
    let lb = "{mode: Failover, routingPreferences: [Region, Zone, Subzone, Node]}";
    let state = mesh(lb);
    assert_eq!(picked(&state, "client").unwrap(), set(&["e-node"]));
    // The same mesh with e-node unhealthy: the next tier (same subzone) takes over.
    let mut workloads: Vec<_> = state.workloads.values().map(|w| (**w).clone()).collect();
    for w in &mut workloads {
        if w.uid == "e-node" {
            w.healthy = false;
        }
    }
    let services = state.services.values().map(|s| (**s).clone()).collect();
    let next = MeshState::new(2, workloads, services, vec![], vec![]);
    assert_eq!(
        picked(&next, "client").unwrap(),
        set(&["e-subzone", "e-cluster2", "e-net2-close"])
    );
}

#[test]
fn round_robin_inside_the_tier_follows_capacity() {
    let y = "workloads:
- {uid: big, namespace: ns, workloadIps: [10.0.0.1], capacity: 3, services: {ns/s.example: {80: 80}}}
- {uid: small, namespace: ns, workloadIps: [10.0.0.2], services: {ns/s.example: {80: 80}}}
- {uid: none, namespace: ns, workloadIps: [10.0.0.3], capacity: 0, services: {ns/s.example: {80: 80}}}
- {uid: zero, namespace: ns, workloadIps: [10.0.0.4], capacity: 0, services: {ns/z.example: {80: 80}}}
services:
- {name: s, namespace: ns, hostname: s.example, vips: [/10.96.0.1], ports: {80: 80}}
- {name: z, namespace: ns, hostname: z.example, vips: [/10.96.0.2], ports: {80: 80}}
";
    let state = parse(y, Path::new("/")).unwrap().into_state(1);
    let mut counts = BTreeMap::new();
    for _ in 0..40 {
        let r = state.resolve("10.96.0.1:80".parse().unwrap()).unwrap();
        *counts.entry(r.workload.unwrap().uid.clone()).or_insert(0) += 1;
    }
    assert_eq!(
        counts,
        BTreeMap::from([("big".to_owned(), 30), ("small".to_owned(), 10)])
    );
    assert_eq!(
        state.resolve("10.96.0.2:80".parse().unwrap()).unwrap_err(),
        ResolveError::NoHealthyEndpoint("ns/z.example".into()),
        "no endpoint with capacity: none to pick (as ztunnel's weighted choice)"
    );
}

#[test]
fn passthrough_keeps_the_original_destination() {
    let state = mesh("{mode: Passthrough}");
    let src = state.workloads.get("client").unwrap().clone();
    let r = state
        .resolve_from(Some(&src), VIP.parse().unwrap())
        .unwrap();
    assert!(r.workload.is_none());
    assert_eq!(r.service.as_ref().unwrap().hostname, "svc.example");
    assert_eq!(r.addr, VIP.parse().unwrap());
    assert!(!r.is_hbone());
}
