//! Istio's xDS resources into weft's model: every field ztunnel reads, its defaults, and a refusal naming the proto
//! field for every value weft cannot take as it is.

#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::net::IpAddr;

use weft_proto::istio::security as sec;
use weft_proto::istio::workload as pb;
use weft_state::xds::{address_change, authorization, service, workload};
use weft_state::{
    AppTunnelProtocol, Change, GatewayDestination, IpFamilies, LbHealthPolicy, LbMode, LbScope,
    NetworkMode, PolicyAction, PolicyScope, Resource, StringMatch, TunnelProtocol, Visibility,
};

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn octets(s: &str) -> Vec<u8> {
    match ip(s) {
        IpAddr::V4(v) => v.octets().to_vec(),
        IpAddr::V6(v) => v.octets().to_vec(),
    }
}

fn gw_addr(a: &str, port: u32) -> pb::GatewayAddress {
    pb::GatewayAddress {
        destination: Some(pb::gateway_address::Destination::Address(
            pb::NetworkAddress {
                network: "net1".into(),
                address: octets(a),
                length: None,
            },
        )),
        hbone_mtls_port: port,
    }
}

fn gw_host(ns: &str, host: &str) -> pb::GatewayAddress {
    pb::GatewayAddress {
        destination: Some(pb::gateway_address::Destination::Hostname(
            pb::NamespacedHostname {
                namespace: ns.into(),
                hostname: host.into(),
            },
        )),
        hbone_mtls_port: 15008,
    }
}

fn full_workload() -> pb::Workload {
    pb::Workload {
        uid: "c1//v1/Pod/shop/cart-1".into(),
        name: "cart-1".into(),
        namespace: "shop".into(),
        addresses: vec![octets("10.1.0.5"), octets("fd00::5")],
        network: "net1".into(),
        tunnel_protocol: pb::TunnelProtocol::Hbone as i32,
        trust_domain: "td.example".into(),
        service_account: "cart".into(),
        waypoint: Some(gw_host("shop", "waypoint.shop.svc.cluster.local")),
        node: "node-a".into(),
        canonical_name: "cart".into(),
        canonical_revision: "v2".into(),
        workload_type: pb::WorkloadType::Pod as i32,
        workload_name: "cart".into(),
        native_tunnel: true,
        authorization_policies: vec!["shop/only-front".into()],
        status: pb::WorkloadStatus::Unhealthy as i32,
        cluster_id: "c1".into(),
        network_gateway: Some(gw_addr("192.168.0.1", 15009)),
        hostname: "cart-1.shop.example".into(),
        services: HashMap::from([(
            "shop/cart.shop.svc.cluster.local".to_owned(),
            pb::PortList {
                ports: vec![
                    pb::Port {
                        service_port: 80,
                        target_port: 8080,
                        app_protocol: 0,
                    },
                    pb::Port {
                        service_port: 443,
                        target_port: 0,
                        app_protocol: 0,
                    },
                ],
            },
        )]),
        application_tunnel: Some(pb::ApplicationTunnel {
            protocol: pb::application_tunnel::Protocol::Proxy as i32,
            port: 15088,
        }),
        locality: Some(pb::Locality {
            region: "eu".into(),
            zone: "eu-1a".into(),
            subzone: "r3".into(),
        }),
        network_mode: pb::NetworkMode::HostNetwork as i32,
        extensions: vec![],
        capacity: Some(3),
    }
}

#[test]
fn a_workload_with_every_field() {
    let w = workload(full_workload()).unwrap();
    assert_eq!(w.addresses, [ip("10.1.0.5"), ip("fd00::5")]);
    assert_eq!(w.protocol, TunnelProtocol::Hbone);
    assert_eq!(w.spiffe_id(), "spiffe://td.example/ns/shop/sa/cart");
    assert!(!w.healthy);
    assert_eq!(w.workload_type, "pod");
    assert_eq!(
        w.waypoint.as_ref().unwrap().destination,
        GatewayDestination::Hostname {
            namespace: "shop".into(),
            hostname: "waypoint.shop.svc.cluster.local".into()
        }
    );
    let ng = w.network_gateway.as_ref().unwrap();
    assert_eq!(ng.destination.to_string(), "net1/192.168.0.1");
    assert_eq!(ng.hbone_mtls_port, 15009);
    assert_eq!(
        w.services["shop/cart.shop.svc.cluster.local"],
        [(80, 8080), (443, 0)].into_iter().collect()
    );
    let t = w.application_tunnel.unwrap();
    assert_eq!(
        (t.protocol, t.port),
        (AppTunnelProtocol::Proxy, Some(15088))
    );
    assert_eq!(w.locality.subzone, "r3");
    assert_eq!(w.network_mode, NetworkMode::HostNetwork);
    assert_eq!((w.capacity, w.native_tunnel), (3, true));
    assert_eq!(w.meta.canonical_revision, "v2");
    assert_eq!(w.meta.zone, "eu-1a");
    assert_eq!(w.meta.authorization_policies, ["shop/only-front"]);
    assert_eq!(w.meta.cluster_id, "c1");
}

#[test]
fn workload_defaults_are_ztunnels() {
    let w = workload(pb::Workload {
        uid: "u1".into(),
        namespace: "default".into(),
        workload_type: 99,
        ..Default::default()
    })
    .unwrap();
    assert_eq!(w.trust_domain, "cluster.local");
    assert_eq!(w.service_account, "default");
    assert_eq!(w.cluster_id, "Kubernetes");
    assert_eq!(w.capacity, 1);
    assert_eq!(w.protocol, TunnelProtocol::Tcp);
    assert!(w.healthy);
    assert_eq!(
        w.workload_type, "deployment",
        "an unknown type reads as the default"
    );
    assert!(w.waypoint.is_none() && w.application_tunnel.is_none());
}

#[test]
fn each_bad_workload_field_is_named() {
    type Edit = fn(&mut pb::Workload);
    let cases: &[(Edit, &str, &str)] = &[
        (|w| w.uid.clear(), "uid", "must not be empty"),
        (
            |w| w.addresses[1] = vec![1, 2, 3],
            "addresses[1]",
            "3 bytes",
        ),
        (
            |w| w.tunnel_protocol = 2,
            "tunnel_protocol",
            "LEGACY_ISTIO_MTLS",
        ),
        (
            |w| w.tunnel_protocol = 7,
            "tunnel_protocol",
            "unknown enum value 7",
        ),
        (|w| w.status = 5, "status", "unknown"),
        (|w| w.network_mode = 9, "network_mode", "unknown"),
        (
            |w| w.waypoint = Some(pb::GatewayAddress::default()),
            "waypoint",
            "neither an address nor a hostname",
        ),
        (
            |w| w.network_gateway = Some(gw_addr("10.0.0.1", 70000)),
            "network_gateway.hbone_mtls_port",
            "out of range",
        ),
        (
            |w| {
                let l = w
                    .services
                    .remove("shop/cart.shop.svc.cluster.local")
                    .unwrap();
                w.services.insert("cart".into(), l);
            },
            "services[\"cart\"]",
            "expected \"namespace/hostname\"",
        ),
        (
            |w| {
                w.services
                    .values_mut()
                    .for_each(|l| l.ports[0].service_port = 65536)
            },
            "services[\"shop/cart.shop.svc.cluster.local\"].ports[0].service_port",
            "out of range",
        ),
        (
            |w| {
                w.services
                    .values_mut()
                    .for_each(|l| l.ports[1].service_port = 0)
            },
            "services[\"shop/cart.shop.svc.cluster.local\"].ports[1].service_port",
            "0 is not a valid port",
        ),
        (
            |w| w.application_tunnel.as_mut().unwrap().protocol = 4,
            "application_tunnel.protocol",
            "unknown",
        ),
    ];
    for (edit, field, reason) in cases {
        let mut w = full_workload();
        edit(&mut w);
        let e = workload(w).unwrap_err();
        assert_eq!(e.field, *field, "{e}");
        assert!(e.reason.contains(reason), "{e}");
    }
}

fn full_service() -> pb::Service {
    pb::Service {
        name: "cart".into(),
        namespace: "shop".into(),
        hostname: "cart.shop.svc.cluster.local".into(),
        addresses: vec![
            pb::NetworkAddress {
                network: "".into(),
                address: octets("10.96.0.10"),
                length: None,
            },
            pb::NetworkAddress {
                network: "net1".into(),
                address: octets("fd00::10"),
                length: Some(128),
            },
            pb::NetworkAddress {
                network: "".into(),
                address: octets("10.97.0.0"),
                length: Some(16),
            },
        ],
        ports: vec![pb::Port {
            service_port: 80,
            target_port: 8080,
            app_protocol: 0,
        }],
        subject_alt_names: vec!["spiffe://td/ns/shop/sa/cart".into()],
        waypoint: Some(gw_host("shop", "wp.shop.svc.cluster.local")),
        load_balancing: Some(pb::LoadBalancing {
            routing_preference: vec![
                pb::load_balancing::Scope::Region as i32,
                pb::load_balancing::Scope::Zone as i32,
            ],
            mode: pb::load_balancing::Mode::Failover as i32,
            health_policy: pb::load_balancing::HealthPolicy::AllowAll as i32,
        }),
        ip_families: pb::IpFamilies::Dual as i32,
        extensions: vec![],
        canonical: true,
        ingress_use_waypoint: true,
        weighted_waypoints: vec![pb::WeightedWaypoint {
            destination: Some(gw_host("shop", "wp2.shop.svc.cluster.local")),
            weight: 10,
        }],
        visibility: pb::service::Visibility::Namespace as i32,
    }
}

#[test]
fn a_service_with_every_field() {
    let s = service(full_service()).unwrap();
    assert_eq!(s.key(), "shop/cart.shop.svc.cluster.local");
    assert_eq!(
        s.vips,
        [
            (String::new(), ip("10.96.0.10")),
            ("net1".into(), ip("fd00::10"))
        ]
    );
    assert_eq!(
        s.cidr_vips,
        [(String::new(), "10.97.0.0/16".parse().unwrap())]
    );
    assert_eq!(s.ports, [(80, 8080)].into_iter().collect());
    assert_eq!(s.ip_families, Some(IpFamilies::Dual));
    assert_eq!(s.visibility, Visibility::Namespace);
    assert!(s.canonical && s.ingress_use_waypoint);
    let lb = s.load_balancing.unwrap();
    assert_eq!(lb.routing_preference, [LbScope::Region, LbScope::Zone]);
    assert_eq!(
        (lb.mode, lb.health_policy),
        (LbMode::Failover, LbHealthPolicy::AllowAll)
    );
    assert_eq!(s.weighted_waypoints[0].weight, 10);
    // Unknown visibility fails open to PUBLIC, as in ztunnel.
    let mut p = full_service();
    p.visibility = 42;
    assert_eq!(service(p).unwrap().visibility, Visibility::Public);
}

#[test]
fn each_bad_service_field_is_named() {
    type Edit = fn(&mut pb::Service);
    let cases: &[(Edit, &str, &str)] = &[
        (
            |s| s.addresses[0].address = vec![0; 5],
            "addresses[0].address",
            "5 bytes",
        ),
        (
            |s| s.addresses[2].length = Some(33),
            "addresses[2].length",
            "too long",
        ),
        (
            |s| s.ports[0].target_port = 1 << 20,
            "ports[0].target_port",
            "out of range",
        ),
        (|s| s.ip_families = 8, "ip_families", "unknown"),
        (
            |s| s.weighted_waypoints[0].destination = None,
            "weighted_waypoints[0].destination",
            "needs a destination",
        ),
        (
            |s| s.load_balancing.as_mut().unwrap().routing_preference[1] = 0,
            "load_balancing.routing_preference[1]",
            "UNSPECIFIED_SCOPE",
        ),
        (
            |s| s.load_balancing.as_mut().unwrap().mode = 9,
            "load_balancing.mode",
            "unknown",
        ),
    ];
    for (edit, field, reason) in cases {
        let mut s = full_service();
        edit(&mut s);
        let e = service(s).unwrap_err();
        assert_eq!(e.field, *field, "{e}");
        assert!(e.reason.contains(reason), "{e}");
    }
}

fn exact(s: &str) -> sec::StringMatch {
    sec::StringMatch {
        match_type: Some(sec::string_match::MatchType::Exact(s.into())),
    }
}

fn policy() -> sec::Authorization {
    sec::Authorization {
        name: "allow-front".into(),
        namespace: "shop".into(),
        scope: sec::Scope::WorkloadSelector as i32,
        action: sec::Action::Allow as i32,
        groups: vec![sec::Group {
            rules: vec![sec::Rules {
                matches: vec![sec::Match {
                    namespaces: vec![exact("front")],
                    principals: vec![sec::StringMatch {
                        match_type: Some(sec::string_match::MatchType::Presence(())),
                    }],
                    not_principals: vec![sec::StringMatch {
                        match_type: Some(sec::string_match::MatchType::Suffix("-bad".into())),
                    }],
                    source_ips: vec![sec::Address {
                        address: octets("10.0.0.0"),
                        length: 8,
                    }],
                    destination_ports: vec![8080, 0],
                    service_accounts: vec![sec::ServiceAccountMatch {
                        namespace: "front".into(),
                        service_account: "web".into(),
                    }],
                    ..Default::default()
                }],
            }],
        }],
        dry_run: true,
        extensions: vec![],
    }
}

#[test]
fn an_authorization_with_its_rules() {
    let p = authorization(policy()).unwrap();
    assert_eq!(p.key(), "shop/allow-front");
    assert_eq!(
        (p.scope, p.action, p.dry_run),
        (PolicyScope::WorkloadSelector, PolicyAction::Allow, true)
    );
    let m = &p.rules[0][0][0];
    assert_eq!(m.namespaces, [StringMatch::Exact("front".into())]);
    assert_eq!(m.principals, [StringMatch::Presence]);
    assert_eq!(m.not_principals, [StringMatch::Suffix("-bad".into())]);
    assert_eq!(m.source_ips, ["10.0.0.0/8".parse().unwrap()]);
    assert_eq!(
        m.destination_ports,
        [8080, 0],
        "port 0 matches nothing, so it is kept"
    );
    assert_eq!(m.service_accounts[0].service_account, "web");
}

#[test]
fn a_policy_value_ztunnel_would_drop_is_refused_instead() {
    type Edit = fn(&mut sec::Authorization);
    let cases: &[(Edit, &str, &str)] = &[
        (
            |a| a.groups[0].rules[0].matches[0].source_ips[0].address = vec![1],
            "groups[0].rules[0].matches[0].source_ips[0].address",
            "1 bytes",
        ),
        (
            |a| a.groups[0].rules[0].matches[0].source_ips[0].length = 40,
            "groups[0].rules[0].matches[0].source_ips[0].length",
            "too long",
        ),
        (
            |a| {
                a.groups[0].rules[0].matches[0]
                    .namespaces
                    .push(sec::StringMatch::default())
            },
            "groups[0].rules[0].matches[0].namespaces[1]",
            "none of exact, prefix, suffix or presence",
        ),
        (
            |a| {
                a.groups[0].rules[0].matches[0]
                    .not_destination_ports
                    .push(65616)
            },
            "groups[0].rules[0].matches[0].not_destination_ports[0]",
            "out of range",
        ),
        (|a| a.action = 2, "action", "unknown"),
        (|a| a.scope = 3, "scope", "unknown"),
    ];
    for (edit, field, reason) in cases {
        let mut a = policy();
        edit(&mut a);
        let e = authorization(a).unwrap_err();
        assert_eq!(e.field, *field, "{e}");
        assert!(e.reason.contains(reason), "{e}");
    }
}

#[test]
fn an_address_is_a_workload_or_a_service() {
    let c = address_change(
        "c1//v1/Pod/shop/cart-1",
        pb::Address {
            r#type: Some(pb::address::Type::Workload(full_workload())),
        },
    )
    .unwrap();
    assert!(
        matches!(c, Change::Upsert { ref name, resource: Resource::Workload(_) } if name == "c1//v1/Pod/shop/cart-1")
    );
    let mut s = full_service();
    s.ip_families = 9;
    let e = address_change(
        "shop/cart.shop.svc.cluster.local",
        pb::Address {
            r#type: Some(pb::address::Type::Service(s)),
        },
    )
    .unwrap_err();
    assert_eq!(e.field, "service.ip_families");
    let e = address_change("x", pb::Address { r#type: None }).unwrap_err();
    assert_eq!(e.field, "type");
}
