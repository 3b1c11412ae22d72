//! Tests of `MeshState::resolve` on states built from config text: workload IPs, service VIPs with target ports,
//! unhealthy endpoints, unknown VIP ports, addresses outside the mesh.

#![allow(clippy::unwrap_used)]

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::Path;

use weft_state::local::parse;
use weft_state::{MeshState, ResolveError};

const MESH: &str = r#"
workloads:
- uid: front
  name: front
  namespace: shop
  workloadIps: [10.0.0.1]
  protocol: HBONE
  node: node-a
- uid: cart-1
  name: cart-1
  namespace: shop
  workloadIps: [10.0.1.1]
  protocol: HBONE
  node: node-a
  services: {shop/cart.example: {80: 8080}}
- uid: cart-2
  name: cart-2
  namespace: shop
  workloadIps: [10.0.1.2]
  protocol: TCP
  node: node-b
  services: {shop/cart.example: {80: 8080}}
- uid: cart-sick
  name: cart-sick
  namespace: shop
  workloadIps: [10.0.1.3]
  status: Unhealthy
  node: node-b
  services: {shop/cart.example: {80: 8080}}
- uid: cart-noip
  name: cart-noip
  namespace: shop
  node: node-b
  services: {shop/cart.example: {80: 8080}}
- uid: pay-sick
  name: pay-sick
  namespace: shop
  workloadIps: [10.0.2.1]
  status: Unhealthy
  services: {shop/pay.example: {443: 8443}}
- uid: own-port
  name: own-port
  namespace: shop
  workloadIps: [10.0.3.1]
  services: {shop/ports.example: {80: 9090, 81: 0, 82: 0}}
services:
- {name: cart, namespace: shop, hostname: cart.example, vips: [/10.96.0.1], ports: {80: 8080}}
- {name: pay, namespace: shop, hostname: pay.example, vips: [/10.96.0.2], ports: {443: 8443}}
- {name: ports, namespace: shop, hostname: ports.example, vips: [/10.96.0.3, "/fd00::3"], ports: {80: 8080, 81: 8181, 82: 0}}
"#;

fn state() -> MeshState {
    parse(MESH, Path::new("/")).unwrap().into_state(1)
}

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

#[test]
fn workload_ip_resolves_to_the_workload_unchanged() {
    let s = state();
    let r = s.resolve(addr("10.0.0.1:9000")).unwrap();
    assert_eq!(r.workload.as_ref().unwrap().uid, "front");
    assert!(r.service.is_none());
    assert_eq!(r.addr, addr("10.0.0.1:9000"));
    assert!(r.is_hbone());
    assert!(
        !s.resolve(addr("10.0.1.2:8080")).unwrap().is_hbone(),
        "TCP workload"
    );
}

#[test]
fn address_outside_the_mesh_passes_through() {
    let r = state().resolve(addr("93.184.216.34:443")).unwrap();
    assert!(r.workload.is_none() && r.service.is_none());
    assert_eq!(r.addr, addr("93.184.216.34:443"));
    assert!(!r.is_hbone());
}

#[test]
fn service_vip_resolves_to_healthy_endpoints_with_target_port() {
    let s = state();
    let mut picked = HashSet::new();
    for _ in 0..8 {
        let r = s.resolve(addr("10.96.0.1:80")).unwrap();
        assert_eq!(r.service.as_ref().unwrap().key(), "shop/cart.example");
        assert_eq!(r.addr.port(), 8080);
        let w = r.workload.unwrap();
        assert_eq!(r.addr.ip(), w.addresses[0]);
        picked.insert(w.uid.clone());
    }
    // Round robin over the two healthy endpoints; the unhealthy one and the one without an IP are never picked.
    assert_eq!(
        picked,
        HashSet::from(["cart-1".to_owned(), "cart-2".to_owned()])
    );
}

#[test]
fn only_unhealthy_endpoints_is_an_error() {
    let err = state().resolve(addr("10.96.0.2:443")).unwrap_err();
    assert_eq!(
        err,
        ResolveError::NoHealthyEndpoint("shop/pay.example".into())
    );
}

#[test]
fn unknown_vip_port_is_an_error() {
    let err = state().resolve(addr("10.96.0.1:81")).unwrap_err();
    assert_eq!(
        err,
        ResolveError::UnknownServicePort {
            service: "shop/cart.example".into(),
            port: 81
        }
    );
}

#[test]
fn target_port_precedence() {
    let s = state();
    // The endpoint's own port map wins over the service's target port...
    assert_eq!(
        s.resolve(addr("10.96.0.3:80")).unwrap().addr,
        addr("10.0.3.1:9090")
    );
    // ...an endpoint target of 0 falls back to the service's target port...
    assert_eq!(
        s.resolve(addr("10.96.0.3:81")).unwrap().addr,
        addr("10.0.3.1:8181")
    );
    // ...and both 0 means the service port itself. IPv6 VIPs work the same.
    assert_eq!(
        s.resolve(addr("[fd00::3]:82")).unwrap().addr,
        addr("10.0.3.1:82")
    );
}

#[test]
fn local_workloads_by_node() {
    let s = state();
    let mut on_a: Vec<_> = s.local_workloads("node-a").map(|w| w.uid.clone()).collect();
    on_a.sort();
    assert_eq!(on_a, vec!["cart-1", "front"]);
    assert_eq!(
        s.workload_by_ip("10.0.1.3".parse().unwrap()).unwrap().uid,
        "cart-sick"
    );
    assert_eq!(
        s.service_by_vip("fd00::3".parse().unwrap()).unwrap().name,
        "ports"
    );
}

#[test]
fn services_by_hostname_and_their_endpoints() {
    let cfg = parse(
        r#"
workloads:
- {uid: a, namespace: ns1, workloadIps: [10.0.0.1], services: {ns1/db.example: {}}}
- {uid: b, namespace: ns1, workloadIps: [10.0.0.2], status: Unhealthy, services: {ns1/db.example: {}}}
services:
- {name: db, namespace: ns1, hostname: db.example}
- {name: db, namespace: ns2, hostname: DB.Example, vips: [/10.96.0.9]}
"#,
        Path::new("/"),
    )
    .unwrap();
    let s = cfg.into_state(1);
    let keys =
        |host: &str| -> Vec<String> { s.services_by_host(host).iter().map(|v| v.key()).collect() };
    assert_eq!(keys("db.example"), ["ns1/db.example", "ns2/DB.Example"]);
    assert_eq!(keys("DB.EXAMPLE"), keys("db.example"));
    assert!(keys("nope.example").is_empty());
    let eps: Vec<&str> = s
        .endpoints_of("ns1/db.example")
        .iter()
        .map(|w| w.uid.as_str())
        .collect();
    assert_eq!(eps, ["a", "b"], "unhealthy endpoints included");
    assert!(s.endpoints_of("ns2/DB.Example").is_empty());
}
