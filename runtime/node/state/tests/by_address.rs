//! What an address is, as ztunnel decides it: HOST_NETWORK workloads own no IP, a Pod then an HBONE workload wins
//! an IP several workloads claim, a NAMESPACE service is not reached at its VIP from other namespaces, services
//! sharing a VIP are told apart by the client's namespace, and CIDR VIPs route by longest prefix.

#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::path::Path;

use weft_proto::istio::workload as pb;
use weft_state::local::parse;
use weft_state::xds::address_change;
use weft_state::{Change, MeshState, Resolved, StateStore, Workload};

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

fn local(yaml: &str) -> MeshState {
    parse(yaml, Path::new("/")).unwrap().into_state(1)
}

/// A snapshot of the given xDS workloads and services, as istiod would send them.
fn xds(workloads: Vec<pb::Workload>, services: Vec<pb::Service>) -> std::sync::Arc<MeshState> {
    let mut changes: Vec<Change> = Vec::new();
    for w in workloads {
        let uid = w.uid.clone();
        let a = pb::Address {
            r#type: Some(pb::address::Type::Workload(w)),
        };
        changes.push(address_change(&uid, a).unwrap());
    }
    for s in services {
        let key = format!("{}/{}", s.namespace, s.hostname);
        let a = pb::Address {
            r#type: Some(pb::address::Type::Service(s)),
        };
        changes.push(address_change(&key, a).unwrap());
    }
    let store = StateStore::new();
    assert!(store.apply_changes("xds", changes).changed);
    store.current()
}

fn pb_workload(uid: &str, ip: [u8; 4], tunnel: pb::TunnelProtocol) -> pb::Workload {
    pb::Workload {
        uid: uid.into(),
        name: uid.rsplit('/').next().unwrap().into(),
        namespace: "ns1".into(),
        addresses: vec![ip.to_vec()],
        tunnel_protocol: tunnel as i32,
        node: "node-a".into(),
        ..Default::default()
    }
}

fn host_network(mut w: pb::Workload) -> pb::Workload {
    w.network_mode = pb::NetworkMode::HostNetwork as i32;
    w
}

fn uid_of(r: &Resolved) -> Option<&str> {
    r.workload.as_deref().map(|w| w.uid.as_str())
}

fn service_of(r: &Resolved) -> Option<String> {
    r.service.as_ref().map(|s| s.key())
}

// ---- HOST_NETWORK workloads --------------------------------------------------------------------------------------

const NODE_IP: [u8; 4] = [10, 0, 0, 1];

/// A hostNetwork pod on the node's IP, with a waypoint and backing a service; a second hostNetwork pod on the same
/// IP.
fn host_network_mesh() -> std::sync::Arc<MeshState> {
    let mut exporter = host_network(pb_workload(
        "Kubernetes//Pod/ns1/node-exporter",
        NODE_IP,
        pb::TunnelProtocol::None,
    ));
    exporter.waypoint = Some(pb::GatewayAddress {
        destination: Some(pb::gateway_address::Destination::Address(
            pb::NetworkAddress {
                network: String::new(),
                address: vec![10, 0, 9, 9],
                length: None,
            },
        )),
        hbone_mtls_port: 15008,
    });
    exporter.services.insert(
        "ns1/exporter.ns1.svc.cluster.local".into(),
        pb::PortList {
            ports: vec![pb::Port {
                service_port: 9100,
                target_port: 9100,
                app_protocol: 0,
            }],
        },
    );
    let other = host_network(pb_workload(
        "Kubernetes//Pod/ns1/kube-proxy",
        NODE_IP,
        pb::TunnelProtocol::None,
    ));
    let service = pb::Service {
        name: "exporter".into(),
        namespace: "ns1".into(),
        hostname: "exporter.ns1.svc.cluster.local".into(),
        addresses: vec![pb::NetworkAddress {
            network: String::new(),
            address: vec![10, 96, 0, 5],
            length: None,
        }],
        ports: vec![pb::Port {
            service_port: 9100,
            target_port: 9100,
            app_protocol: 0,
        }],
        ..Default::default()
    };
    xds(vec![exporter, other], vec![service])
}

#[test]
fn a_host_network_workload_does_not_take_the_nodes_ip() {
    let s = host_network_mesh();
    assert!(s.workload_by_ip(NODE_IP.into()).is_none());
    // Traffic to the node's IP is no workload's: passed through, without the pod's waypoint (which is unknown
    // here, so taking the pod for the destination would even fail the connection).
    let r = s.resolve(addr("10.0.0.1:9100")).unwrap();
    assert_eq!(uid_of(&r), None);
    assert!(r.waypoint.is_none() && r.service.is_none());
    assert_eq!(r.addr, addr("10.0.0.1:9100"));
}

#[test]
fn a_host_network_workload_is_still_a_service_endpoint() {
    let s = host_network_mesh();
    let r = s.resolve(addr("10.96.0.5:9100")).unwrap();
    assert_eq!(uid_of(&r), Some("Kubernetes//Pod/ns1/node-exporter"));
    assert_eq!(r.addr, addr("10.0.0.1:9100"));
}

#[test]
fn a_workload_on_the_nodes_ip_keeps_it_beside_host_network_pods() {
    let s = xds(
        vec![
            host_network(pb_workload(
                "Kubernetes//Pod/ns1/a-host-pod",
                NODE_IP,
                pb::TunnelProtocol::Hbone,
            )),
            pb_workload(
                "Kubernetes/networking.istio.io/WorkloadEntry/ns1/vm",
                NODE_IP,
                pb::TunnelProtocol::None,
            ),
            host_network(pb_workload(
                "Kubernetes//Pod/ns1/z-host-pod",
                NODE_IP,
                pb::TunnelProtocol::Hbone,
            )),
        ],
        vec![],
    );
    assert_eq!(
        s.workload_by_ip(NODE_IP.into()).unwrap().uid,
        "Kubernetes/networking.istio.io/WorkloadEntry/ns1/vm"
    );
}

#[test]
fn a_host_network_workload_is_found_as_a_local_pod_by_name() {
    let s = host_network_mesh();
    let pod = weft_state::LocalPod {
        uid: "k8s-uid".into(),
        name: "node-exporter".into(),
        namespace: "ns1".into(),
        service_account: "default".into(),
    };
    let found = s.local_pod("node-a", &pod, Some(NODE_IP.into())).unwrap();
    assert_eq!(found.uid, "Kubernetes//Pod/ns1/node-exporter");
}

#[test]
fn host_network_workloads_may_share_an_ip_in_the_local_file() {
    let s = local(
        r#"
workloads:
- {uid: host-a, namespace: ns1, workloadIps: [10.0.0.1], networkMode: HostNetwork}
- {uid: host-b, namespace: ns1, workloadIps: [10.0.0.1], networkMode: HostNetwork}
- {uid: pod, namespace: ns1, workloadIps: [10.0.0.1]}
"#,
    );
    assert_eq!(s.workloads.len(), 3);
    assert_eq!(s.workload_by_ip(NODE_IP.into()).unwrap().uid, "pod");
    // A host-network workload still may not list one address twice.
    let e = parse(
        "workloads:\n- {uid: h, namespace: ns1, workloadIps: [10.0.0.1, 10.0.0.1], networkMode: HostNetwork}\n",
        Path::new("/"),
    )
    .unwrap_err();
    assert!(e.to_string().contains("10.0.0.1 is listed twice"), "{e}");
}

// ---- two workloads on one IP -------------------------------------------------------------------------------------

#[test]
fn a_pod_wins_an_ip_over_other_workloads() {
    // By uid the WorkloadEntry sorts after the pod ("/" < "n"); the pod still owns the IP, even though the entry
    // is in the mesh and the pod is not.
    let s = xds(
        vec![
            pb_workload(
                "Kubernetes//Pod/ns1/pod",
                [10, 0, 1, 1],
                pb::TunnelProtocol::None,
            ),
            pb_workload(
                "Kubernetes/networking.istio.io/WorkloadEntry/ns1/entry",
                [10, 0, 1, 1],
                pb::TunnelProtocol::Hbone,
            ),
        ],
        vec![],
    );
    assert_eq!(
        s.workload_by_ip([10, 0, 1, 1].into()).unwrap().uid,
        "Kubernetes//Pod/ns1/pod"
    );
    assert_eq!(
        uid_of(&s.resolve(addr("10.0.1.1:80")).unwrap()),
        Some("Kubernetes//Pod/ns1/pod")
    );
}

#[test]
fn then_an_hbone_workload_wins_an_ip_then_the_later_uid() {
    let s = xds(
        vec![
            pb_workload("ns1/entry-a", [10, 0, 1, 2], pb::TunnelProtocol::Hbone),
            pb_workload("ns1/entry-b", [10, 0, 1, 2], pb::TunnelProtocol::None),
            pb_workload("ns1/plain-a", [10, 0, 1, 3], pb::TunnelProtocol::None),
            pb_workload("ns1/plain-b", [10, 0, 1, 3], pb::TunnelProtocol::None),
        ],
        vec![],
    );
    assert_eq!(
        s.workload_by_ip([10, 0, 1, 2].into()).unwrap().uid,
        "ns1/entry-a"
    );
    assert_eq!(
        s.workload_by_ip([10, 0, 1, 3].into()).unwrap().uid,
        "ns1/plain-b"
    );
}

// ---- services by VIP, as a client sees them ----------------------------------------------------------------------

const SERVICES: &str = r#"
workloads:
- {uid: client-ns1, name: client-ns1, namespace: ns1, workloadIps: [10.0.0.1], node: node-a}
- {uid: client-ns2, name: client-ns2, namespace: ns2, workloadIps: [10.0.0.2], node: node-a}
- {uid: client-ns3, name: client-ns3, namespace: ns3, workloadIps: [10.0.0.3], node: node-a}
- uid: secret-1
  namespace: ns2
  workloadIps: [10.0.2.1]
  services: {ns2/secret.ns2.svc.cluster.local: {80: 8080}}
- uid: shared-ns1
  namespace: ns1
  workloadIps: [10.0.1.40]
  services: {ns1/shared.example: {80: 80}}
- uid: shared-ns2
  namespace: ns2
  workloadIps: [10.0.2.40]
  services: {ns2/shared.example: {80: 80}}
- uid: shared-ns3
  namespace: ns3
  workloadIps: [10.0.3.40]
  services: {ns3/shared.example: {80: 80}}
- uid: range-1
  namespace: ns1
  workloadIps: [10.0.1.50]
  services: {ns1/range.example: {80: 8080}}
- uid: narrow-1
  namespace: ns1
  workloadIps: [10.0.1.51]
  services: {ns1/narrow.example: {80: 8080}}
- uid: exact-1
  namespace: ns1
  workloadIps: [10.0.1.52]
  services: {ns1/exact.example: {80: 8080}}
- uid: wide-ns2-1
  namespace: ns2
  workloadIps: [10.0.2.53]
  services: {ns2/wide.example: {80: 8080}}
- uid: hidden-range-1
  namespace: ns3
  workloadIps: [10.0.3.54]
  services: {ns3/hidden-range.example: {80: 8080}}
- uid: v6-1
  namespace: ns1
  workloadIps: ["fd00::55"]
  services: {ns1/v6.example: {80: 8080}}
services:
- {name: secret, namespace: ns2, hostname: secret.ns2.svc.cluster.local, vips: [/10.96.0.21], ports: {80: 8080},
   visibility: Namespace}
- {name: shared, namespace: ns1, hostname: shared.example, vips: [/10.96.0.40], ports: {80: 80}}
- {name: shared, namespace: ns2, hostname: shared.example, vips: [/10.96.0.40], ports: {80: 80}, canonical: true}
- {name: shared, namespace: ns3, hostname: shared.example, vips: [/10.96.0.40], ports: {80: 80}}
- {name: range, namespace: ns1, hostname: range.example, ports: {80: 8080},
   cidrVips: [{cidr: 10.200.0.0/16}]}
- {name: narrow, namespace: ns1, hostname: narrow.example, ports: {80: 8080},
   cidrVips: [{cidr: 10.200.5.0/24}]}
- {name: exact, namespace: ns1, hostname: exact.example, vips: [/10.200.5.5], ports: {80: 8080}}
- {name: wide, namespace: ns2, hostname: wide.example, ports: {80: 8080}, cidrVips: [{cidr: 10.192.0.0/10}]}
- {name: hidden-range, namespace: ns3, hostname: hidden-range.example, ports: {80: 8080},
   cidrVips: [{cidr: 10.96.0.0/24}], visibility: Namespace}
- {name: v6, namespace: ns1, hostname: v6.example, ports: {80: 8080}, cidrVips: [{cidr: "fd00:200::/64"}]}
"#;

fn client<'a>(s: &'a MeshState, uid: &str) -> &'a Workload {
    s.workloads.get(uid).unwrap()
}

#[test]
fn a_namespace_service_is_not_reached_at_its_vip_from_another_namespace() {
    let s = local(SERVICES);
    let vip = addr("10.96.0.21:80");
    // Its own namespace: the service, and its endpoint.
    let r = s.resolve_from(Some(client(&s, "client-ns2")), vip).unwrap();
    assert_eq!(
        service_of(&r).as_deref(),
        Some("ns2/secret.ns2.svc.cluster.local")
    );
    assert_eq!(r.addr, addr("10.0.2.1:8080"));
    // Another namespace: the VIP is not the service for it, so the connection goes to the VIP as dialled (as it
    // does in ztunnel: neither a service nor a workload there).
    let r = s.resolve_from(Some(client(&s, "client-ns1")), vip).unwrap();
    assert_eq!(service_of(&r), None);
    assert_eq!(uid_of(&r), None);
    assert_eq!(r.addr, vip);
    // A client that is no known workload is in no namespace.
    let r = s.resolve_from(None, vip).unwrap();
    assert_eq!(service_of(&r), None);
    assert_eq!(r.addr, vip);
    // Looked up by no client (inspection, the inbound side): there.
    assert_eq!(
        s.service_by_vip(vip.ip()).unwrap().key(),
        "ns2/secret.ns2.svc.cluster.local"
    );
}

#[test]
fn a_vip_shared_by_namespaces_is_the_clients_own_then_the_canonical_one() {
    let s = local(SERVICES);
    let vip = addr("10.96.0.40:80");
    for (client_uid, want) in [
        ("client-ns1", "ns1/shared.example"),
        ("client-ns2", "ns2/shared.example"),
        ("client-ns3", "ns3/shared.example"),
    ] {
        let r = s.resolve_from(Some(client(&s, client_uid)), vip).unwrap();
        assert_eq!(service_of(&r).as_deref(), Some(want), "{client_uid}");
    }
    // A client of none of those namespaces: the canonical one.
    let r = s.resolve_from(None, vip).unwrap();
    assert_eq!(service_of(&r).as_deref(), Some("ns2/shared.example"));
}

#[test]
fn a_hidden_exact_vip_falls_through_to_a_cidr_vip() {
    // 10.96.0.21 is the exact VIP of ns2's NAMESPACE service, inside ns3's NAMESPACE range 10.96.0.0/24.
    let s = local(SERVICES);
    let vip = addr("10.96.0.21:80");
    let r = s.resolve_from(Some(client(&s, "client-ns3")), vip).unwrap();
    assert_eq!(service_of(&r).as_deref(), Some("ns3/hidden-range.example"));
    assert_eq!(r.addr, addr("10.0.3.54:8080"));
    let r = s.resolve_from(Some(client(&s, "client-ns2")), vip).unwrap();
    assert_eq!(
        service_of(&r).as_deref(),
        Some("ns2/secret.ns2.svc.cluster.local")
    );
}

// ---- CIDR VIPs ---------------------------------------------------------------------------------------------------

#[test]
fn a_cidr_vip_routes_by_longest_prefix() {
    let s = local(SERVICES);
    let ns1 = Some(client(&s, "client-ns1"));
    let r = s.resolve_from(ns1, addr("10.200.1.1:80")).unwrap();
    assert_eq!(service_of(&r).as_deref(), Some("ns1/range.example"));
    assert_eq!(r.addr, addr("10.0.1.50:8080"));
    let r = s.resolve_from(ns1, addr("10.200.5.7:80")).unwrap();
    assert_eq!(service_of(&r).as_deref(), Some("ns1/narrow.example"));
    assert_eq!(r.addr, addr("10.0.1.51:8080"));
    // An exact VIP inside the ranges wins over them.
    let r = s.resolve_from(ns1, addr("10.200.5.5:80")).unwrap();
    assert_eq!(service_of(&r).as_deref(), Some("ns1/exact.example"));
    // Only the other namespace's wider range holds it.
    let r = s.resolve_from(ns1, addr("10.210.0.1:80")).unwrap();
    assert_eq!(service_of(&r).as_deref(), Some("ns2/wide.example"));
    // IPv6 ranges too.
    let r = s.resolve_from(ns1, addr("[fd00:200::9]:80")).unwrap();
    assert_eq!(service_of(&r).as_deref(), Some("ns1/v6.example"));
    // Outside every range: passed through.
    let r = s.resolve_from(ns1, addr("11.0.0.1:80")).unwrap();
    assert_eq!(service_of(&r), None);
    assert_eq!(r.addr, addr("11.0.0.1:80"));
    // A range's undeclared port is refused as for a VIP.
    assert!(s.resolve_from(ns1, addr("10.200.1.1:81")).is_err());
    // The inspection lookup finds ranges too.
    assert_eq!(
        s.service_by_vip("10.200.5.7".parse().unwrap())
            .unwrap()
            .key(),
        "ns1/narrow.example"
    );
}

#[test]
fn a_cidr_vip_of_the_clients_namespace_wins_over_a_longer_prefix() {
    let s = local(SERVICES);
    let dst = addr("10.200.5.7:80");
    let r = s.resolve_from(Some(client(&s, "client-ns2")), dst).unwrap();
    assert_eq!(service_of(&r).as_deref(), Some("ns2/wide.example"));
    let r = s.resolve_from(Some(client(&s, "client-ns3")), dst).unwrap();
    assert_eq!(service_of(&r).as_deref(), Some("ns1/narrow.example"));
}

#[test]
fn a_namespace_cidr_vip_is_not_reached_from_another_namespace() {
    let s = local(SERVICES);
    let dst = addr("10.96.0.9:80");
    let r = s.resolve_from(Some(client(&s, "client-ns3")), dst).unwrap();
    assert_eq!(service_of(&r).as_deref(), Some("ns3/hidden-range.example"));
    let r = s.resolve_from(Some(client(&s, "client-ns1")), dst).unwrap();
    assert_eq!(service_of(&r), None);
    assert_eq!(r.addr, dst);
}
