//! Waypoint resolution (`MeshState::resolve_from`): service- and workload-attached waypoints, service vs workload
//! addressed traffic, the waypoint's own traffic (sandwich), waypoint instances behind a waypoint service, weighted
//! waypoints, and the failures ztunnel has when the waypoint is unknown or cannot be reached.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;

use weft_state::local::parse;
use weft_state::{MeshState, ResolveError};

const BASE: &str = r#"
workloads:
- {uid: client, namespace: app, serviceAccount: client, workloadIps: [10.0.0.1], protocol: HBONE, node: a}
- uid: server
  namespace: app
  serviceAccount: server
  workloadIps: [10.0.0.2]
  protocol: HBONE
  node: b
  services: {app/server.app.svc: {80: 8080}}
  WORKLOAD_WAYPOINT
- uid: wp-1
  namespace: app
  serviceAccount: waypoint
  workloadIps: [10.0.0.10]
  protocol: HBONE
  node: c
  services: {app/waypoint.app.svc: {15008: 15008}}
- {uid: wp-2, namespace: app, serviceAccount: waypoint2, workloadIps: [10.0.0.11], protocol: HBONE, node: c}
- {uid: wp-noip, namespace: app, serviceAccount: waypoint, hostname: noip.app.svc, protocol: HBONE, node: c}
- {uid: wp-far, namespace: app, serviceAccount: waypoint, workloadIps: [10.0.0.12], network: other, node: c}
services:
- name: server
  namespace: app
  hostname: server.app.svc
  vips: [/10.96.0.2]
  ports: {80: 8080}
  SERVICE_WAYPOINT
- name: waypoint
  namespace: app
  hostname: waypoint.app.svc
  vips: [/10.96.0.10]
  ports: {15008: 15008}
  subjectAltNames: [spiffe://cluster.local/ns/app/sa/waypoint-extra]
"#;

fn mesh(workload_wp: &str, service_wp: &str) -> MeshState {
    let y = BASE
        .replace("WORKLOAD_WAYPOINT", workload_wp)
        .replace("SERVICE_WAYPOINT", service_wp);
    parse(&y, Path::new("/")).unwrap().into_state(1)
}

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

fn from(s: &MeshState, uid: &str, dst: &str) -> Result<weft_state::Resolved, ResolveError> {
    let src = s.workloads.get(uid).unwrap().clone();
    s.resolve_from(Some(&src), addr(dst))
}

const BY_HOST: &str = "waypoint: {destination: app/waypoint.app.svc}";

#[test]
fn service_attached_waypoint_takes_service_addressed_traffic_only() {
    let s = mesh("", BY_HOST);
    let r = from(&s, "client", "10.96.0.2:80").unwrap();
    let hop = r.waypoint.as_ref().unwrap();
    assert_eq!(hop.workload.uid, "wp-1");
    assert_eq!(hop.addr, addr("10.0.0.10:15008"));
    assert_eq!(
        r.addr,
        addr("10.96.0.2:80"),
        "the authority is the VIP as dialled"
    );
    assert!(r.workload.is_none(), "the waypoint picks the endpoint");
    assert_eq!(r.service.as_ref().unwrap().hostname, "server.app.svc");
    assert!(r.is_hbone());
    assert_eq!(
        hop.identities(),
        [
            "spiffe://cluster.local/ns/app/sa/waypoint",
            "spiffe://cluster.local/ns/app/sa/waypoint-extra"
        ]
    );
    // Addressed to the workload: the service's waypoint does not apply.
    let direct = from(&s, "client", "10.0.0.2:8080").unwrap();
    assert!(direct.waypoint.is_none());
    assert_eq!(direct.workload.unwrap().uid, "server");
}

#[test]
fn workload_attached_waypoint_takes_workload_addressed_traffic_only() {
    let s = mesh(
        "waypoint: {destination: /10.0.0.10, hboneMtlsPort: 15008}",
        "",
    );
    let r = from(&s, "client", "10.0.0.2:8080").unwrap();
    let hop = r.waypoint.as_ref().unwrap();
    assert_eq!(hop.workload.uid, "wp-1");
    assert!(hop.service.is_none(), "named by a workload's address");
    assert_eq!(hop.addr, addr("10.0.0.10:15008"));
    assert_eq!(r.addr, addr("10.0.0.2:8080"));
    assert_eq!(r.workload.unwrap().uid, "server");
    // Addressed to the service (which has no waypoint): straight to the endpoint.
    let svc = from(&s, "client", "10.96.0.2:80").unwrap();
    assert!(svc.waypoint.is_none());
    assert_eq!(svc.addr, addr("10.0.0.2:8080"));
}

#[test]
fn a_waypoint_named_by_its_service_vip_picks_an_instance() {
    let s = mesh("waypoint: {destination: /10.96.0.10}", "");
    let hop = from(&s, "client", "10.0.0.2:8080")
        .unwrap()
        .waypoint
        .unwrap();
    assert_eq!(hop.workload.uid, "wp-1");
    assert_eq!(hop.service.unwrap().hostname, "waypoint.app.svc");
}

#[test]
fn the_waypoints_own_traffic_is_not_sent_back_to_it() {
    let s = mesh(BY_HOST, "");
    assert!(
        from(&s, "wp-1", "10.0.0.2:8080")
            .unwrap()
            .waypoint
            .is_none(),
        "sandwich: the waypoint instance reaches its destination directly"
    );
    assert!(
        from(&s, "client", "10.0.0.2:8080")
            .unwrap()
            .waypoint
            .is_some()
    );
    // Without a known client nothing is from the waypoint.
    assert!(s.resolve(addr("10.0.0.2:8080")).unwrap().waypoint.is_some());
}

#[test]
fn waypoint_failures_refuse_instead_of_bypassing() {
    let cases: &[(&str, &str, ResolveError)] = &[
        (
            "waypoint: {destination: /10.0.0.99}",
            "an address nothing has",
            ResolveError::UnknownWaypoint("/10.0.0.99".into()),
        ),
        (
            "waypoint: {destination: app/nothing.app.svc}",
            "a hostname nothing has",
            ResolveError::UnknownWaypoint("app/nothing.app.svc".into()),
        ),
        (
            "waypoint: {destination: app/noip.app.svc}",
            "a waypoint workload without an address",
            ResolveError::WaypointWithoutAddress("app/noip.app.svc".into()),
        ),
        (
            "waypoint: {destination: app/waypoint.app.svc, hboneMtlsPort: 15009}",
            "a waypoint service without the HBONE port asked for",
            ResolveError::UnknownWaypoint("app/waypoint.app.svc".into()),
        ),
        (
            "waypoint: {destination: /10.0.0.12}",
            "a waypoint on another network",
            ResolveError::WaypointOnOtherNetwork {
                waypoint: "/10.0.0.12".into(),
                network: "other".into(),
            },
        ),
    ];
    for (wp, what, want) in cases {
        let s = mesh(wp, "");
        assert_eq!(
            from(&s, "client", "10.0.0.2:8080").unwrap_err(),
            *want,
            "{what}"
        );
    }
    // The only instance of the waypoint service unhealthy: no instance, the connection fails.
    let y = BASE
        .replace("WORKLOAD_WAYPOINT", "")
        .replace("SERVICE_WAYPOINT", BY_HOST)
        .replace(
            "  serviceAccount: waypoint\n  workloadIps: [10.0.0.10]",
            "  serviceAccount: waypoint\n  status: Unhealthy\n  workloadIps: [10.0.0.10]",
        );
    let s = parse(&y, Path::new("/")).unwrap().into_state(1);
    assert_eq!(
        from(&s, "client", "10.96.0.2:80").unwrap_err(),
        ResolveError::UnknownWaypoint("app/waypoint.app.svc".into())
    );
}

#[test]
fn weighted_waypoints_share_connections_by_weight() {
    let s = mesh(
        "",
        "weightedWaypoints: [{destination: {destination: /10.0.0.10}, weight: 1}, {destination: {destination: /10.0.0.11}, weight: 3}]",
    );
    let mut counts = BTreeMap::new();
    for _ in 0..40 {
        let hop = from(&s, "client", "10.96.0.2:80")
            .unwrap()
            .waypoint
            .unwrap();
        *counts.entry(hop.workload.uid.clone()).or_insert(0) += 1;
    }
    assert_eq!(
        counts,
        BTreeMap::from([("wp-1".to_owned(), 10), ("wp-2".to_owned(), 30)])
    );
}

#[test]
fn inbound_knows_when_a_local_workload_is_the_targets_waypoint() {
    let s = mesh(BY_HOST, BY_HOST);
    let wp = s.workloads.get("wp-1").unwrap();
    let other = s.workloads.get("wp-2").unwrap();
    for target in ["10.96.0.2", "10.0.0.2"] {
        assert!(s.is_waypoint_for(target.parse().unwrap(), wp), "{target}");
        assert!(
            !s.is_waypoint_for(target.parse().unwrap(), other),
            "{target}"
        );
    }
    let none = mesh("", "");
    assert!(!none.is_waypoint_for("10.96.0.2".parse().unwrap(), wp));
    assert!(!none.is_waypoint_for("10.0.0.99".parse().unwrap(), wp));
}
