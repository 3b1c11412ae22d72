//! What istiod really sends a ztunnel node as policies, taken by weft's xDS conversion with every name as istiod
//! wrote it: the static STRICT policy, PeerAuthentications converted to port-level DENY policies, the implicit
//! waypoint ALLOW policy, and a STRICT workload listing the static one.
//! Each test fails if weft refuses one of istiod's names again (most are not Kubernetes names: istiod picks `_`
//! because Kubernetes refuses it). The resources are rebuilt from Istio's own code and test data (istio/istio at
//! 86c9f01fd735fb01d8192f5bcaf0d424afb7f14c; fixtures in `istio_ambient/mod.rs`).
#![allow(clippy::unwrap_used)] // a test panics to fail

mod istio_ambient;

use istio_ambient::*;

#[test]
fn the_static_strict_policy_is_taken_with_its_name() {
    let c = upsert_policy(static_strict());
    let p = as_policy(&c);
    assert_eq!(p.name, "istio_converted_static_strict");
    assert_eq!(p.namespace, "istio-system");
    assert_eq!(p.key(), STATIC_STRICT_KEY);
    assert_eq!(
        (p.scope, p.action, p.dry_run),
        (PolicyScope::WorkloadSelector, PolicyAction::Deny, false)
    );
    // One group of one rule of one match: no principal at all.
    assert_eq!(p.rules.len(), 1);
    assert_eq!(p.rules[0].len(), 1);
    assert_eq!(
        p.rules[0][0],
        [PolicyMatch {
            not_principals: vec![StringMatch::Presence],
            ..Default::default()
        }]
    );
    assert_eq!(
        *p,
        deny_model(ROOT_NS, STATIC_STRICT, &[&[Rule::Plaintext]])
    );
}

#[test]
fn converted_peer_authentications_are_taken_with_their_names_and_ports() {
    for case in CONVERTED {
        let name = case.name();
        let p = authorization(deny(case.namespace, &name, case.groups))
            .unwrap_or_else(|e| panic!("{}: {name} refused: {e}", case.file));
        assert_eq!(p.name, name, "{}", case.file);
        assert_eq!(
            p.key(),
            format!("{}/{name}", case.namespace),
            "{}",
            case.file
        );
        assert_eq!(
            p,
            deny_model(case.namespace, &name, case.groups),
            "{}",
            case.file
        );
    }
    // Spot checks of the semantics, spelled out.
    let strict_8080 = authorization(deny(
        NS,
        "converted_peer_authentication_strict-mtls",
        Converted::of("peer-authn-unset-port-mtls-strict").groups,
    ))
    .unwrap();
    let m = &strict_8080.rules[0][0][0];
    assert_eq!(m.destination_ports, [8080]);
    assert_eq!(m.not_principals, [StringMatch::Presence]);
    assert!(m.principals.is_empty() && m.not_destination_ports.is_empty());
    let exempt = Converted::of("peer-authn-strict-and-permissive-port-mtls");
    let p = authorization(deny(exempt.namespace, &exempt.name(), exempt.groups)).unwrap();
    assert_eq!(
        p.name,
        "converted_peer_authentication_strict-and-permissive-mtls"
    );
    assert_eq!(p.rules.len(), 1, "one group");
    assert_eq!(p.rules[0].len(), 2, "two rules, both must hold");
    assert_eq!(p.rules[0][0][0].not_principals, [StringMatch::Presence]);
    assert_eq!(p.rules[0][1][0].not_destination_ports, [9090]);
    let two_ports =
        Converted::of("peer-authn-permissive-root-permissive-namespace-strict-workload-ports");
    let p = authorization(deny(
        two_ports.namespace,
        &two_ports.name(),
        two_ports.groups,
    ))
    .unwrap();
    assert_eq!(p.key(), "foo/converted_peer_authentication_workload");
    assert_eq!(p.rules.len(), 2, "a group per STRICT port");
    assert_eq!(p.rules[1][0][0].destination_ports, [9090]);
    let selector = CONVERTED.last().unwrap();
    assert_eq!(
        format!("{}/{}", selector.namespace, selector.name()),
        "ns1/converted_peer_authentication_selector-strict"
    );
}

#[test]
fn the_implicit_waypoint_allow_policy_is_taken_with_its_name() {
    let c = upsert_policy(waypoint_allow());
    let p = as_policy(&c);
    assert_eq!(p.key(), "ns1/istio_allow_waypoint_ns1_waypoint-ns");
    assert_eq!(
        (p.scope, p.action),
        (PolicyScope::WorkloadSelector, PolicyAction::Allow)
    );
    assert_eq!(
        p.rules,
        [[[PolicyMatch {
            principals: vec![
                StringMatch::Exact("cluster.local/ns/ns1/sa/namespace-wide".into()),
                StringMatch::Exact("cluster.local/ns/ns1/sa/waypoint-sa".into()),
            ],
            ..Default::default()
        }]]]
    );
}

// ---- workloads --------------------------------------------------------------------------------------------------

#[test]
fn a_strict_workload_listing_the_static_strict_policy_is_taken() {
    // ambientindex_test.go: a pod under a STRICT namespace PeerAuthentication lists exactly
    // `istio-system/istio_converted_static_strict`.
    let c = upsert_workload(pod("pod1", "127.0.0.1", &[STATIC_STRICT_KEY]));
    let w = as_workload(&c);
    assert_eq!(w.uid, "cluster0//Pod/ns1/pod1");
    assert_eq!((w.name.as_str(), w.namespace.as_str()), ("pod1", "ns1"));
    assert_eq!(w.authorization_policies, [STATIC_STRICT_KEY]);
    assert_eq!(w.meta.authorization_policies, [STATIC_STRICT_KEY]);
    assert_eq!(w.protocol, TunnelProtocol::Hbone);
    assert_eq!(w.workload_type, "pod");
    assert_eq!(w.cluster_id, "cluster0");
    // istiod leaves the trust domain empty for cluster.local; weft fills ztunnel's default.
    assert_eq!(w.spiffe_id(), "spiffe://cluster.local/ns/ns1/sa/sa1");
    assert!(w.has_identity("spiffe://cluster.local/ns/ns1/sa/sa1"));
}
