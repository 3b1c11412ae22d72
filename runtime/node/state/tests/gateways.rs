//! Endpoints on another network (`MeshState::resolve_from`): reached through their network gateway (the resolved
//! hop), never directly; refused when the gateway is missing or unknown; preferred less than local endpoints when
//! the service says so.

#![allow(clippy::unwrap_used)]

use std::path::Path;

use weft_state::local::parse;
use weft_state::{MeshState, ResolveError};

fn mesh(local_status: &str, remote: &str, lb: &str) -> MeshState {
    let y = format!(
        r#"
workloads:
- {{uid: client, namespace: app, workloadIps: [10.0.0.1], protocol: HBONE, node: a, network: net1}}
- {{uid: local, namespace: app, workloadIps: [10.0.0.2], protocol: HBONE, node: b, network: net1, status: {local_status},
    services: {{app/svc.app: {{80: 8080}}}}}}
- {{uid: remote, namespace: app, protocol: HBONE, node: r, network: net2, services: {{app/svc.app: {{80: 8080}}}}, {remote}}}
- {{uid: gw, namespace: istio-system, serviceAccount: eastwest, workloadIps: [10.1.0.1], protocol: HBONE, node: g,
    network: net2}}
services:
- {{name: svc, namespace: app, hostname: svc.app, vips: [/10.96.0.1], ports: {{80: 8080}}{lb}}}
"#
    );
    parse(&y, Path::new("/")).unwrap().into_state(1)
}

const GW: &str = "networkGateway: {destination: net2/10.1.0.1, hboneMtlsPort: 15008}";

fn resolve(s: &MeshState) -> Result<weft_state::Resolved, ResolveError> {
    let src = s.workloads.get("client").unwrap().clone();
    s.resolve_from(Some(&src), "10.96.0.1:80".parse().unwrap())
}

#[test]
fn a_remote_endpoint_is_reached_through_its_gateway() {
    let s = mesh("Unhealthy", GW, "");
    let r = resolve(&s).unwrap();
    let gw = r.network_gateway.as_ref().unwrap();
    assert_eq!(gw.workload.uid, "gw");
    assert_eq!(gw.addr, "10.1.0.1:15008".parse().unwrap());
    assert_eq!(r.workload.as_ref().unwrap().uid, "remote");
    assert_eq!(
        r.addr,
        "10.96.0.1:80".parse().unwrap(),
        "the service as dialled"
    );
    assert!(r.waypoint.is_none() && r.is_hbone());
    // Without a known client there is no "other network": the address-less endpoint is not reachable.
    assert_eq!(
        s.resolve("10.96.0.1:80".parse().unwrap()).unwrap_err(),
        ResolveError::NoHealthyEndpoint("app/svc.app".into())
    );
}

#[test]
fn remote_endpoints_need_a_known_gateway() {
    // No address and no gateway: not an endpoint at all.
    let s = mesh("Unhealthy", "", "");
    assert_eq!(
        resolve(&s).unwrap_err(),
        ResolveError::NoHealthyEndpoint("app/svc.app".into())
    );
    // An address but no gateway: picked, and refused rather than dialled across networks.
    let s = mesh("Unhealthy", "workloadIps: [10.2.0.9]", "");
    assert_eq!(
        resolve(&s).unwrap_err(),
        ResolveError::NoNetworkGateway {
            workload: "remote".into(),
            network: "net2".into()
        }
    );
    let s = mesh(
        "Unhealthy",
        "networkGateway: {destination: net2/10.1.0.99}",
        "",
    );
    assert_eq!(
        resolve(&s).unwrap_err(),
        ResolveError::UnknownNetworkGateway("net2/10.1.0.99".into())
    );
}

#[test]
fn the_local_network_wins_when_the_service_prefers_it() {
    let lb = ", loadBalancer: {mode: Failover, routingPreferences: [Network]}";
    let s = mesh("Healthy", GW, lb);
    for _ in 0..4 {
        let r = resolve(&s).unwrap();
        assert_eq!(r.workload.unwrap().uid, "local");
        assert!(r.network_gateway.is_none());
    }
    // The local endpoint unhealthy: fail over across networks, through the gateway.
    let s = mesh("Unhealthy", GW, lb);
    assert_eq!(
        resolve(&s).unwrap().network_gateway.unwrap().workload.uid,
        "gw"
    );
}

#[test]
fn a_service_waypoint_on_another_network_is_reached_through_its_gateway() {
    let y = |wp_extra: &str| {
        format!(
            r#"
workloads:
- {{uid: client, namespace: app, workloadIps: [10.0.0.1], protocol: HBONE, node: a, network: net1}}
- {{uid: server, namespace: app, workloadIps: [10.0.0.2], protocol: HBONE, node: b, network: net1,
    services: {{app/svc.app: {{80: 8080}}}}}}
- {{uid: rwp, namespace: app, serviceAccount: waypoint, protocol: HBONE, node: r, network: net2 {wp_extra}}}
- {{uid: gw, namespace: istio-system, workloadIps: [10.1.0.1], protocol: HBONE, node: g, network: net2}}
services:
- {{name: svc, namespace: app, hostname: svc.app, vips: [/10.96.0.1], ports: {{80: 8080}},
    waypoint: {{destination: app/rwp.app}}}}
"#
        )
    };
    let with_gw = y(", hostname: rwp.app, networkGateway: {destination: net2/10.1.0.1}");
    let s = parse(&with_gw, Path::new("/")).unwrap().into_state(1);
    let r = resolve(&s).unwrap();
    assert_eq!(r.waypoint.as_ref().unwrap().workload.uid, "rwp");
    assert_eq!(
        r.network_gateway.as_ref().unwrap().addr,
        "10.1.0.1:15008".parse().unwrap()
    );
    let without = y(", hostname: rwp.app");
    let s = parse(&without, Path::new("/")).unwrap().into_state(1);
    assert_eq!(
        resolve(&s).unwrap_err(),
        ResolveError::NoNetworkGateway {
            workload: "rwp".into(),
            network: "net2".into()
        }
    );
}
