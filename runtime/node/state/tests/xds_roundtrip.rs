//! What weft-control serves is what a node reads back: model → Istio proto (`xds::encode`, weft-control's side) →
//! model (`xds::{workload, service, authorization}`, the node's side), field for field, for a workload, a service and
//! a policy with every field set.

#![allow(clippy::unwrap_used)]

use std::path::Path;

use weft_state::Resource;

const MESH: &str = r#"
workloads:
- uid: c1//v1/Pod/shop/cart-1
  name: cart-1
  namespace: shop
  serviceAccount: cart
  trustDomain: td.example
  workloadIps: ["10.1.0.5", "fd00::5"]
  protocol: HBONE
  networkMode: HostNetwork
  node: node-a
  network: net1
  waypoint: {destination: "/10.1.0.100", hboneMtlsPort: 15008}
  networkGateway: {destination: "net2/192.168.0.1", hboneMtlsPort: 15009}
  workloadName: cart
  workloadType: pod
  canonicalName: cart
  canonicalRevision: v2
  hostname: cart.shop.example
  nativeTunnel: true
  applicationTunnel: {protocol: PROXY, port: 15088}
  authorizationPolicies: [shop/only-frontend]
  status: Unhealthy
  clusterId: c1
  locality: {region: eu-west, zone: eu-west-1a, subzone: rack3}
  capacity: 2
  services:
    shop/cart.shop.svc.cluster.local: {80: 8080, 443: 0}
services:
- name: cart
  namespace: shop
  hostname: cart.shop.svc.cluster.local
  vips: ["/10.96.0.10", "net1/fd00::10"]
  cidrVips: [{network: "", cidr: 10.97.0.0/16}]
  ports: {80: 8080, 443: 8443}
  subjectAltNames: [spiffe://td/ns/shop/sa/cart]
  waypoint: {destination: shop/waypoint.shop.svc.cluster.local, hboneMtlsPort: 15008}
  weightedWaypoints:
  - destination: {destination: shop/wp2.shop.svc.cluster.local, hboneMtlsPort: 15008}
    weight: 10
  loadBalancer: {routingPreferences: [Region, Zone], mode: Failover, healthPolicy: AllowAll}
  ipFamilies: Dual
  canonical: true
  visibility: Namespace
policies:
- name: only-frontend
  namespace: shop
  scope: WorkloadSelector
  action: Allow
  dryRun: true
  rules: [[[{principals: [!Prefix td/ns/front/], sourceIps: [10.0.0.0/8], destinationPorts: [8080]}]]]
"#;

#[test]
fn served_resources_read_back_as_the_same_model() {
    let cfg = weft_state::local::parse(MESH, Path::new("/")).unwrap();
    let w = &cfg.workloads[0];
    let back = weft_state::xds::workload(weft_state::xds::encode::workload(w)).unwrap();
    assert_eq!(&back, w);
    let s = &cfg.services[0];
    let back = weft_state::xds::service(weft_state::xds::encode::service(s)).unwrap();
    assert_eq!(&back, s);
    let p = &cfg.policies[0];
    let back = weft_state::xds::authorization(weft_state::xds::encode::authorization(p)).unwrap();
    assert_eq!(&back, p);
    // And as the node's Address handler names them.
    let address = weft_proto::istio::workload::Address {
        r#type: Some(weft_proto::istio::workload::address::Type::Workload(
            weft_state::xds::encode::workload(w),
        )),
    };
    let weft_state::Change::Upsert { resource, .. } =
        weft_state::xds::address_change(&w.uid, address).unwrap()
    else {
        panic!("not an upsert")
    };
    assert_eq!(resource, Resource::Workload(std::sync::Arc::new(w.clone())));
}
