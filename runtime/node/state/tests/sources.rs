//! Several sources feed one store: each keeps its own contribution, changed resource by resource; the snapshot is
//! their union with precedence on conflicts; a removal names what the source gave; a no-op publishes nothing.

#![allow(clippy::unwrap_used)]

use std::path::Path;

use weft_proto::istio::workload as pb;
use weft_state::xds::address_change;
use weft_state::{Change, Collection, LOCAL_FILE, StateStore, XDS_PRECEDENCE};

fn wl(uid: &str, ip: [u8; 4], node: &str) -> pb::Workload {
    pb::Workload {
        uid: uid.into(),
        name: "w".into(),
        namespace: "default".into(),
        addresses: vec![ip.to_vec()],
        node: node.into(),
        ..Default::default()
    }
}

fn upsert_wl(name: &str, w: pb::Workload) -> Change {
    address_change(
        name,
        pb::Address {
            r#type: Some(pb::address::Type::Workload(w)),
        },
    )
    .unwrap()
}

fn upsert_svc(ns: &str, host: &str, vip: [u8; 4]) -> Change {
    address_change(
        &format!("{ns}/{host}"),
        pb::Address {
            r#type: Some(pb::address::Type::Service(pb::Service {
                name: "s".into(),
                namespace: ns.into(),
                hostname: host.into(),
                addresses: vec![pb::NetworkAddress {
                    network: String::new(),
                    address: vip.to_vec(),
                    length: None,
                }],
                ..Default::default()
            })),
        },
    )
    .unwrap()
}

fn remove(name: &str) -> Change {
    Change::Remove {
        collection: Collection::Address,
        name: name.into(),
    }
}

const FILE: &str = r#"
workloads:
- uid: shared
  namespace: default
  node: from-file
  workloadIps: [10.0.0.9]
- uid: file-only
  namespace: default
  workloadIps: [10.0.0.8]
"#;

#[test]
fn sources_add_up_and_the_higher_precedence_wins() {
    let store = StateStore::new();
    store.replace(weft_state::local::parse(FILE, Path::new("/")).unwrap());
    store.register_source("xds:mesh", XDS_PRECEDENCE);
    let a = store.apply_changes(
        "xds:mesh",
        vec![
            upsert_wl("shared", wl("shared", [10, 0, 0, 1], "from-xds")),
            upsert_wl("x1", wl("x1", [10, 0, 0, 2], "n")),
            upsert_svc("default", "echo.default.svc", [10, 96, 0, 1]),
        ],
    );
    assert!(a.changed);
    assert_eq!(a.version, 2);
    let s = store.current();
    assert_eq!(s.workloads.len(), 3);
    assert_eq!(
        s.workloads["shared"].node, "from-xds",
        "xDS outranks the file"
    );
    assert_eq!(store.conflicts(), 1);
    assert!(s.service_by_vip([10, 96, 0, 1].into()).is_some());
    let counts = store.source_counts();
    assert_eq!(counts[LOCAL_FILE].workloads, 2);
    assert_eq!(
        (counts["xds:mesh"].workloads, counts["xds:mesh"].services),
        (2, 1)
    );

    // A file edit replaces only the file's part.
    store.replace(weft_state::local::parse("workloads: []\n", Path::new("/")).unwrap());
    let s = store.current();
    assert_eq!(s.workloads.len(), 2);
    assert_eq!(s.workloads["shared"].node, "from-xds");
    assert_eq!(store.conflicts(), 0);
}

#[test]
fn a_removal_names_a_resource_or_as_ztunnel_reads_it_a_uid_or_service_key() {
    let store = StateStore::new();
    store.apply_changes(
        "xds:mesh",
        vec![
            upsert_wl("name-1", wl("uid-1", [10, 0, 0, 1], "n")),
            upsert_wl("uid-2", wl("uid-2", [10, 0, 0, 2], "n")),
            upsert_svc("default", "a.default.svc", [10, 96, 0, 1]),
            upsert_svc("default", "b.default.svc", [10, 96, 0, 2]),
        ],
    );
    assert_eq!(store.current().workloads.len(), 2);
    // By resource name, by uid (the name differs), by service key; an unknown name changes nothing.
    assert!(
        store
            .apply_changes("xds:mesh", vec![remove("uid-2")])
            .changed
    );
    assert!(
        store
            .apply_changes("xds:mesh", vec![remove("uid-1")])
            .changed
    );
    assert!(
        store
            .apply_changes("xds:mesh", vec![remove("default/a.default.svc")])
            .changed
    );
    let before = store.version();
    let a = store.apply_changes("xds:mesh", vec![remove("nothing"), remove("default/zzz")]);
    assert!(!a.changed);
    assert_eq!(a.version, before);
    let s = store.current();
    assert!(s.workloads.is_empty());
    assert_eq!(s.services.len(), 1);
    assert!(s.service_by_vip([10, 96, 0, 2].into()).is_some());
    assert!(s.workload_by_ip([10, 0, 0, 1].into()).is_none());
}

#[test]
fn an_identical_resync_publishes_nothing() {
    let store = StateStore::new();
    let batch = || {
        vec![
            upsert_wl("u1", wl("u1", [10, 0, 0, 1], "n")),
            upsert_svc("default", "a.default.svc", [10, 96, 0, 1]),
        ]
    };
    assert!(store.apply_changes("xds:mesh", batch()).changed);
    let mut rx = store.subscribe();
    rx.borrow_and_update();
    let a = store.apply_changes("xds:mesh", batch());
    assert!(!a.changed && a.version == 1);
    assert!(!rx.has_changed().unwrap(), "subscribers are not woken");
    // An upsert that changes the resource is a new version; the same name as a service replaces the workload.
    let a = store.apply_changes(
        "xds:mesh",
        vec![upsert_wl("u1", wl("u1", [10, 0, 0, 3], "n"))],
    );
    assert_eq!(a.version, 2);
    assert!(
        store
            .current()
            .workload_by_ip([10, 0, 0, 3].into())
            .is_some()
    );
    assert!(
        store
            .current()
            .workload_by_ip([10, 0, 0, 1].into())
            .is_none()
    );
}

#[test]
fn policies_and_plugins_have_their_own_names() {
    let store = StateStore::new();
    let pol = weft_state::xds::authorization_change(
        "shop/p",
        weft_proto::istio::security::Authorization {
            name: "p".into(),
            namespace: "shop".into(),
            ..Default::default()
        },
    )
    .unwrap();
    store.apply_changes(
        "xds:mesh",
        vec![pol, upsert_wl("shop/p", wl("w", [10, 0, 0, 1], "n"))],
    );
    let s = store.current();
    assert_eq!((s.policies.len(), s.workloads.len()), (1, 1));
    store.apply_changes(
        "xds:mesh",
        vec![Change::Remove {
            collection: Collection::Authorization,
            name: "shop/p".into(),
        }],
    );
    let s = store.current();
    assert_eq!(
        (s.policies.len(), s.workloads.len()),
        (0, 1),
        "the workload of the same name stays"
    );
}
