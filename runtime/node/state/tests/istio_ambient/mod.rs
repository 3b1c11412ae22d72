//! Fixtures shared by the istio_ambient_* tests: istiod's resources for a ztunnel node, rebuilt from istio/istio at
//! 86c9f01fd735fb01d8192f5bcaf0d424afb7f14c (paths in comments are in that tree), and what weft makes of them.
#![allow(dead_code, unused_imports)] // each test file uses some of them
#![allow(clippy::unwrap_used)] // a test panics to fail

pub use std::collections::HashMap;
pub use std::net::IpAddr;

pub use weft_proto::istio::security as sec;
pub use weft_proto::istio::workload as pb;
pub use weft_state::xds::{address_change, authorization, authorization_change};
pub use weft_state::{
    Change, GatewayAddress, GatewayDestination, Policy, PolicyAction, PolicyMatch, PolicyScope,
    Resource, StateStore, StringMatch, TunnelProtocol, Workload,
};

// ---- istiod's names -------------------------------------------------------------------------------------------

/// The root namespace of the Istio tests (`systemNS`, pilot/pkg/serviceregistry/ambient/ambientindex_test.go).
pub const ROOT_NS: &str = "istio-system";
/// `staticStrictPolicyName`, pilot/pkg/serviceregistry/ambient/authorization.go.
pub const STATIC_STRICT: &str = "istio_converted_static_strict";
/// What a STRICT workload lists (`effectivePeerAuthenticationKeys`, authorization.go: `<root ns>/<static name>`).
pub const STATIC_STRICT_KEY: &str = "istio-system/istio_converted_static_strict";
/// `convertedPeerAuthenticationPrefix`, pilot/pkg/model/authentication.go (applied by `GetAmbientPolicyConfigName`).
pub const CONVERTED_PA: &str = "converted_peer_authentication_";
/// The Istio tests' namespace, cluster and network (`testNS`, `testC`, `testNW`, ambientindex_test.go).
pub const NS: &str = "ns1";
pub const CLUSTER: &str = "cluster0";
pub const NETWORK: &str = "testnetwork";

// ---- building istiod's resources -------------------------------------------------------------------------------

pub fn octets(s: &str) -> Vec<u8> {
    match s.parse::<IpAddr>().unwrap() {
        IpAddr::V4(v) => v.octets().to_vec(),
        IpAddr::V6(v) => v.octets().to_vec(),
    }
}

pub fn presence() -> sec::StringMatch {
    sec::StringMatch {
        match_type: Some(sec::string_match::MatchType::Presence(())),
    }
}

pub fn exact(s: &str) -> sec::StringMatch {
    sec::StringMatch {
        match_type: Some(sec::string_match::MatchType::Exact(s.into())),
    }
}

/// One rule of a converted PeerAuthentication. Every rule istiod writes for one holds a single match
/// (`convertPeerAuthentication`, authorization.go), so a rule here is that match.
#[derive(Debug, Clone, Copy)]
pub enum Rule {
    /// `notPrincipals: [presence]`: a caller without an mTLS identity.
    Plaintext,
    /// `notPrincipals: [presence]` and `destinationPorts: [port]`: a plaintext caller to that port (a STRICT port).
    PlaintextTo(u32),
    /// `notDestinationPorts: [port]`: any port but this one (a PERMISSIVE or DISABLE port under STRICT).
    NotPort(u32),
}

impl Rule {
    /// As istiod writes it (protobuf).
    pub fn to_pb(self) -> sec::Rules {
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
    pub fn to_model(self) -> Vec<PolicyMatch> {
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
pub fn deny(namespace: &str, name: &str, groups: &[&[Rule]]) -> sec::Authorization {
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
pub fn deny_model(namespace: &str, name: &str, groups: &[&[Rule]]) -> Policy {
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
pub fn static_strict() -> sec::Authorization {
    deny(ROOT_NS, STATIC_STRICT, &[&[Rule::Plaintext]])
}

/// The implicit ALLOW-from-waypoint policy, as `implicitWaypointPolicy` builds it (policies.go) for the waypoint
/// `waypoint-ns` in `ns1` with the service accounts of `TestDefaultAllowWaypointPolicy` (ambientindex_test.go):
/// named `istio_allow_waypoint_<ns>_<name>`, in the waypoint's namespace, one exact principal per service
/// account (the SPIFFE id without `spiffe://`).
pub fn waypoint_allow() -> sec::Authorization {
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
pub struct Converted {
    pub file: &'static str,
    pub namespace: &'static str,
    pub peer_authentication: &'static str,
    pub groups: &'static [&'static [Rule]],
}

/// Every non-empty expected output of istiod's PeerAuthentication conversion in Istio's test data (the other
/// `peer-authn-*.yaml` outputs are empty: nothing is converted), plus the `selector-strict` PeerAuthentication of
/// ambientindex_test.go (`xdsConvertedPeerAuthSelectorStrict`). Inputs without a namespace (the single-policy
/// `-in.yaml` files) are given `ns1`: in a cluster the policy takes its PeerAuthentication's namespace
/// (`Namespace: cfg.Namespace` in `convertPeerAuthentication`, authorization.go).
pub const CONVERTED: &[Converted] = &[
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
    pub fn of(file: &str) -> &'static Converted {
        CONVERTED.iter().find(|c| c.file == file).unwrap()
    }

    pub fn name(&self) -> String {
        format!("{CONVERTED_PA}{}", self.peer_authentication)
    }
}

/// A pod workload as `podWorkloadBuilder` builds it (pilot/pkg/serviceregistry/ambient/workloads.go) for the pods
/// of ambientindex_test.go: uid `<cluster>//Pod/<ns>/<name>` (`generatePodUID`), the cluster's network, the
/// mesh's trust domain left empty when it is `cluster.local` (`pickTrustDomain`), workload type POD, HBONE for a
/// captured pod, and the policy keys istiod computed for it.
pub fn pod(name: &str, ip: &str, policies: &[&str]) -> pb::Workload {
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
pub fn gateway_uid(network: &str, addr: &str, hbone_port: u32) -> String {
    format!("NetworkGateway/{network}/{addr}/{hbone_port}")
}

/// A network gateway as `convertGateway` (workloads.go) turns it into a workload: uid and name both
/// [`gateway_uid`], namespace and service account those of the gateway's service account (empty when it has
/// none), the gateway's network, an IP address or else the address as the hostname.
pub fn network_gateway(
    network: &str,
    addr: &str,
    hbone_port: u32,
    sa: (&str, &str),
) -> pb::Workload {
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

pub fn as_workload(c: &Change) -> &Workload {
    match c {
        Change::Upsert {
            resource: Resource::Workload(w),
            ..
        } => w,
        other => panic!("not a workload: {other:?}"),
    }
}

pub fn as_policy(c: &Change) -> &Policy {
    match c {
        Change::Upsert {
            resource: Resource::Policy(p),
            ..
        } => p,
        other => panic!("not a policy: {other:?}"),
    }
}

pub fn upsert_workload(w: pb::Workload) -> Change {
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
pub fn upsert_policy(a: sec::Authorization) -> Change {
    let key = format!("{}/{}", a.namespace, a.name);
    let c = authorization_change(&key, a).unwrap_or_else(|e| panic!("{key}: refused: {e}"));
    assert!(matches!(&c, Change::Upsert { name, .. } if *name == key));
    c
}

// ---- policies ---------------------------------------------------------------------------------------------------
