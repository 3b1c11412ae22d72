//! What istiod really sends a ztunnel node, rebuilt from Istio's own code and test data (istio/istio at
//! 86c9f01fd735fb01d8192f5bcaf0d424afb7f14c), taken by weft's xDS conversion with every name as istiod wrote it:
//! the static STRICT policy, PeerAuthentications converted to port-level DENY policies, the implicit waypoint
//! ALLOW policy, pod workloads listing them, network-gateway and split-horizon workloads named with slashes. Most
//! of these names are not Kubernetes names (istiod picks `_` because Kubernetes refuses it), so each test here fails
//! if weft refuses such names again; what weft cannot use at all is still refused.
//!
//! Paths in comments are in istio/istio at that commit. The values are Istio's; the fixtures are written anew.

#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::net::IpAddr;

use weft_proto::istio::security as sec;
use weft_proto::istio::workload as pb;
use weft_state::xds::{address_change, authorization, authorization_change};
use weft_state::{
    Change, GatewayAddress, GatewayDestination, Policy, PolicyAction, PolicyMatch, PolicyScope,
    Resource, StateStore, StringMatch, TunnelProtocol, Workload,
};

// ---- istiod's names -------------------------------------------------------------------------------------------

/// The root namespace of the Istio tests (`systemNS`, pilot/pkg/serviceregistry/ambient/ambientindex_test.go).
const ROOT_NS: &str = "istio-system";
/// `staticStrictPolicyName`, pilot/pkg/serviceregistry/ambient/authorization.go.
const STATIC_STRICT: &str = "istio_converted_static_strict";
/// What a STRICT workload lists (`effectivePeerAuthenticationKeys`, authorization.go: `<root ns>/<static name>`).
const STATIC_STRICT_KEY: &str = "istio-system/istio_converted_static_strict";
/// `convertedPeerAuthenticationPrefix`, pilot/pkg/model/authentication.go (applied by `GetAmbientPolicyConfigName`).
const CONVERTED_PA: &str = "converted_peer_authentication_";
/// The Istio tests' namespace, cluster and network (`testNS`, `testC`, `testNW`, ambientindex_test.go).
const NS: &str = "ns1";
const CLUSTER: &str = "cluster0";
const NETWORK: &str = "testnetwork";

// ---- building istiod's resources -------------------------------------------------------------------------------

fn octets(s: &str) -> Vec<u8> {
    match s.parse::<IpAddr>().unwrap() {
        IpAddr::V4(v) => v.octets().to_vec(),
        IpAddr::V6(v) => v.octets().to_vec(),
    }
}

fn presence() -> sec::StringMatch {
    sec::StringMatch {
        match_type: Some(sec::string_match::MatchType::Presence(())),
    }
}

fn exact(s: &str) -> sec::StringMatch {
    sec::StringMatch {
        match_type: Some(sec::string_match::MatchType::Exact(s.into())),
    }
}

/// One rule of a converted PeerAuthentication. Every rule istiod writes for one holds a single match
/// (`convertPeerAuthentication`, authorization.go), so a rule here is that match.
#[derive(Debug, Clone, Copy)]
enum Rule {
    /// `notPrincipals: [presence]`: a caller without an mTLS identity.
    Plaintext,
    /// `notPrincipals: [presence]` and `destinationPorts: [port]`: a plaintext caller to that port (a STRICT port).
    PlaintextTo(u32),
    /// `notDestinationPorts: [port]`: any port but this one (a PERMISSIVE or DISABLE port under STRICT).
    NotPort(u32),
}

impl Rule {
    /// As istiod writes it (protobuf).
    fn to_pb(self) -> sec::Rules {
        let m = match self {
            Rule::Plaintext => sec::Match {
                not_principals: vec![presence()],
                ..Default::default()
            },
            Rule::PlaintextTo(p) => sec::Match {
                not_principals: vec![presence()],
                destination_ports: vec![p],
                ..Default::default()
            },
            Rule::NotPort(p) => sec::Match {
                not_destination_ports: vec![p],
                ..Default::default()
            },
        };
        sec::Rules { matches: vec![m] }
    }

    /// As weft must hold it: a clause (AND) of one match.
    fn to_model(self) -> Vec<PolicyMatch> {
        let port = |p: u32| u16::try_from(p).unwrap();
        let m = match self {
            Rule::Plaintext => PolicyMatch {
                not_principals: vec![StringMatch::Presence],
                ..Default::default()
            },
            Rule::PlaintextTo(p) => PolicyMatch {
                not_principals: vec![StringMatch::Presence],
                destination_ports: vec![port(p)],
                ..Default::default()
            },
            Rule::NotPort(p) => PolicyMatch {
                not_destination_ports: vec![port(p)],
                ..Default::default()
            },
        };
        vec![m]
    }
}

/// A WORKLOAD_SELECTOR DENY policy made of `groups` (each a list of rules), as istiod builds the static STRICT
/// policy and converted PeerAuthentications.
fn deny(namespace: &str, name: &str, groups: &[&[Rule]]) -> sec::Authorization {
    sec::Authorization {
        name: name.into(),
        namespace: namespace.into(),
        scope: sec::Scope::WorkloadSelector as i32,
        action: sec::Action::Deny as i32,
        groups: groups
            .iter()
            .map(|rules| sec::Group {
                rules: rules.iter().map(|r| r.to_pb()).collect(),
            })
            .collect(),
        dry_run: false,
        extensions: vec![],
    }
}

/// What weft must make of [`deny`]: the same names, scope and action, and the groups (OR) of clauses (AND) of
/// matches (OR).
fn deny_model(namespace: &str, name: &str, groups: &[&[Rule]]) -> Policy {
    Policy {
        name: name.into(),
        namespace: namespace.into(),
        scope: PolicyScope::WorkloadSelector,
        action: PolicyAction::Deny,
        dry_run: false,
        rules: groups
            .iter()
            .map(|rules| rules.iter().map(|r| r.to_model()).collect())
            .collect(),
    }
}

/// The static STRICT policy, as the `DefaultPolicy` singleton of `PolicyCollections` builds it
/// (pilot/pkg/serviceregistry/ambient/policies.go): root namespace, WORKLOAD_SELECTOR, DENY, one group of one
/// rule of one match, `notPrincipals: [presence]`.
fn static_strict() -> sec::Authorization {
    deny(ROOT_NS, STATIC_STRICT, &[&[Rule::Plaintext]])
}

/// The implicit ALLOW-from-waypoint policy, as `implicitWaypointPolicy` builds it (policies.go) for the waypoint
/// `waypoint-ns` in `ns1` with the service accounts of `TestDefaultAllowWaypointPolicy` (ambientindex_test.go):
/// named `istio_allow_waypoint_<ns>_<name>`, in the waypoint's namespace, one exact principal per service
/// account (the SPIFFE id without `spiffe://`).
fn waypoint_allow() -> sec::Authorization {
    sec::Authorization {
        name: "istio_allow_waypoint_ns1_waypoint-ns".into(),
        namespace: NS.into(),
        scope: sec::Scope::WorkloadSelector as i32,
        action: sec::Action::Allow as i32,
        groups: vec![sec::Group {
            rules: vec![sec::Rules {
                matches: vec![sec::Match {
                    principals: vec![
                        exact("cluster.local/ns/ns1/sa/namespace-wide"),
                        exact("cluster.local/ns/ns1/sa/waypoint-sa"),
                    ],
                    ..Default::default()
                }],
            }],
        }],
        dry_run: false,
        extensions: vec![],
    }
}

/// A converted PeerAuthentication: Istio's test data file (pilot/pkg/serviceregistry/ambient/testdata/`file`.yaml,
/// the expected output for `file`-in.yaml), the PeerAuthentication's namespace and name, and the policy's groups.
struct Converted {
    file: &'static str,
    namespace: &'static str,
    peer_authentication: &'static str,
    groups: &'static [&'static [Rule]],
}

/// Every non-empty expected output of istiod's PeerAuthentication conversion in Istio's test data (the other
/// `peer-authn-*.yaml` outputs are empty: nothing is converted), plus the `selector-strict` PeerAuthentication of
/// ambientindex_test.go (`xdsConvertedPeerAuthSelectorStrict`). Inputs without a namespace (the single-policy
/// `-in.yaml` files) are given `ns1`: in a cluster the policy takes its PeerAuthentication's namespace
/// (`Namespace: cfg.Namespace` in `convertPeerAuthentication`, authorization.go).
const CONVERTED: &[Converted] = &[
    // Workload mode UNSET, port 8080 STRICT.
    Converted {
        file: "peer-authn-unset-port-mtls-strict",
        namespace: NS,
        peer_authentication: "strict-mtls",
        groups: &[&[Rule::PlaintextTo(8080)]],
    },
    // Workload mode PERMISSIVE, port 9090 STRICT.
    Converted {
        file: "peer-authn-permissive-port-mtls-strict",
        namespace: NS,
        peer_authentication: "permissive-strict-mtls",
        groups: &[&[Rule::PlaintextTo(9090)]],
    },
    // Workload mode DISABLE, port 9090 STRICT.
    Converted {
        file: "peer-authn-disable-port-mtls-strict",
        namespace: NS,
        peer_authentication: "disable-strict-mtls",
        groups: &[&[Rule::PlaintextTo(9090)]],
    },
    // Workload mode PERMISSIVE, port 9090 STRICT, port 8080 PERMISSIVE (dropped).
    Converted {
        file: "peer-authn-permissive-port-mtls-strict-and-permissive",
        namespace: NS,
        peer_authentication: "permissive-strict-mtls",
        groups: &[&[Rule::PlaintextTo(9090)]],
    },
    // Workload mode STRICT, port 9090 PERMISSIVE: plaintext denied on every port but 9090.
    Converted {
        file: "peer-authn-strict-and-permissive-port-mtls",
        namespace: NS,
        peer_authentication: "strict-and-permissive-mtls",
        groups: &[&[Rule::Plaintext, Rule::NotPort(9090)]],
    },
    // Workload mode STRICT, port 9090 DISABLE: the same.
    Converted {
        file: "peer-authn-strict-and-disable-port-mtls",
        namespace: NS,
        peer_authentication: "strict-and-disable-mtls",
        groups: &[&[Rule::Plaintext, Rule::NotPort(9090)]],
    },
    // Root and namespace PERMISSIVE, workload ports 8080 and 9090 STRICT: one group per port.
    Converted {
        file: "peer-authn-permissive-root-permissive-namespace-strict-workload-ports",
        namespace: "foo",
        peer_authentication: "workload",
        groups: &[&[Rule::PlaintextTo(8080)], &[Rule::PlaintextTo(9090)]],
    },
    // Root STRICT, workload UNSET with 9090 PERMISSIVE and 8080 STRICT: the root's strictness merged in.
    Converted {
        file: "peer-authn-strict-root-unset-workload-port-mtls-strict-and-permissive",
        namespace: "foo",
        peer_authentication: "workload",
        groups: &[&[Rule::NotPort(9090), Rule::Plaintext]],
    },
    // Workload mode STRICT, port 9090 STRICT (dropped), port 8080 PERMISSIVE.
    Converted {
        file: "peer-authn-strict-port-mtls-strict-and-permissive",
        namespace: NS,
        peer_authentication: "permissive-strict-mtls",
        groups: &[&[Rule::Plaintext, Rule::NotPort(8080)]],
    },
    // Root PERMISSIVE, namespace STRICT, workload UNSET with 9090 PERMISSIVE: the namespace's strictness merged in.
    Converted {
        file: "peer-authn-permissive-root-strict-namespace-permissive-workload",
        namespace: "foo",
        peer_authentication: "workload",
        groups: &[&[Rule::NotPort(9090), Rule::Plaintext]],
    },
    // Root STRICT, workload UNSET with 9090 PERMISSIVE.
    Converted {
        file: "peer-authn-strict-root-permissive-workload",
        namespace: "foo",
        peer_authentication: "workload",
        groups: &[&[Rule::NotPort(9090), Rule::Plaintext]],
    },
    // Root STRICT, namespace PERMISSIVE, workload UNSET with 9090 STRICT.
    Converted {
        file: "peer-authn-strict-root-permissive-namespace-strict-workload",
        namespace: "foo",
        peer_authentication: "workload",
        groups: &[&[Rule::PlaintextTo(9090)]],
    },
    // Root PERMISSIVE, namespace UNSET, workload 9090 STRICT and 8080 PERMISSIVE.
    Converted {
        file: "peer-authn-permissive-root-unset-namespace-mixed-workload-ports",
        namespace: "foo",
        peer_authentication: "workload",
        groups: &[&[Rule::PlaintextTo(9090)]],
    },
    // ambientindex_test.go: PeerAuthentication `selector-strict` in ns1, STRICT with port 9090 PERMISSIVE
    // (`xdsConvertedPeerAuthSelectorStrict` = `converted_peer_authentication_selector-strict`).
    Converted {
        file: "ambientindex_test.go selector-strict",
        namespace: NS,
        peer_authentication: "selector-strict",
        groups: &[&[Rule::Plaintext, Rule::NotPort(9090)]],
    },
];

impl Converted {
    /// The case of one test data file.
    fn of(file: &str) -> &'static Converted {
        CONVERTED.iter().find(|c| c.file == file).unwrap()
    }

    fn name(&self) -> String {
        format!("{CONVERTED_PA}{}", self.peer_authentication)
    }
}

/// A pod workload as `podWorkloadBuilder` builds it (pilot/pkg/serviceregistry/ambient/workloads.go) for the pods
/// of ambientindex_test.go: uid `<cluster>//Pod/<ns>/<name>` (`generatePodUID`), the cluster's network, the
/// mesh's trust domain left empty when it is `cluster.local` (`pickTrustDomain`), workload type POD, HBONE for a
/// captured pod, and the policy keys istiod computed for it.
fn pod(name: &str, ip: &str, policies: &[&str]) -> pb::Workload {
    pb::Workload {
        uid: format!("{CLUSTER}//Pod/{NS}/{name}"),
        name: name.into(),
        namespace: NS.into(),
        addresses: vec![octets(ip)],
        network: NETWORK.into(),
        tunnel_protocol: pb::TunnelProtocol::Hbone as i32,
        trust_domain: String::new(),
        service_account: "sa1".into(),
        node: "node1".into(),
        canonical_name: "a".into(),
        canonical_revision: "latest".into(),
        workload_type: pb::WorkloadType::Pod as i32,
        workload_name: name.into(),
        authorization_policies: policies.iter().map(|p| p.to_string()).collect(),
        status: pb::WorkloadStatus::Healthy as i32,
        cluster_id: CLUSTER.into(),
        services: HashMap::from([(
            format!("{NS}/svc1.{NS}.svc.company.com"),
            pb::PortList {
                ports: vec![pb::Port {
                    service_port: 80,
                    target_port: 8080,
                    app_protocol: 0,
                }],
            },
        )]),
        ..Default::default()
    }
}

/// `gatewayUID` (workloads.go): `NetworkGateway/<network>/<addr>/<hbone port>`.
fn gateway_uid(network: &str, addr: &str, hbone_port: u32) -> String {
    format!("NetworkGateway/{network}/{addr}/{hbone_port}")
}

/// A network gateway as `convertGateway` (workloads.go) turns it into a workload: uid and name both
/// [`gateway_uid`], namespace and service account those of the gateway's service account (empty when it has
/// none), the gateway's network, an IP address or else the address as the hostname.
fn network_gateway(network: &str, addr: &str, hbone_port: u32, sa: (&str, &str)) -> pb::Workload {
    let uid = gateway_uid(network, addr, hbone_port);
    let ip = addr.parse::<IpAddr>().is_ok();
    pb::Workload {
        uid: uid.clone(),
        name: uid,
        namespace: sa.0.into(),
        service_account: sa.1.into(),
        network: network.into(),
        trust_domain: String::new(),
        addresses: if ip { vec![octets(addr)] } else { vec![] },
        hostname: if ip { String::new() } else { addr.into() },
        ..Default::default()
    }
}

fn as_workload(c: &Change) -> &Workload {
    match c {
        Change::Upsert {
            resource: Resource::Workload(w),
            ..
        } => w,
        other => panic!("not a workload: {other:?}"),
    }
}

fn as_policy(c: &Change) -> &Policy {
    match c {
        Change::Upsert {
            resource: Resource::Policy(p),
            ..
        } => p,
        other => panic!("not a policy: {other:?}"),
    }
}

fn upsert_workload(w: pb::Workload) -> Change {
    let uid = w.uid.clone();
    let c = address_change(
        &uid,
        pb::Address {
            r#type: Some(pb::address::Type::Workload(w)),
        },
    )
    .unwrap_or_else(|e| panic!("{uid}: refused: {e}"));
    assert!(matches!(&c, Change::Upsert { name, .. } if *name == uid));
    c
}

/// The xDS resource name of an Authorization: `<namespace>/<name>` (`WorkloadAuthorization.ResourceName`,
/// pilot/pkg/model/service.go).
fn upsert_policy(a: sec::Authorization) -> Change {
    let key = format!("{}/{}", a.namespace, a.name);
    let c = authorization_change(&key, a).unwrap_or_else(|e| panic!("{key}: refused: {e}"));
    assert!(matches!(&c, Change::Upsert { name, .. } if *name == key));
    c
}

// ---- policies ---------------------------------------------------------------------------------------------------

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

#[test]
fn pod_workloads_keep_every_policy_key_istiod_lists() {
    // The lists ambientindex_test.go expects on pods as PeerAuthentications, AuthorizationPolicies and waypoints
    // change.
    let lists: &[&[&str]] = &[
        &[STATIC_STRICT_KEY],
        &["ns1/converted_peer_authentication_selector"],
        &["ns1/selector", STATIC_STRICT_KEY],
        &[
            "ns1/selector",
            "ns1/converted_peer_authentication_selector-strict",
        ],
        &["ns1/converted_peer_authentication_selector-strict"],
        &["ns1/istio_allow_waypoint_ns1_waypoint-ns"],
    ];
    for list in lists {
        let c = upsert_workload(pod("pod1", "127.0.0.1", list));
        let w = as_workload(&c);
        assert_eq!(w.authorization_policies, *list);
        assert_eq!(w.meta.authorization_policies, *list);
    }
}

#[test]
fn network_gateway_workloads_are_taken_with_their_uid_as_name() {
    // ambientindex_multicluster_test.go: an east-west gateway of class istio-east-west on `remote-network`,
    // HBONE port unset (0), service account the Gateway's name (`GatewaySA`, pilot/pkg/serviceregistry/kube/
    // conversion.go).
    let east_west = network_gateway(
        "remote-network",
        "172.0.1.2",
        0,
        ("istio-system", "east-west"),
    );
    // A gateway of class istio-remote with an HBONE listener on 15008 (`localK8sGatewayToNetworkGateways`,
    // pilot/pkg/serviceregistry/ambient/networks.go; service account `<name>-istio-remote`).
    let remote = network_gateway(
        "network-2",
        "10.10.0.5",
        15008,
        ("istio-system", "east-west-istio-remote"),
    );
    // A gateway without a service account (meshNetworks gateways set none, pilot/pkg/model/network.go), its
    // address a hostname (a Gateway status address of type Hostname).
    let bare = network_gateway("network-3", "eastwest.example.com", 15008, ("", ""));

    let c = upsert_workload(east_west);
    let w = as_workload(&c);
    assert_eq!(w.uid, "NetworkGateway/remote-network/172.0.1.2/0");
    assert_eq!(w.name, "NetworkGateway/remote-network/172.0.1.2/0");
    assert_eq!(w.network, "remote-network");
    assert_eq!(w.addresses, ["172.0.1.2".parse::<IpAddr>().unwrap()]);
    assert_eq!(
        w.spiffe_id(),
        "spiffe://cluster.local/ns/istio-system/sa/east-west"
    );

    let c = upsert_workload(remote);
    let w = as_workload(&c);
    assert_eq!(w.name, "NetworkGateway/network-2/10.10.0.5/15008");
    assert_eq!(w.service_account, "east-west-istio-remote");

    let c = upsert_workload(bare);
    let w = as_workload(&c);
    assert_eq!(w.uid, "NetworkGateway/network-3/eastwest.example.com/15008");
    assert_eq!(w.name, w.uid);
    assert_eq!(w.namespace, "");
    assert_eq!(
        w.service_account, "default",
        "ztunnel's default for an empty one"
    );
    assert!(w.addresses.is_empty());
    assert_eq!(w.hostname, "eastwest.example.com");
}

#[test]
fn a_split_horizon_workload_is_taken_with_its_uid_as_name() {
    // `createSplitHorizonWorkload` (pilot/pkg/serviceregistry/ambient/multicluster.go): uid and name
    // `<network>/SplitHorizonWorkload/<gateway ns>/<gateway name>/<gateway addr>/<service key>`
    // (`generateSplitHorizonWorkloadUID`, helpers.go), as ambientindex_multicluster_test.go expects it; HBONE, type
    // POD, the service's namespace, the gateway as its network gateway on 15008 when the gateway has no HBONE port.
    let uid =
        "remote-network/SplitHorizonWorkload/ns1/east-west/172.0.1.2/ns1/svc2.ns1.svc.company.com";
    let w = pb::Workload {
        uid: uid.into(),
        name: uid.into(),
        namespace: NS.into(),
        network: "remote-network".into(),
        trust_domain: String::new(),
        capacity: Some(1),
        workload_type: pb::WorkloadType::Pod as i32,
        tunnel_protocol: pb::TunnelProtocol::Hbone as i32,
        network_gateway: Some(pb::GatewayAddress {
            destination: Some(pb::gateway_address::Destination::Address(
                pb::NetworkAddress {
                    network: "remote-network".into(),
                    address: octets("172.0.1.2"),
                    length: None,
                },
            )),
            hbone_mtls_port: 15008,
        }),
        cluster_id: "cluster1".into(),
        services: HashMap::from([(
            "ns1/svc2.ns1.svc.company.com".to_owned(),
            pb::PortList {
                ports: vec![pb::Port {
                    service_port: 80,
                    target_port: 0,
                    app_protocol: 0,
                }],
            },
        )]),
        ..Default::default()
    };
    let c = upsert_workload(w);
    let w = as_workload(&c);
    assert_eq!((w.uid.as_str(), w.name.as_str()), (uid, uid));
    assert!(w.addresses.is_empty());
    assert_eq!(
        w.network_gateway,
        Some(GatewayAddress {
            destination: GatewayDestination::Address {
                network: "remote-network".into(),
                ip: "172.0.1.2".parse().unwrap()
            },
            hbone_mtls_port: 15008
        })
    );
    assert!(w.services.contains_key("ns1/svc2.ns1.svc.company.com"));
}

/// Everything above in one store, as an xDS stream would deliver it: each key a workload lists is a policy the
/// store holds, under the key the workload uses.
#[test]
fn istiods_policies_and_the_workloads_listing_them_meet_in_the_store() {
    let mut changes = vec![
        upsert_policy(static_strict()),
        upsert_policy(waypoint_allow()),
    ];
    let mut keys = vec![
        STATIC_STRICT_KEY.to_owned(),
        "ns1/istio_allow_waypoint_ns1_waypoint-ns".to_owned(),
    ];
    for case in CONVERTED.iter().filter(|c| c.namespace == NS) {
        // Some files convert to the same name; the last one delivered stands, as in a stream.
        changes.push(upsert_policy(deny(
            case.namespace,
            &case.name(),
            case.groups,
        )));
        let key = format!("{}/{}", case.namespace, case.name());
        if !keys.contains(&key) {
            keys.push(key);
        }
    }
    let listed: Vec<&str> = keys.iter().map(String::as_str).collect();
    changes.push(upsert_workload(pod("pod1", "127.0.0.1", &listed)));
    changes.push(upsert_workload(pod(
        "pod2",
        "127.0.0.2",
        &[STATIC_STRICT_KEY],
    )));
    changes.push(upsert_workload(network_gateway(
        "remote-network",
        "172.0.1.2",
        0,
        ("istio-system", "east-west"),
    )));

    let store = StateStore::new();
    assert!(store.apply_changes("xds", changes).changed);
    let state = store.current();
    for w in state.workloads.values() {
        for key in &w.authorization_policies {
            let p = state
                .policies
                .get(key)
                .unwrap_or_else(|| panic!("{}: lists {key}, which the store does not hold", w.uid));
            assert_eq!(&p.key(), key);
        }
    }
    assert_eq!(
        state
            .workload_by_ip("127.0.0.1".parse().unwrap())
            .unwrap()
            .authorization_policies,
        keys
    );
    assert_eq!(
        state.policies[STATIC_STRICT_KEY].name,
        "istio_converted_static_strict"
    );
    assert_eq!(
        state
            .workload_by_ip("172.0.1.2".parse().unwrap())
            .unwrap()
            .name,
        "NetworkGateway/remote-network/172.0.1.2/0"
    );
    assert!(state.workloads.contains_key("cluster0//Pod/ns1/pod2"));
}

// ---- what is still refused --------------------------------------------------------------------------------------

#[test]
fn what_weft_cannot_use_is_still_refused() {
    let refused = |w: pb::Workload| {
        address_change(
            "x",
            pb::Address {
                r#type: Some(pb::address::Type::Workload(w)),
            },
        )
        .unwrap_err()
    };
    type Edit = fn(&mut pb::Workload);
    let cases: &[(Edit, &str, &str)] = &[
        (|w| w.uid.clear(), "workload.uid", "must not be empty"),
        (
            |w| w.addresses[0] = vec![127, 0, 1],
            "workload.addresses[0]",
            "3 bytes is not an IP address",
        ),
        (
            |w| w.tunnel_protocol = 7,
            "workload.tunnel_protocol",
            "unknown enum value 7",
        ),
        (|w| w.status = 3, "workload.status", "unknown enum value 3"),
        (
            |w| {
                let ports = w.services.drain().next().unwrap().1;
                w.services.insert("svc1.ns1.svc.company.com".into(), ports);
            },
            "workload.services[\"svc1.ns1.svc.company.com\"]",
            "expected \"namespace/hostname\"",
        ),
        (
            |w| {
                w.services
                    .values_mut()
                    .for_each(|l| l.ports[0].service_port = 70000)
            },
            "workload.services[\"ns1/svc1.ns1.svc.company.com\"].ports[0].service_port",
            "out of range",
        ),
    ];
    for (edit, field, reason) in cases {
        // Each from an istiod workload that is taken as it is.
        let mut w = pod("pod1", "127.0.0.1", &[STATIC_STRICT_KEY]);
        upsert_workload(w.clone());
        edit(&mut w);
        let e = refused(w);
        assert_eq!(e.field, *field, "{e}");
        assert!(e.reason.contains(reason), "{e}");
    }

    type PolicyEdit = fn(&mut sec::Authorization);
    let cases: &[(PolicyEdit, &str, &str)] = &[
        (|a| a.scope = 3, "scope", "unknown enum value 3"),
        (|a| a.action = 2, "action", "unknown enum value 2"),
        (
            |a| a.groups[0].rules[0].matches[0].not_principals[0].match_type = None,
            "groups[0].rules[0].matches[0].not_principals[0]",
            "none of exact, prefix, suffix or presence",
        ),
        (
            |a| a.groups[0].rules[0].matches[0].destination_ports = vec![65536],
            "groups[0].rules[0].matches[0].destination_ports[0]",
            "out of range",
        ),
        (
            |a| {
                a.groups[0].rules[0].matches[0].source_ips = vec![sec::Address {
                    address: vec![10, 0],
                    length: 8,
                }]
            },
            "groups[0].rules[0].matches[0].source_ips[0].address",
            "2 bytes is not an IP address",
        ),
    ];
    for (edit, field, reason) in cases {
        let mut a = static_strict();
        edit(&mut a);
        let e = authorization_change(STATIC_STRICT_KEY, a).unwrap_err();
        assert_eq!(e.field, *field, "{e}");
        assert!(e.reason.contains(reason), "{e}");
    }

    let e = address_change("x", pb::Address { r#type: None }).unwrap_err();
    assert_eq!(e.field, "type");
}
