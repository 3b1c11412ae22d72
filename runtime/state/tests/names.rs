//! Names are checked the way Kubernetes (and, for hostnames, Istio) checks them, in the local file and in xDS alike:
//! the same function refuses the same value with the same words, and the file's refusal names the field and line.

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

#[test]
fn the_file_refuses_bad_names_at_their_line() {
    let cases: &[(&str, usize, &[&str])] = &[
        (
            "workloads:\n- name: a\n  namespace: Shop\n",
            3,
            &[
                "workloads[0].namespace",
                "invalid namespace \"Shop\"",
                "DNS-1123 label",
            ],
        ),
        (
            "workloads:\n- name: a_1\n  namespace: shop\n",
            2,
            &[
                "workloads[0].name",
                "invalid name \"a_1\"",
                "DNS-1123 subdomain",
            ],
        ),
        (
            "workloads:\n- namespace: shop\n  serviceAccount: Cart\n",
            3,
            &["serviceAccount", "invalid service account \"Cart\""],
        ),
        (
            "workloads:\n- namespace: shop\n  node: node a\n",
            3,
            &["workloads[0].node", "invalid node"],
        ),
        (
            "workloads:\n- namespace: shop\n  trustDomain: Td\n",
            3,
            &["trustDomain", "invalid trust domain"],
        ),
        (
            "workloads:\n- namespace: shop\n  services: {shop/a..b: {80: 80}}\n",
            3,
            &["workloads[0].services", "invalid hostname \"a..b\""],
        ),
        (
            "workloads:\n- namespace: shop\n  authorizationPolicies: [shop/Allow]\n",
            3,
            &["authorizationPolicies[0]", "invalid policy name \"Allow\""],
        ),
        (
            "workloads:\n- namespace: shop\n  waypoint: {destination: Shop/wp.shop.svc}\n",
            3,
            &["waypoint.destination", "invalid namespace \"Shop\""],
        ),
        (
            "services:\n- name: s\n  namespace: shop\n  hostname: \"bad host\"\n",
            4,
            &["services[0].hostname", "invalid hostname"],
        ),
        (
            "services:\n- name: s\n  namespace: -shop\n  hostname: s.example\n",
            3,
            &["services[0].namespace", "invalid namespace"],
        ),
        (
            "policies:\n- name: Deny\n  namespace: shop\n  scope: Namespace\n  action: Deny\n  rules: []\n",
            2,
            &["policies[0].name", "invalid policy name \"Deny\""],
        ),
        (
            "policies:\n- name: deny\n  namespace: \"\"\n  scope: Namespace\n  action: Deny\n  rules: []\n",
            3,
            &["policies[0].namespace", "namespace must not be empty"],
        ),
    ];
    for (text, line, needles) in cases {
        let (at, msg) = file_error(text);
        assert_eq!(at, Some(*line), "{msg}");
        assert!(msg.starts_with(FILE), "{msg}");
        for n in *needles {
            assert!(msg.contains(n), "{n:?} missing: {msg}");
        }
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
    let (_, file) = file_error("workloads:\n- name: a\n  namespace: Shop\n");
    let xds = weft_state::xds::workload(Workload {
        uid: "u".into(),
        name: "a".into(),
        namespace: "Shop".into(),
        ..Default::default()
    })
    .unwrap_err();
    assert_eq!(xds.field, "namespace");
    assert!(file.ends_with(&xds.reason), "{file} / {xds}");

    let s = weft_state::xds::service(Service {
        name: "s".into(),
        namespace: "shop".into(),
        hostname: "bad host".into(),
        ..Default::default()
    })
    .unwrap_err();
    assert_eq!(s.field, "hostname");
    assert!(s.reason.starts_with("invalid hostname \"bad host\""), "{s}");

    let p = weft_state::xds::authorization(Authorization {
        name: "Deny".into(),
        namespace: "shop".into(),
        ..Default::default()
    })
    .unwrap_err();
    assert_eq!(p.to_string(), format!("name: {}", p.reason));
    assert!(p.reason.contains("invalid policy name \"Deny\""), "{p}");
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
