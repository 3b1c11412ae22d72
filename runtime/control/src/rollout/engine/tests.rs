//! Tests of the rollout steps, on a fleet built by hand and a clock of their own.

#![allow(clippy::unwrap_used)] // test code: a panic fails the test

use std::path::Path;

use super::*;
use crate::ads::counts::CountsRecord;
use crate::ads::registry::Nacked;
use crate::ads::resources::{Desired, NodeKey, Snapshot};
use crate::ads::shadow::{Decisions, Sample, ShadowRecord};
use crate::rollout::fleet::NodeView;

const T0: u64 = 1_800_000_000_000;

fn t(secs: u64) -> SystemTime {
    at_ms(T0 + secs * 1000)
}

fn sha(c: char) -> String {
    std::iter::repeat_n(c, 64).collect()
}

/// Plugin `p` at code `v` (sha256 all `v`), with `rollout` as its spec's (JSON).
fn entry(v: char, rollout: serde_json::Value) -> PluginEntry {
    let mut spec =
        serde_json::json!({"url": format!("oci://registry.example/p:{v}"), "sha256": sha(v)});
    if !rollout.is_null() {
        spec["rollout"] = rollout;
    }
    crate::ads::plugin_file::parse_spec("p", spec, "test")
        .unwrap()
        .into_entry("", Path::new("."))
        .unwrap()
}

fn staged(v: char) -> PluginEntry {
    entry(
        v,
        serde_json::json!({"stages": [
            {"nodes": 1, "bake": "10s"},
            {"percent": 50, "bake": "10s"},
            {"percent": 100, "bake": "10s"},
        ]}),
    )
}

/// `n` nodes in zones a and b, each ACKing what `acked` says of `p`.
fn fleet(n: usize) -> Fleet {
    let mut f = Fleet::default();
    for i in 0..n {
        f.nodes.insert(
            format!("node-{i}"),
            NodeView {
                zone: if i % 2 == 0 { "a" } else { "b" }.into(),
                ..NodeView::default()
            },
        );
    }
    f
}

/// Every node ACKs what the snapshot of `e` says it gets.
fn ack_all(f: &mut Fleet, e: &PluginEntry) {
    let snap = Snapshot {
        plugins: [("p".to_owned(), e.clone())].into_iter().collect(),
        ..Snapshot::default()
    };
    for (name, v) in &mut f.nodes {
        let d = snap.desired(
            weft_proto::type_url::EXTENSION_CONFIG,
            &NodeKey {
                id: String::new(),
                name: name.clone(),
            },
        );
        match d.get("p") {
            Some(Desired::Serve(r)) => {
                v.acked.insert("p".into(), r.version.clone());
            }
            _ => {
                v.acked.remove("p");
            }
        }
    }
}

/// What each node is given of `p`: its version, or `-`.
fn given(f: &Fleet, e: &PluginEntry) -> Vec<String> {
    let snap = Snapshot {
        plugins: [("p".to_owned(), e.clone())].into_iter().collect(),
        ..Snapshot::default()
    };
    f.nodes
        .keys()
        .map(|name| {
            match snap
                .desired(
                    weft_proto::type_url::EXTENSION_CONFIG,
                    &NodeKey {
                        id: String::new(),
                        name: name.clone(),
                    },
                )
                .get("p")
            {
                Some(Desired::Serve(r)) => r.version.clone(),
                _ => "-".into(),
            }
        })
        .collect()
}

/// Step `source` (a fresh copy, as the source gives it) at `now`.
fn run(source: &PluginEntry, rec: &mut Record, f: &Fleet, now: SystemTime) -> (PluginEntry, Step) {
    let mut e = source.clone();
    let s = step("p", &mut e, rec, f, now);
    (e, s)
}

/// A record whose stable version is `v1` served everywhere.
fn rolled_out_v1(f: &Fleet) -> (Record, PluginEntry) {
    let v1 = entry('1', serde_json::Value::Null);
    let mut rec = Record::default();
    let (e, _) = run(&v1, &mut rec, f, t(0));
    assert_eq!(rec.stable.as_ref().unwrap().version, v1.current.version);
    (rec, e)
}

/// Node `n` reports `calls` and `failures` of `p` serving code 2.
fn set_counts(f: &mut Fleet, n: &str, calls: u64, failures: u64) {
    f.nodes.get_mut(n).unwrap().counts.insert(
        "p".into(),
        CountsRecord {
            sha256: sha('2'),
            calls,
            failures,
        },
    );
}

fn count(given: &[String], version: &str) -> usize {
    given.iter().filter(|v| *v == version).count()
}

#[test]
fn the_order_is_stable_and_spreads_across_zones() {
    let f = fleet(6);
    let o = order("p", &f, None);
    assert_eq!(o.len(), 6);
    assert_eq!(o, order("p", &f, None));
    let zone = |n: &str| f.nodes[n].zone.clone();
    assert_ne!(zone(&o[0]), zone(&o[1]), "{o:?}");
    assert_ne!(zone(&o[1]), zone(&o[2]), "{o:?}");
    // A node leaving does not reorder the others.
    let mut g = f.clone();
    g.nodes.remove(&o[3]);
    let o2 = order("p", &g, None);
    let mut without = o.clone();
    without.remove(3);
    assert_eq!(o2[..3], without[..3]);
}

#[test]
fn a_clean_version_goes_stage_by_stage_to_every_node() {
    let mut f = fleet(10);
    let (mut rec, _) = rolled_out_v1(&f);
    let v1 = rec.stable.clone().unwrap().version;
    let v2 = staged('2');
    let target = v2.current.version.clone();

    // Stage 1: one node, the others keep v1.
    let (e, s) = run(&v2, &mut rec, &f, t(1));
    assert!(s.changed);
    let g = given(&f, &e);
    assert_eq!((count(&g, &target), count(&g, &v1)), (1, 9), "{g:?}");
    // Not baking until it ACKed.
    assert_eq!(s.deadline, None);
    ack_all(&mut f, &e);
    let (_, s) = run(&v2, &mut rec, &f, t(2));
    assert_eq!(s.deadline, Some(t(12)));
    let (e, _) = run(&v2, &mut rec, &f, t(11));
    assert_eq!(count(&given(&f, &e), &target), 1);

    // Baked: stage 2, half the nodes.
    let (e, s) = run(&v2, &mut rec, &f, t(12));
    assert_eq!(rec.rollout.as_ref().unwrap().stage, 1);
    assert_eq!(count(&given(&f, &e), &target), 5);
    assert_eq!(s.deadline, None);
    ack_all(&mut f, &e);
    let (_, s) = run(&v2, &mut rec, &f, t(13));
    assert_eq!(s.deadline, Some(t(23)));

    // Stage 3, then complete: every node, unrestricted, and v2 is the stable version.
    let (e, _) = run(&v2, &mut rec, &f, t(23));
    assert_eq!(count(&given(&f, &e), &target), 10);
    ack_all(&mut f, &e);
    run(&v2, &mut rec, &f, t(24));
    let (e, _) = run(&v2, &mut rec, &f, t(34));
    let r = rec.rollout.as_ref().unwrap();
    assert_eq!(r.state, Progress::Complete);
    assert_eq!(e.nodes, None);
    assert_eq!(rec.stable.as_ref().unwrap().version, target);
    let events: Vec<&str> = r.timeline.iter().map(|e| e.event.as_str()).collect();
    assert_eq!(events.len(), 8, "{events:#?}");
    assert!(
        events[0]
            == format!(
                "started: version {target} (code 222222222222), 3 stage(s), replacing version {v1} (code 111111111111)"
            ),
        "{events:?}"
    );
    assert!(events[7].starts_with("complete"), "{events:?}");
    assert_eq!(r.timeline[7].after_seconds, 33.0);
}

#[test]
fn a_nack_aborts_and_every_node_goes_back_to_the_previous_version() {
    let mut f = fleet(10);
    let (mut rec, _) = rolled_out_v1(&f);
    let v1 = rec.stable.clone().unwrap().version;
    let v2 = staged('2');
    let (e, _) = run(&v2, &mut rec, &f, t(1));
    let first = e.nodes.clone().unwrap().0;
    assert_eq!(first.len(), 1);
    f.nodes.get_mut(&first[0]).unwrap().nacked.insert(
        "p".into(),
        Nacked {
            version: v2.current.version.clone(),
            reason: "p: cannot instantiate: unknown import".into(),
            at: String::new(),
        },
    );
    let (e, s) = run(&v2, &mut rec, &f, t(2));
    assert!(s.changed && !s.withdraw);
    let r = rec.rollout.as_ref().unwrap();
    assert_eq!(r.state, Progress::Aborted);
    let a = r.abort.as_ref().unwrap();
    assert_eq!((a.stage, a.nodes.clone()), (1, first.clone()));
    assert!(a.reason.contains("unknown import"), "{}", a.reason);
    assert!(given(&f, &e).iter().all(|v| *v == v1));
    // It stays aborted; the stable version stays v1.
    let (e, _) = run(&v2, &mut rec, &f, t(100));
    assert!(given(&f, &e).iter().all(|v| *v == v1));
    assert_eq!(rec.stable.as_ref().unwrap().version, v1);
    // Back to v1 in the source: nothing to roll out.
    let v1_again = entry(
        '1',
        serde_json::json!({"stages": [{"nodes": 1, "bake": "1s"}]}),
    );
    let (e, _) = run(&v1_again, &mut rec, &f, t(101));
    assert_eq!(e.nodes, None);
}

#[test]
fn a_rollback_or_a_failure_ratio_aborts() {
    let mut f = fleet(4);
    let (mut rec, _) = rolled_out_v1(&f);
    let v2 = entry(
        '2',
        serde_json::json!({"stages": [{"nodes": 2, "bake": "1m"}], "abortWhen": {"failureRatio": 0.1, "minCalls": 10}}),
    );
    let (e, _) = run(&v2, &mut rec, &f, t(1));
    ack_all(&mut f, &e);
    let nodes = e.nodes.clone().unwrap().0;
    // Counts before the version served are the baseline: 100 calls, 50 failed under v1.
    for n in &nodes {
        set_counts(&mut f, n, 100, 50);
    }
    let (_, s) = run(&v2, &mut rec, &f, t(2));
    assert_eq!(rec.rollout.as_ref().unwrap().state, Progress::Progressing);
    assert!(s.progressed, "the stage started baking: {s:?}");
    // 20 more calls, 1 failed: 5 %, under 10 %. Figures alone: changed, not progressed (persisted later).
    set_counts(&mut f, &nodes[0], 120, 51);
    let (_, s) = run(&v2, &mut rec, &f, t(3));
    assert!(s.changed && !s.progressed, "{s:?}");
    assert_eq!(rec.rollout.as_ref().unwrap().state, Progress::Progressing);
    set_counts(&mut f, &nodes[1], 110, 60);
    run(&v2, &mut rec, &f, t(4));
    let r = rec.rollout.as_ref().unwrap();
    assert_eq!(r.state, Progress::Aborted);
    assert!(
        r.abort
            .as_ref()
            .unwrap()
            .reason
            .contains("failure ratio 0.3667 (11 of 30 calls)"),
        "{:?}",
        r.abort
    );

    // A rollback.
    let mut f = fleet(4);
    let (mut rec, _) = rolled_out_v1(&f);
    let (e, _) = run(&v2, &mut rec, &f, t(1));
    let nodes = e.nodes.clone().unwrap().0;
    f.nodes
        .get_mut(&nodes[1])
        .unwrap()
        .rollbacks
        .push(crate::rollout::fleet::RolledBack {
            plugin: "p".into(),
            sha256: sha('2'),
            summary: "20 of 20 calls failed (20 traps, 0 timeouts) in 1.5s".into(),
        });
    run(&v2, &mut rec, &f, t(2));
    let r = rec.rollout.as_ref().unwrap();
    assert_eq!(r.state, Progress::Aborted);
    assert!(
        r.abort.as_ref().unwrap().reason.contains("20 traps"),
        "{:?}",
        r.abort
    );
}

fn shadow_report(total: u64, divergent: u64) -> ShadowRecord {
    ShadowRecord {
        serving_sha256: sha('1'),
        shadow_sha256: sha('2'),
        load_error: None,
        decisions: vec![
            Decisions {
                direction: "inbound".into(),
                serving: "allow".into(),
                shadow: "allow".into(),
                count: total - divergent,
            },
            Decisions {
                direction: "inbound".into(),
                serving: "allow".into(),
                shadow: "deny".into(),
                count: divergent,
            },
        ],
        divergences: divergent,
        skipped: 0,
        samples: vec![Sample {
            direction: "inbound".into(),
            source: "10.0.0.1:4000".into(),
            destination: "10.0.0.2:9090".into(),
            source_identity: String::new(),
            source_workload: "default/client".into(),
            destination_workload: "default/server".into(),
            serving: "allow".into(),
            serving_reason: String::new(),
            shadow: "deny".into(),
            shadow_reason: "port 9090 not allowed".into(),
        }],
        at: String::new(),
    }
}

#[test]
fn a_shadow_first_stage_runs_the_version_as_a_shadow_then_serves_it() {
    let mut f = fleet(4);
    let (mut rec, _) = rolled_out_v1(&f);
    let v1 = rec.stable.clone().unwrap().version;
    let v2 = entry(
        '2',
        serde_json::json!({"stages": [{"nodes": 1, "bake": "10s", "shadowFirst": true}, {"percent": 100, "bake": "0s"}], "abortWhen": {"divergenceRatio": 0.01}}),
    );
    let (e, _) = run(&v2, &mut rec, &f, t(1));
    let (sel, shadowing) = e.shadowing.clone().unwrap();
    assert_eq!(sel.0.len(), 1);
    // The shadowing resource: v1 serving, v2 as its shadow.
    let decoded =
        weft_state::xds::plugin::decode_resource_with("p", &shadowing.body, &|_| Ok(())).unwrap();
    assert_eq!(decoded.sha256.as_deref(), Some(sha('1').as_str()));
    assert_eq!(
        decoded.shadow.unwrap().sha256.as_deref(),
        Some(sha('2').as_str())
    );
    let g = given(&f, &e);
    assert_eq!((count(&g, &shadowing.version), count(&g, &v1)), (1, 3));
    ack_all(&mut f, &e);
    f.nodes
        .get_mut(&sel.0[0])
        .unwrap()
        .shadows
        .insert("p".into(), shadow_report(1000, 5));
    run(&v2, &mut rec, &f, t(2));
    // Baked clean as a shadow: serves on that node, bakes again, then (zero bake) everywhere.
    let (e, _) = run(&v2, &mut rec, &f, t(12));
    assert_eq!(e.shadowing, None);
    assert_eq!(count(&given(&f, &e), &v2.current.version), 1);
    ack_all(&mut f, &e);
    let (_, s) = run(&v2, &mut rec, &f, t(13));
    assert_eq!(s.deadline, Some(t(23)));
    let (e, _) = run(&v2, &mut rec, &f, t(23));
    assert_eq!(count(&given(&f, &e), &v2.current.version), 4);
    ack_all(&mut f, &e);
    run(&v2, &mut rec, &f, t(24));
    let r = rec.rollout.as_ref().unwrap();
    assert_eq!(r.state, Progress::Complete, "{:#?}", r.timeline);
    assert!(
        r.timeline.iter().any(|e| e
            .event
            .contains("shadow baked clean (1000 decisions, 5 divergent)")),
        "{:#?}",
        r.timeline
    );

    // Divergent: 20 of 100 decisions; aborts in the shadow phase naming the port and the workloads.
    let mut f = fleet(4);
    let (mut rec, _) = rolled_out_v1(&f);
    let (e, _) = run(&v2, &mut rec, &f, t(1));
    ack_all(&mut f, &e);
    let node = e.shadowing.clone().unwrap().0.0[0].clone();
    f.nodes
        .get_mut(&node)
        .unwrap()
        .shadows
        .insert("p".into(), shadow_report(100, 20));
    let (e, _) = run(&v2, &mut rec, &f, t(3));
    let r = rec.rollout.as_ref().unwrap();
    let a = r.abort.as_ref().unwrap();
    assert_eq!((a.stage, a.phase), (1, Phase::Shadow));
    assert!(
        a.reason.contains("0.2000 (20 of 100 decisions)")
            && a.reason.contains("10.0.0.2:9090")
            && a.reason.contains("default/client -> default/server")
            && a.reason.contains("port 9090 not allowed"),
        "{}",
        a.reason
    );
    assert!(given(&f, &e).iter().all(|v| *v == v1));
}

#[test]
fn a_node_that_joins_gets_what_its_stage_says_and_a_restart_resumes() {
    let mut f = fleet(4);
    let (mut rec, _) = rolled_out_v1(&f);
    let v1 = rec.stable.clone().unwrap().version;
    let v2 = staged('2');
    let target = v2.current.version.clone();
    let (e, _) = run(&v2, &mut rec, &f, t(1));
    ack_all(&mut f, &e);
    run(&v2, &mut rec, &f, t(2));
    let (e, _) = run(&v2, &mut rec, &f, t(12));
    ack_all(&mut f, &e);
    // Stage 2 (50 %): 2 of 4. Persisted and read back, as after a restart.
    let text = serde_json::to_string(&rec).unwrap();
    let mut rec: Record = serde_json::from_str(&text).unwrap();
    run(&v2, &mut rec, &f, t(13));
    assert_eq!(rec.rollout.as_ref().unwrap().stage, 1);
    // Two nodes join: 50 % of 6 is 3, so one of them gets v2, the other v1.
    for i in 4..6 {
        f.nodes.insert(format!("node-{i}"), NodeView::default());
    }
    let (e, _) = run(&v2, &mut rec, &f, t(14));
    let g = given(&f, &e);
    assert_eq!((count(&g, &target), count(&g, &v1)), (3, 3), "{g:?}");
    assert_eq!(rec.rollout.as_ref().unwrap().stage, 1);
}

#[test]
fn a_first_version_that_aborts_is_withdrawn() {
    let f = fleet(2);
    let mut rec = Record::default();
    let v = staged('2');
    let (e, _) = run(&v, &mut rec, &f, t(1));
    let node = e.nodes.clone().unwrap().0[0].clone();
    let mut f = f;
    f.nodes.get_mut(&node).unwrap().nacked.insert(
        "p".into(),
        Nacked {
            version: v.current.version.clone(),
            reason: "bad".into(),
            at: String::new(),
        },
    );
    let (_, s) = run(&v, &mut rec, &f, t(2));
    assert!(s.withdraw);
}

#[test]
fn an_edit_mid_rollout_starts_over_from_the_stable_version_on_the_plugin_s_nodes_only() {
    let mut f = fleet(6);
    let (mut rec, _) = rolled_out_v1(&f);
    let v1 = rec.stable.clone().unwrap().version;
    let mut v2 = staged('2');
    // The plugin is for nodes 0-3 only (its workloads run there).
    let placement = NodeSelector((0..4).map(|i| format!("node-{i}")).collect());
    v2.placement = Some(placement.clone());
    let (e, _) = run(&v2, &mut rec, &f, t(1));
    ack_all(&mut f, &e);
    run(&v2, &mut rec, &f, t(2));
    let (e, _) = run(&v2, &mut rec, &f, t(12));
    // Stage 2, 50 % of the 4 placed nodes.
    let picked = e.nodes.clone().unwrap().0;
    assert_eq!(picked.len(), 2, "{picked:?}");
    assert!(picked.iter().all(|n| placement.0.contains(n)), "{picked:?}");

    // v3 replaces v2 before it finished: a new rollout from v1, one node, v2 gone from the others.
    let mut v3 = staged('3');
    v3.placement = Some(placement.clone());
    let (e, s) = run(&v3, &mut rec, &f, t(13));
    assert!(s.progressed);
    let r = rec.rollout.as_ref().unwrap();
    assert_eq!(
        (r.stage, r.target_version.clone()),
        (0, v3.current.version.clone())
    );
    assert_eq!(r.previous_version.as_deref(), Some(v1.as_str()));
    let g = given(&f, &e);
    assert_eq!(count(&g, &v3.current.version), 1, "{g:?}");
    assert_eq!(count(&g, &v2.current.version), 0, "{g:?}");
}

#[test]
fn a_replica_serving_from_the_record_gives_every_node_what_the_stepping_one_does() {
    let mut f = fleet(4);
    let (mut rec, _) = rolled_out_v1(&f);
    let v2 = entry(
        '2',
        serde_json::json!({"stages": [{"nodes": 1, "bake": "10s", "shadowFirst": true}, {"percent": 50, "bake": "10s"}, {"percent": 100, "bake": "1s"}]}),
    );
    let base = || rec_base(&rec);
    let mirror = |rec: &Record| {
        let mut e = v2.clone();
        serve(
            "p",
            &mut e,
            rec,
            rec.stable.as_ref().and_then(|s| s.resource("p")),
        );
        e
    };
    // Not started: the stable version everywhere.
    let before = mirror(&rec);
    assert!(given(&f, &before).iter().all(|v| *v == base()));
    for at in 1..60 {
        let (stepped, _) = run(&v2, &mut rec, &f, t(at));
        let mirrored = mirror(&rec);
        assert_eq!(given(&f, &stepped), given(&f, &mirrored), "at {at}s");
        ack_all(&mut f, &stepped);
    }
    assert_eq!(rec.rollout.as_ref().unwrap().state, Progress::Complete);
}

fn rec_base(rec: &Record) -> String {
    rec.stable.as_ref().unwrap().version.clone()
}
