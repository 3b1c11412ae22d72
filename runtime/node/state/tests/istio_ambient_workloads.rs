//! What istiod really sends a ztunnel node as workloads, taken by weft's xDS conversion with every name as istiod
//! wrote it: pod workloads listing istiod's policy keys, network-gateway and split-horizon workloads named by uid
//! with slashes, both meeting the policies in the store; and what weft cannot use at all is still refused.
//! Each test fails if weft refuses one of istiod's names again (most are not Kubernetes names: istiod picks `_`
//! because Kubernetes refuses it). The resources are rebuilt from Istio's own code and test data (istio/istio at
//! 86c9f01fd735fb01d8192f5bcaf0d424afb7f14c; fixtures in `istio_ambient/mod.rs`).
#![allow(clippy::unwrap_used)] // a test panics to fail

mod istio_ambient;

use istio_ambient::*;

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
