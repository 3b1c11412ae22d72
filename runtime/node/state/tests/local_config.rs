//! Tests of the local config file's ztunnel part: ztunnel's own example, every workload, service and policy field,
//! defaults, and the hook metadata built from a workload.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;

use ipnet::IpNet;
use weft_state::local::{load, parse};
use weft_state::{
    AppTunnelProtocol, ApplicationTunnel, GatewayAddress, GatewayDestination, IpFamilies,
    NetworkMode, PolicyAction, PolicyMatch, PolicyScope, ServiceAccountMatch, StringMatch,
    TunnelProtocol, Visibility,
};

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn net(s: &str) -> IpNet {
    s.parse().unwrap()
}

fn fixture(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

#[test]
fn ztunnel_localhost_example_parses_as_is() {
    let cfg = load(&fixture("localhost.yaml")).unwrap();
    assert_eq!(cfg.workloads.len(), 2);
    assert_eq!(cfg.services.len(), 2);
    assert_eq!(cfg.policies.len(), 1);
    assert!(cfg.plugins.is_empty());

    let local = &cfg.workloads[0];
    assert_eq!(local.uid, "cluster1//v1/Pod/default/local");
    assert_eq!(local.name, "local");
    assert_eq!(local.namespace, "default");
    assert_eq!(local.service_account, "default");
    assert_eq!(local.trust_domain, "cluster.local");
    assert_eq!(local.addresses, vec![ip("127.0.0.1")]);
    assert_eq!(local.protocol, TunnelProtocol::Hbone);
    assert_eq!(local.node, "local");
    assert_eq!(local.network, "");
    assert!(local.healthy);
    assert_eq!(
        local.spiffe_id(),
        "spiffe://cluster.local/ns/default/sa/default"
    );
    let ports: BTreeMap<u16, u16> = [(80, 8080)].into();
    assert_eq!(local.services.get("default/example.com"), Some(&ports));
    assert_eq!(local.services.get("default/example2.com"), Some(&ports));
    assert_eq!(cfg.workloads[1].protocol, TunnelProtocol::Tcp);
    assert_eq!(cfg.workloads[1].addresses, vec![ip("127.0.0.2")]);

    let p = &cfg.policies[0];
    assert_eq!(p.key(), "default/deny-9999");
    assert_eq!(p.scope, PolicyScope::Namespace);
    assert_eq!(p.action, PolicyAction::Allow);
    assert!(!p.dry_run);
    let expected = PolicyMatch {
        not_destination_ports: vec![9999],
        ..Default::default()
    };
    assert_eq!(p.rules, vec![vec![vec![expected]]]);

    let svc = &cfg.services[0];
    assert_eq!(svc.key(), "default/example.com");
    assert_eq!(svc.vips, vec![(String::new(), ip("127.10.0.1"))]);
    assert_eq!(svc.ports, [(80, 8080)].into());
    assert_eq!(
        svc.subject_alt_names,
        vec!["spiffe://cluster.local/ns/default/sa/local".to_owned()]
    );
    assert_eq!(
        cfg.services[1].vips,
        vec![("remote".to_owned(), ip("127.10.0.2"))]
    );

    let state = cfg.into_state(7);
    assert_eq!(state.version, 7);
    let r = state
        .resolve(SocketAddr::new(ip("127.10.0.1"), 80))
        .unwrap();
    assert_eq!(r.addr.port(), 8080);
    assert!(r.addr.ip() == ip("127.0.0.1") || r.addr.ip() == ip("127.0.0.2"));
}

#[test]
fn workload_accepts_every_ztunnel_field_and_builds_meta() {
    let cfg = parse(
        r#"
workloads:
- uid: c1//v1/Pod/shop/cart-7d9
  name: cart-7d9
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
  workloadType: deployment
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
  labels: {app: cart, version: 2, canary: true}
"#,
        Path::new("/"),
    )
    .unwrap();
    let w = &cfg.workloads[0];
    assert_eq!(w.addresses, vec![ip("10.1.0.5"), ip("fd00::5")]);
    assert_eq!(w.trust_domain, "td.example");
    assert_eq!(w.spiffe_id(), "spiffe://td.example/ns/shop/sa/cart");
    assert_eq!(
        w.waypoint,
        Some(GatewayAddress {
            destination: GatewayDestination::Address {
                network: String::new(),
                ip: ip("10.1.0.100")
            },
            hbone_mtls_port: 15008
        })
    );
    assert_eq!(
        w.network_gateway
            .as_ref()
            .map(|g| g.destination.to_string()),
        Some("net2/192.168.0.1".to_owned())
    );
    assert_eq!(w.workload_type, "deployment");
    assert_eq!(w.locality.subzone, "rack3");
    assert_eq!(w.network_mode, NetworkMode::HostNetwork);
    assert_eq!((w.capacity, w.native_tunnel), (2, true));
    assert_eq!(w.authorization_policies, ["shop/only-frontend"]);
    assert_eq!(
        w.application_tunnel,
        Some(ApplicationTunnel {
            protocol: AppTunnelProtocol::Proxy,
            port: Some(15088)
        })
    );
    assert!(!w.healthy);
    assert_eq!(w.network, "net1");
    assert_eq!(
        w.services["shop/cart.shop.svc.cluster.local"],
        [(80, 8080), (443, 0)].into()
    );
    let m = &*w.meta;
    assert_eq!(m.uid, "c1//v1/Pod/shop/cart-7d9");
    assert_eq!(m.name, "cart-7d9");
    assert_eq!(m.namespace, "shop");
    assert_eq!(m.service_account, "cart");
    assert_eq!(m.trust_domain, "td.example");
    assert_eq!(m.node, "node-a");
    assert_eq!(m.workload_name, "cart");
    assert_eq!(m.canonical_name, "cart");
    assert_eq!(m.canonical_revision, "v2");
    assert_eq!(m.cluster_id, "c1");
    assert_eq!(m.region, "eu-west");
    assert_eq!(m.zone, "eu-west-1a");
    assert_eq!(
        m.authorization_policies,
        vec!["shop/only-frontend".to_owned()]
    );
    assert_eq!(
        m.labels,
        vec![
            ("app".to_owned(), "cart".to_owned()),
            ("canary".to_owned(), "true".to_owned()),
            ("version".to_owned(), "2".to_owned()),
        ]
    );
    assert_eq!(m.spiffe_id(), w.spiffe_id());
}

#[test]
fn workload_defaults() {
    let cfg = parse(
        "workloads:\n- name: a\n  namespace: ns\n  serviceAccount: \"\"\n  trustDomain: \"\"\n  workloadIps: [10.0.0.1]\n",
        Path::new("/"),
    )
    .unwrap();
    let w = &cfg.workloads[0];
    assert_eq!(
        w.uid, "//Pod/ns/a",
        "uid derived like Istio's cluster//Pod/ns/name"
    );
    assert_eq!(w.service_account, "default");
    assert_eq!(w.trust_domain, "cluster.local");
    assert_eq!(w.protocol, TunnelProtocol::Tcp);
    assert!(w.healthy);
    assert!(w.services.is_empty(), "services is optional in weft");
    assert!(w.waypoint.is_none());
    assert!(w.application_tunnel.is_none());
    assert_eq!(w.meta.uid, w.uid);
    assert_eq!(w.meta.service_account, "default");
    assert_eq!(w.meta.trust_domain, "cluster.local");
    assert!(w.meta.labels.is_empty());
}

#[test]
fn empty_and_comment_only_files_are_empty_configs() {
    for text in [
        "",
        "# nothing yet\n",
        "---\n",
        "workloads: []\nservices: []\npolicies: []\nplugins: []\n",
    ] {
        let cfg = parse(text, Path::new("/")).unwrap();
        assert_eq!(cfg, Default::default(), "{text:?}");
    }
}

#[test]
fn service_accepts_every_ztunnel_field_and_folds_endpoints() {
    let cfg = parse(
        r#"
workloads:
- uid: w1
  namespace: shop
  workloadIps: [10.1.0.1]
- uid: w2
  namespace: shop
  workloadIps: [10.1.0.2]
  services: {shop/cart.example: {80: 9090}}
services:
- name: cart
  namespace: shop
  hostname: cart.example
  vips: ["/10.96.0.10", "net1/fd00::10"]
  cidrVips: [{network: "", cidr: 10.97.0.0/16}]
  ports: {80: 8080, 443: 8443}
  endpoints:
    w1: {workloadUid: w1, port: {80: 8081}, status: Healthy}
    w2: {workloadUid: w2, port: {80: 1}, status: Healthy}
    ghost: {workloadUid: ghost, port: {80: 8080}, status: Unhealthy}
  subjectAltNames: [spiffe://td/ns/shop/sa/cart]
  waypoint: {destination: shop/waypoint.shop.svc.cluster.local, hboneMtlsPort: 15008}
  weightedWaypoints:
  - destination: {destination: shop/wp2.shop.svc.cluster.local, hboneMtlsPort: 15008}
    weight: 10
  loadBalancer: {routingPreferences: [Network, Region, Zone], mode: Failover, healthPolicy: AllowAll}
  ipFamilies: Dual
  canonical: true
  visibility: Namespace
- name: bare
  namespace: shop
  hostname: bare.example
"#,
        Path::new("/"),
    )
    .unwrap();
    let s = &cfg.services[0];
    assert_eq!(
        s.vips,
        vec![
            (String::new(), ip("10.96.0.10")),
            ("net1".to_owned(), ip("fd00::10"))
        ]
    );
    assert_eq!(s.ports, [(80, 8080), (443, 8443)].into());
    assert_eq!(
        s.subject_alt_names,
        vec!["spiffe://td/ns/shop/sa/cart".to_owned()]
    );
    // A service-side endpoint adds the service to the workload...
    assert_eq!(
        cfg.workloads[0].services["shop/cart.example"],
        [(80, 8081)].into()
    );
    // ...but the workload's own declaration wins.
    assert_eq!(
        cfg.workloads[1].services["shop/cart.example"],
        [(80, 9090)].into()
    );
    assert_eq!(s.ip_families, Some(IpFamilies::Dual));
    assert_eq!(s.visibility, Visibility::Namespace);
    assert!(s.canonical);
    assert!(s.visible_to("shop") && !s.visible_to("other"));
    // vips and ports are optional in weft.
    let bare = &cfg.services[1];
    assert!(bare.vips.is_empty() && bare.ports.is_empty());
    assert!(bare.is_headless());
    assert_eq!(bare.ip_families, None);
    assert_eq!(bare.visibility, Visibility::Public);
    assert!(!bare.canonical && bare.visible_to("other"));
}

#[test]
fn application_tunnel_forms() {
    let cfg = parse(
        r#"
workloads:
- {uid: a, namespace: ns, workloadIps: [10.0.0.1], applicationTunnel: {protocol: PROXY}}
- {uid: b, namespace: ns, workloadIps: [10.0.0.2], applicationTunnel: {protocol: NONE, port: 9000}}
- {uid: c, namespace: ns, workloadIps: [10.0.0.3], applicationTunnel: {protocol: PROXY, port: 0}}
services:
- {name: v4, namespace: ns, hostname: v4.example, ipFamilies: IPv4}
- {name: v6, namespace: ns, hostname: v6.example, ipFamilies: IPv6}
"#,
        Path::new("/"),
    )
    .unwrap();
    let t: Vec<_> = cfg.workloads.iter().map(|w| w.application_tunnel).collect();
    assert_eq!(
        t,
        vec![
            Some(ApplicationTunnel {
                protocol: AppTunnelProtocol::Proxy,
                port: None
            }),
            Some(ApplicationTunnel {
                protocol: AppTunnelProtocol::None,
                port: Some(9000)
            }),
            // Port 0 means "the CONNECT port", as xDS's unset 0 does.
            Some(ApplicationTunnel {
                protocol: AppTunnelProtocol::Proxy,
                port: None
            }),
        ]
    );
    assert_eq!(cfg.services[0].ip_families, Some(IpFamilies::Ipv4));
    assert_eq!(cfg.services[1].ip_families, Some(IpFamilies::Ipv6));
    let err = parse(
        "workloads:\n- {uid: a, namespace: ns, applicationTunnel: {protocol: HTTP}}\n",
        Path::new("/"),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("applicationTunnel"), "{err}");
}

#[test]
fn every_policy_match_field() {
    let cfg = parse(
        r#"
policies:
- name: everything
  namespace: shop
  scope: WorkloadSelector
  action: Deny
  dryRun: true
  rules:
  - - - namespaces: [!Exact shop, !Prefix team-]
        notNamespaces: [!Suffix -prod]
        principals:
        - !Exact td/ns/shop/sa/front
        - !Presence []
        notPrincipals:
        - !Presence
        serviceAccounts: [{namespace: shop, serviceAccount: front}]
        notServiceAccounts: [{namespace: shop, serviceAccount: batch}]
        sourceIps: [10.0.0.0/8, 192.168.1.7]
        notSourceIps: [10.9.0.0/16]
        destinationIps: ["fd00::/64", "fd00::1"]
        notDestinationIps: [172.16.0.1/32]
        destinationPorts: [80, 443]
        notDestinationPorts: [9999]
      - destinationPorts: [8080]
    - - principals: [!Prefix td/ns/admin/]
  - - - {}
- name: global-allow
  namespace: istio-system
  scope: Global
  action: Allow
  rules: []
"#,
        Path::new("/"),
    )
    .unwrap();
    let p = &cfg.policies[0];
    assert_eq!(p.scope, PolicyScope::WorkloadSelector);
    assert_eq!(p.action, PolicyAction::Deny);
    assert!(p.dry_run);
    assert_eq!(p.rules.len(), 2, "two rules");
    assert_eq!(p.rules[0].len(), 2, "first rule: two clauses");
    assert_eq!(p.rules[0][0].len(), 2, "first clause: two matches");
    let m = &p.rules[0][0][0];
    let expected = PolicyMatch {
        namespaces: vec![
            StringMatch::Exact("shop".into()),
            StringMatch::Prefix("team-".into()),
        ],
        not_namespaces: vec![StringMatch::Suffix("-prod".into())],
        principals: vec![
            StringMatch::Exact("td/ns/shop/sa/front".into()),
            StringMatch::Presence,
        ],
        not_principals: vec![StringMatch::Presence],
        service_accounts: vec![ServiceAccountMatch {
            namespace: "shop".into(),
            service_account: "front".into(),
        }],
        not_service_accounts: vec![ServiceAccountMatch {
            namespace: "shop".into(),
            service_account: "batch".into(),
        }],
        source_ips: vec![net("10.0.0.0/8"), net("192.168.1.7/32")],
        not_source_ips: vec![net("10.9.0.0/16")],
        destination_ips: vec![net("fd00::/64"), net("fd00::1/128")],
        not_destination_ips: vec![net("172.16.0.1/32")],
        destination_ports: vec![80, 443],
        not_destination_ports: vec![9999],
    };
    assert_eq!(m, &expected);
    assert_eq!(p.rules[0][0][1].destination_ports, vec![8080]);
    assert_eq!(
        p.rules[0][1][0].principals,
        vec![StringMatch::Prefix("td/ns/admin/".into())]
    );
    assert_eq!(p.rules[1][0][0], PolicyMatch::default());
    let g = &cfg.policies[1];
    assert_eq!(
        (g.scope, g.action, g.dry_run),
        (PolicyScope::Global, PolicyAction::Allow, false)
    );
    assert!(g.rules.is_empty());
}
