//! Names are opaque text in the local file and in xDS alike (as in ztunnel): what istiod emits is taken; the little
//! that is refused (a service key without its namespace) is refused by the same function with the same words, and
//! the file's refusal names the field and line.

#![allow(clippy::unwrap_used)]

use std::path::Path;

use weft_proto::istio::security::Authorization;
use weft_proto::istio::workload::{Service, Workload};
use weft_state::local::parse_named;

const FILE: &str = "/etc/weft/mesh.yaml";

fn file_error(text: &str) -> (Option<usize>, String) {
    let e = parse_named(text, Path::new(FILE)).unwrap_err();
    (e.line(), e.to_string())
}

/// What istiod and ztunnel's local files hold is taken as it is, though Kubernetes would refuse it as an object
/// name: istiod's converted policies (`istio_converted_static_strict`, `converted_peer_authentication_<name>`, istio
/// pilot/pkg/serviceregistry/ambient/policies.go at 86c9f01), its network-gateway workloads (named
/// `NetworkGateway/<network>/<address>/<port>`, workloads.go), and names of any case. Before, each of these was
/// refused (`invalid policy name ... must be a DNS-1123 subdomain`).
#[test]
fn the_file_takes_the_names_istiod_emits() {
    let cfg = parse_named(
        r#"
workloads:
- uid: NetworkGateway/net-2/172.0.1.2/15008
  name: NetworkGateway/net-2/172.0.1.2/15008
  namespace: ""
  serviceAccount: Cart
  trustDomain: Td
  node: node a
  authorizationPolicies: [istio-system/istio_converted_static_strict, shop/Allow]
  services: {"Shop/a..b": {80: 80}}
  waypoint: {destination: Shop/wp.shop.svc}
services:
- name: s
  namespace: -shop
  hostname: "bad host"
policies:
- name: istio_converted_static_strict
  namespace: istio-system
  scope: WorkloadSelector
  action: Deny
  rules: [[[{notPrincipals: [!Presence []]}]]]
- name: Deny
  namespace: ""
  scope: Namespace
  action: Deny
  rules: []
"#,
        Path::new(FILE),
    )
    .unwrap();
    let w = &cfg.workloads[0];
    assert_eq!(w.name, "NetworkGateway/net-2/172.0.1.2/15008");
    assert_eq!(w.namespace, "");
    assert_eq!(
        w.authorization_policies,
        ["istio-system/istio_converted_static_strict", "shop/Allow"]
    );
    assert!(w.services.contains_key("Shop/a..b"));
    assert_eq!(cfg.services[0].hostname, "bad host");
    assert_eq!(cfg.policies[0].name, "istio_converted_static_strict");
}

/// What weft cannot use is still refused, at its line: a service key without its namespace.
#[test]
fn the_file_refuses_a_service_key_without_its_namespace_at_its_line() {
    let (at, msg) = file_error("workloads:\n- namespace: shop\n  services: {cart: {80: 80}}\n");
    assert_eq!(at, Some(3), "{msg}");
    assert!(msg.starts_with(FILE), "{msg}");
    for n in ["workloads[0].services", "invalid service name \"cart\""] {
        assert!(msg.contains(n), "{n:?} missing: {msg}");
    }
}

#[test]
fn accepted_names_include_istio_hostnames() {
    let cfg = parse_named(
        r#"
workloads:
- uid: cluster1//v1/Pod/shop/cart-7d9.v2
  name: cart-7d9.v2
  namespace: shop
  serviceAccount: cart.sa
  node: ip-10-0-0-1.ec2.internal
  services: {"shop/*.shop.example": {80: 80}, "shop/Cart.Shop.Example.": {81: 0}}
  waypoint: {destination: shop/waypoint.shop.svc.cluster.local}
services:
- name: wildcard
  namespace: shop
  hostname: "*.shop.example"
"#,
        Path::new(FILE),
    )
    .unwrap();
    assert_eq!(cfg.workloads[0].services.len(), 2);
    assert_eq!(cfg.services[0].hostname, "*.shop.example");
}

#[test]
fn xds_refuses_the_same_values_with_the_same_words() {
    let (_, file) = file_error("workloads:\n- namespace: shop\n  services: {cart: {80: 80}}\n");
    let mut services = std::collections::HashMap::new();
    services.insert("cart".to_owned(), Default::default());
    let xds = weft_state::xds::workload(Workload {
        uid: "u".into(),
        namespace: "shop".into(),
        services,
        ..Default::default()
    })
    .unwrap_err();
    assert_eq!(xds.field, "services[\"cart\"]");
    assert!(file.ends_with(&xds.reason), "{file} / {xds}");

    // Names are not checked on xDS either (ztunnel takes them as they are).
    weft_state::xds::workload(Workload {
        uid: "u".into(),
        name: "NetworkGateway/net-2/172.0.1.2/15008".into(),
        namespace: "Shop".into(),
        ..Default::default()
    })
    .unwrap();
    weft_state::xds::service(Service {
        name: "s".into(),
        namespace: "shop".into(),
        hostname: "bad host".into(),
        ..Default::default()
    })
    .unwrap();
    weft_state::xds::authorization(Authorization {
        name: "istio_converted_static_strict".into(),
        namespace: "istio-system".into(),
        ..Default::default()
    })
    .unwrap();
}

/// `has_identity` (compared in place on the data path) gives exactly the answer of comparing with `spiffe_id()`, and
/// the metadata a connection record shares carries the same string.
#[test]
fn identity_is_matched_in_place_as_it_is_formatted() {
    let text = "workloads:\n- uid: a\n  name: a\n  namespace: shop\n  serviceAccount: cart\n  \
                trustDomain: corp.example\n  workloadIps: [10.0.0.1]\n";
    let state = weft_state::local::parse(text, Path::new("/"))
        .unwrap()
        .into_state(1);
    let w = state.workload_by_ip("10.0.0.1".parse().unwrap()).unwrap();
    let id = w.spiffe_id();
    assert_eq!(id, "spiffe://corp.example/ns/shop/sa/cart");
    assert_eq!(&*w.meta.identity, id.as_str());
    for other in [
        id.as_str(),
        "spiffe://corp.example/ns/shop/sa/cart2",
        "spiffe://corp.example/ns/shop/sa/car",
        "spiffe://corp.example/ns/shopx/sa/cart",
        "spiffe://corp.exampl/ns/shop/sa/cart",
        "spiffe://cluster.local/ns/shop/sa/cart",
        "spiffe://corp.example/ns/shop/sa/",
        "corp.example/ns/shop/sa/cart",
        "spiffe://corp.example/sa/shop/ns/cart",
        "",
    ] {
        assert_eq!(w.has_identity(other), id == other, "{other:?}");
    }
}
