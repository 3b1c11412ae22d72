//! What istiod really sends, pushed over Delta ADS to two weft nodes in network namespaces with capture, and the
//! same pushes to two of Istio's real ztunnel nodes on the same layout when `ZTUNNEL_BIN` names one: the resources
//! istiod's ambient index builds (istio/istio 86c9f01, `pilot/pkg/serviceregistry/ambient/`: the static STRICT
//! policy of `policies.go`, a port-level `converted_peer_authentication_<name>` of `testdata/`, the implicit waypoint
//! policy, a network gateway's workload of `workloads.go`), each pushed alone so every resource gets its own ACK or
//! NACK, then traffic: HBONE with mTLS passes, a plaintext connection captured to the STRICT workload is denied,
//! and passes once the workload is PERMISSIVE. weft must answer every resource as ztunnel does except the refusals
//! docs/ztunnel.md lists, and reach what ztunnel reaches. Needs root; the ztunnel half is skipped without
//! `ZTUNNEL_BIN` (CI has no ztunnel).
#![allow(clippy::unwrap_used)] // a test panics to fail

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use weft_conformance::eventually;
use weft_conformance::netmesh::connect;
use weft_conformance::ztunnel::{Setup, XdsSource, ztunnel_binary};
use weft_proto::istio::security as sec;
use weft_proto::istio::workload as pb;
use weft_proto::type_url::{ADDRESS, AUTHORIZATION};
use weft_xds::testing::{Conn, Pki, Server, resource, response};

const PATIENCE: Duration = Duration::from_secs(30);
/// istiod's xDS port.
const XDS_PORT: u16 = 15010;
/// The static STRICT policy's key, as istiod lists it on a STRICT workload (`authorization.go`).
const STATIC_STRICT: &str = "istio-system/istio_converted_static_strict";

fn octets(ip: Ipv4Addr) -> Vec<u8> {
    ip.octets().to_vec()
}

fn presence() -> sec::StringMatch {
    sec::StringMatch {
        match_type: Some(sec::string_match::MatchType::Presence(())),
    }
}

fn policy(
    name: &str,
    namespace: &str,
    action: sec::Action,
    matches: Vec<sec::Match>,
) -> sec::Authorization {
    sec::Authorization {
        name: name.into(),
        namespace: namespace.into(),
        scope: sec::Scope::WorkloadSelector as i32,
        action: action as i32,
        groups: vec![sec::Group {
            rules: vec![sec::Rules { matches }],
        }],
        ..Default::default()
    }
}

/// `policies.go` DefaultPolicy: DENY whoever has no principal, in the root namespace.
fn static_strict() -> sec::Authorization {
    policy(
        "istio_converted_static_strict",
        "istio-system",
        sec::Action::Deny,
        vec![sec::Match {
            not_principals: vec![presence()],
            ..Default::default()
        }],
    )
}

/// A pod as istiod's `workloads.go` builds it: uid `<cluster>//Pod/<ns>/<name>`, HBONE (ambient), its node.
fn pod(name: &str, sa: &str, ip: Ipv4Addr, node: &str, policies: &[&str]) -> pb::Workload {
    pb::Workload {
        uid: format!("Kubernetes//Pod/default/{name}"),
        name: name.into(),
        namespace: "default".into(),
        service_account: sa.into(),
        addresses: vec![octets(ip)],
        tunnel_protocol: pb::TunnelProtocol::Hbone as i32,
        node: node.into(),
        cluster_id: "Kubernetes".into(),
        workload_name: name.into(),
        canonical_name: name.into(),
        canonical_revision: "latest".into(),
        workload_type: pb::WorkloadType::Pod as i32,
        authorization_policies: policies.iter().map(|p| p.to_string()).collect(),
        ..Default::default()
    }
}

fn address(w: pb::Workload) -> pb::Address {
    pb::Address {
        r#type: Some(pb::address::Type::Workload(w)),
    }
}

/// One resource to push: its type, name, message, and what weft must answer (`true`: ACK).
struct Push {
    what: &'static str,
    type_url: &'static str,
    name: String,
    body: Body,
    weft_acks: bool,
}

enum Body {
    Address(Box<pb::Address>),
    Authorization(sec::Authorization),
}

fn addr_push(what: &'static str, w: pb::Workload, weft_acks: bool) -> Push {
    Push {
        what,
        type_url: ADDRESS,
        name: w.uid.clone(),
        body: Body::Address(Box::new(address(w))),
        weft_acks,
    }
}

fn authz_push(what: &'static str, a: sec::Authorization, weft_acks: bool) -> Push {
    Push {
        what,
        type_url: AUTHORIZATION,
        name: format!("{}/{}", a.namespace, a.name),
        body: Body::Authorization(a),
        weft_acks,
    }
}

/// The resources, in push order: what istiod emits (ACKed), what no control plane may send (NACKed by both), and
/// the refusals weft keeps where ztunnel drops or truncates a value (docs/ztunnel.md, "Refusals weft keeps").
fn pushes(client: Ipv4Addr, server: Ipv4Addr) -> (Vec<Push>, Vec<&'static str>) {
    let mut port_level = policy(
        "converted_peer_authentication_workload",
        "default",
        sec::Action::Deny,
        vec![sec::Match {
            destination_ports: vec![9090],
            not_principals: vec![presence()],
            ..Default::default()
        }],
    );
    port_level.groups.push(sec::Group {
        rules: vec![sec::Rules {
            matches: vec![sec::Match {
                destination_ports: vec![9091],
                not_principals: vec![presence()],
                ..Default::default()
            }],
        }],
    });
    let waypoint = policy(
        "istio_allow_waypoint_default_waypoint",
        "default",
        sec::Action::Allow,
        vec![sec::Match {
            principals: vec![sec::StringMatch {
                match_type: Some(sec::string_match::MatchType::Exact(
                    "cluster.local/ns/default/sa/waypoint".into(),
                )),
            }],
            ..Default::default()
        }],
    );
    let gateway = pb::Workload {
        uid: "NetworkGateway/network-2/10.10.0.5/15008".into(),
        name: "NetworkGateway/network-2/10.10.0.5/15008".into(),
        namespace: "istio-system".into(),
        service_account: "istio-eastwestgateway".into(),
        network: "network-2".into(),
        addresses: vec![octets(Ipv4Addr::new(10, 10, 0, 5))],
        tunnel_protocol: pb::TunnelProtocol::Hbone as i32,
        ..Default::default()
    };
    let broken = |uid: &str| pb::Workload {
        uid: uid.into(),
        name: "broken".into(),
        namespace: "default".into(),
        ..Default::default()
    };
    let mut short_ip = broken("Kubernetes//Pod/default/short-ip");
    short_ip.addresses = vec![vec![10, 0, 0]];
    let mut legacy = broken("Kubernetes//Pod/default/legacy");
    legacy.tunnel_protocol = pb::TunnelProtocol::LegacyIstioMtls as i32;
    let mut bad_key = broken("Kubernetes//Pod/default/bad-key");
    bad_key
        .services
        .insert("no-namespace".into(), pb::PortList::default());
    let mut bad_scope = static_strict();
    bad_scope.name = "bad-scope".into();
    bad_scope.scope = 3;
    let mut short_cidr = static_strict();
    short_cidr.name = "short-cidr".into();
    short_cidr.groups[0].rules[0].matches[0].source_ips = vec![sec::Address {
        address: vec![10, 0],
        length: 8,
    }];
    let mut empty_match = static_strict();
    empty_match.name = "empty-match".into();
    empty_match.groups[0].rules[0].matches[0].not_principals =
        vec![sec::StringMatch { match_type: None }];
    let mut wide_port = static_strict();
    wide_port.name = "wide-port".into();
    wide_port.groups[0].rules[0].matches[0].destination_ports = vec![65616];
    let pushes = vec![
        authz_push("static STRICT policy", static_strict(), true),
        authz_push("port-level PeerAuthentication", port_level, true),
        authz_push("implicit waypoint policy", waypoint, true),
        addr_push(
            "client pod",
            pod("client", "client", client, "node-a", &[]),
            true,
        ),
        addr_push(
            "STRICT pod listing the static policy",
            pod("echo", "echo", server, "node-b", &[STATIC_STRICT]),
            true,
        ),
        addr_push("network gateway workload", gateway, true),
        addr_push("3-byte address", short_ip, false),
        addr_push("LEGACY_ISTIO_MTLS", legacy, false),
        addr_push("service key without namespace", bad_key, false),
        authz_push("unknown scope", bad_scope, false),
        authz_push("2-byte CIDR", short_cidr, false),
        authz_push("string match with no type", empty_match, false),
        authz_push("port above 65535", wide_port, false),
    ];
    // ztunnel drops an unreadable CIDR or string match and truncates a port (`as u16`); weft refuses the policy,
    // since a dropped value of an ALLOW rule widens it.
    let documented = vec![
        "2-byte CIDR",
        "string match with no type",
        "port above 65535",
    ];
    (pushes, documented)
}

/// A scripted istiod serving from node A's namespace on its link address (both nodes reach it over the link).
async fn istiod(setup: &Setup) -> (Server, XdsSource, Pki) {
    let pki = Pki::new();
    let ip = setup.topo.client_ip;
    let tls = pki.server_tls(&[&ip.to_string()]);
    let addr = SocketAddr::from((ip, XDS_PORT));
    let listener = setup
        .topo
        .ns_a
        .within(move || async move { std::net::TcpListener::bind(addr) })
        .await
        .unwrap()
        .unwrap();
    let server = Server::start_on(tls, listener);
    let source = XdsSource {
        address: format!("https://{addr}"),
        root: pki.root.clone(),
    };
    (server, source, pki)
}

/// Both nodes' streams, by node name (its `NODE_NAME` metadata), once each has asked for both types, with the
/// `ISTIO_VERSION` its node metadata carries.
async fn streams(server: &mut Server) -> BTreeMap<String, (Conn, Option<String>)> {
    let mut out = BTreeMap::new();
    while out.len() < 2 {
        let mut c = server.accept().await;
        let mut meta = None;
        let mut types = Vec::new();
        while types.len() < 2 {
            let r = c.next().await;
            if meta.is_none() {
                meta = r.node.and_then(|n| n.metadata);
            }
            if !types.contains(&r.type_url) {
                types.push(r.type_url);
            }
        }
        let field = |k: &str| weft_proto::struct_string(meta.as_ref(), k).map(str::to_owned);
        let name = field("NODE_NAME").expect("a NODE_NAME in the node metadata");
        out.insert(name, (c, field("ISTIO_VERSION")));
    }
    out
}

/// Push one resource (alone in its response) and read this node's answer to it: `Ok` for an ACK, the NACK's
/// message otherwise.
async fn push_one(c: &mut Conn, p: &Push, nonce: &str) -> Result<(), String> {
    let r = match &p.body {
        Body::Address(a) => resource(p.type_url, &p.name, nonce, a.as_ref()),
        Body::Authorization(a) => resource(p.type_url, &p.name, nonce, a),
    };
    c.send(response(p.type_url, nonce, vec![r], &[]));
    loop {
        let req = c.next().await;
        if req.type_url == p.type_url && req.response_nonce == nonce {
            return match req.error_detail {
                None => Ok(()),
                Some(e) => Err(e.message),
            };
        }
    }
}

/// One exchange with the echo server from inside node A: through capture (HBONE between the nodes), or `bypass`ing
/// node A's capture (plaintext, captured by node B's inbound rules).
async fn reaches(setup: &Setup, bypass: bool) -> bool {
    let dst = SocketAddr::from((setup.topo.server_ip, 8080));
    let h = setup.topo.ns_a.run(move || async move {
        let s = tokio::time::timeout(Duration::from_secs(5), connect(dst, bypass)).await??;
        let back = tokio::time::timeout(
            Duration::from_secs(5),
            weft_devmesh::workload::round_trip(s, b"istio-xds"),
        )
        .await??;
        Ok::<bool, Box<dyn std::error::Error + Send + Sync>>(back == b"istio-xds")
    });
    tokio::task::spawn_blocking(move || h.join())
        .await
        .unwrap()
        .unwrap()
        .unwrap()
        .unwrap_or(false)
}

/// Wait until reaching the echo server (through capture or bypassing it) has the outcome `want`.
async fn until_reach(setup: &Setup, bypass: bool, want: bool, what: &str) {
    eventually(PATIENCE, what, || async move {
        (reaches(setup, bypass).await == want).then_some(())
    })
    .await;
}

#[derive(Debug, PartialEq, Eq)]
struct Outcome {
    /// Per resource: whether node A and node B ACKed it.
    verdicts: Vec<(&'static str, bool, bool)>,
    /// The NACK texts, for the failure message.
    nacks: Vec<String>,
    /// Each node's `ISTIO_VERSION` node metadata.
    versions: Vec<Option<String>>,
}

enum Proxy {
    Weft,
    Ztunnel(std::path::PathBuf),
}

/// The whole scenario on one kind of proxy: push every resource, then check traffic (HBONE passes, captured
/// plaintext to the STRICT pod is denied, and passes once istiod drops the static policy from its list).
async fn scenario(tag: &str, subnet: u8, proxy: Proxy) -> Outcome {
    let mut setup = Setup::new(tag, subnet).await.unwrap();
    let (mut server, source, _pki) = istiod(&setup).await;
    setup.xds = Some(source);
    let echo_dst = SocketAddr::from((setup.topo.server_ip, 8080));
    let echo = setup.topo.ns_b.run(move || async move {
        let (_, t) = weft_devmesh::workload::echo_server(echo_dst).await.unwrap();
        let _ = t.await;
    });
    std::mem::drop(echo);
    // Nodes live until the end of the scenario.
    let mut wefts = Vec::new();
    let mut ztunnels = Vec::new();
    for n in ["a", "b"] {
        match &proxy {
            Proxy::Weft => wefts.push(setup.weft(n, "info").unwrap()),
            Proxy::Ztunnel(bin) => ztunnels.push(setup.ztunnel(n, bin, "info", &[]).unwrap()),
        }
    }
    let streams = streams(&mut server).await;
    let versions: Vec<Option<String>> = streams.values().map(|(_, v)| v.clone()).collect();
    let mut conns: Vec<Conn> = streams.into_values().map(|(c, _)| c).collect();
    let (client, server_ip) = (setup.topo.client_ip, setup.topo.server_ip);
    let (pushes, _) = pushes(client, server_ip);
    let mut outcome = Outcome {
        verdicts: Vec::new(),
        nacks: Vec::new(),
        versions,
    };
    for (i, p) in pushes.iter().enumerate() {
        let nonce = format!("n{i}");
        let mut acks = Vec::new();
        for c in &mut conns {
            let r = push_one(c, p, &nonce).await;
            if let Err(e) = &r {
                outcome.nacks.push(format!("{}: {e}", p.what));
            }
            acks.push(r.is_ok());
        }
        outcome.verdicts.push((p.what, acks[0], acks[1]));
    }
    match &proxy {
        Proxy::Weft => {
            for w in &mut wefts {
                w.wait_ready(PATIENCE).await.unwrap();
            }
        }
        Proxy::Ztunnel(_) => {
            for z in &mut ztunnels {
                z.wait_http_ok(
                    SocketAddr::from((Ipv4Addr::LOCALHOST, 15021)),
                    "/healthz/ready",
                    PATIENCE,
                )
                .await
                .unwrap();
            }
        }
    }
    until_reach(&setup, false, true, "HBONE with mTLS to the STRICT pod").await;
    until_reach(
        &setup,
        true,
        false,
        "captured plaintext to the STRICT pod denied",
    )
    .await;
    // PERMISSIVE now: istiod lists no static policy on the pod.
    let permissive = addr_push(
        "PERMISSIVE pod",
        pod("echo", "echo", server_ip, "node-b", &[]),
        true,
    );
    for c in &mut conns {
        push_one(c, &permissive, "permissive").await.unwrap();
    }
    until_reach(
        &setup,
        true,
        true,
        "captured plaintext to the PERMISSIVE pod",
    )
    .await;
    until_reach(&setup, false, true, "HBONE to the PERMISSIVE pod").await;
    outcome
}

fn weft_expected(client: Ipv4Addr, server: Ipv4Addr) -> Vec<(&'static str, bool, bool)> {
    pushes(client, server)
        .0
        .iter()
        .map(|p| (p.what, p.weft_acks, p.weft_acks))
        .collect()
}

/// weft alone (runs in CI): every resource istiod emits is ACKed by both nodes, every malformed one NACKed, and the
/// STRICT pod is reachable over HBONE, not in plaintext until it is PERMISSIVE.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn istiods_resources_are_acked_and_enforced_by_weft() {
    let out = scenario("ix", 61, Proxy::Weft).await;
    let want = weft_expected(Ipv4Addr::new(10, 248, 61, 1), Ipv4Addr::new(10, 248, 61, 2));
    assert_eq!(out.verdicts, want, "NACKs: {:#?}", out.nacks);
    // Node metadata as ztunnel's image sends it: istiod stops warning, `istioctl proxy-status` shows a version.
    assert_eq!(
        out.versions,
        [Some("1.32.0".to_owned()), Some("1.32.0".to_owned())]
    );
    // Every NACK names the resource's field and why.
    assert!(
        out.nacks
            .iter()
            .any(|n| n.starts_with("3-byte address: ") && n.contains("workload.addresses[0]")),
        "{:#?}",
        out.nacks
    );
}

/// The same pushes and traffic on Istio's real ztunnel: the same ACK or NACK for every resource but the refusals
/// docs/ztunnel.md lists (ztunnel ACKs those), and the same reachability (the scenario asserts it for both).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ztunnel_answers_the_same_pushes_as_weft() {
    let bin = match ztunnel_binary() {
        Ok(b) => b,
        Err(why) => {
            eprintln!("skipped: {why}");
            return;
        }
    };
    let (client, server) = (Ipv4Addr::new(10, 248, 62, 1), Ipv4Addr::new(10, 248, 62, 2));
    let z = scenario("iz", 62, Proxy::Ztunnel(bin)).await;
    let (_, documented) = pushes(client, server);
    let mut differences = Vec::new();
    for ((what, za, zb), (_, wa, wb)) in z.verdicts.iter().zip(weft_expected(client, server)) {
        assert_eq!(za, zb, "{what}: ztunnel's two nodes disagree");
        if (*za, *zb) != (wa, wb) {
            differences.push(*what);
        }
    }
    eprintln!(
        "ztunnel verdicts: {:#?}\nztunnel NACKs: {:#?}",
        z.verdicts, z.nacks
    );
    assert_eq!(differences, documented, "ztunnel NACKs: {:#?}", z.nacks);
}
