//! Tests of the status the leader writes: conditions, counts and phase from the replicas' reports, transition times
//! kept while a condition holds. Every status built here is also written to
//! `conformance/packaging/fixtures/weftplugin-statuses.json`, which the CRD tests validate against the CRD's status
//! schema (`WEFT_UPDATE_FIXTURES=1` rewrites it; otherwise it must match).
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Value, json};

use super::*;
use crate::kube::reconcile::Serving;
use crate::kube::report::{NodeReport, RollbackSeen};

const SHA: &str = "462e3589dcce6687dc7322e5c8e4d8d7cb39843fdcbcc6386baeb354f27fb1a5";
const NOW: &str = "2026-12-07T10:00:00Z";
const LATER: &str = "2026-12-07T11:00:00Z";

fn state(serving_on: Option<&[&str]>, refused: Option<&str>) -> ResourceState {
    ResourceState {
        generation: 3,
        uid: "u1".into(),
        refused: refused.map(str::to_owned),
        xds_name: "shop.allow".into(),
        serving: serving_on.map(|nodes| Serving {
            version: "v3".into(),
            sha256: Some(SHA.into()),
            nodes: Some(
                nodes
                    .iter()
                    .map(|n| (*n).to_owned())
                    .collect::<BTreeSet<_>>(),
            ),
            staged: None,
        }),
        status: None,
    }
}

fn node(plugins: &[(&str, &str)]) -> NodeReport {
    NodeReport {
        plugins: plugins
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        ..Default::default()
    }
}

fn cond<'a>(s: &'a Value, kind: &str) -> &'a Value {
    s["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == kind)
        .unwrap()
}

/// Every status the cases below build, in order, for the fixture.
fn fixture(statuses: &[Value]) {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../conformance/packaging/fixtures/weftplugin-statuses.json");
    let text = format!("{}\n", serde_json::to_string_pretty(statuses).unwrap());
    if std::env::var_os("WEFT_UPDATE_FIXTURES").is_some() {
        std::fs::write(&path, text).unwrap();
        return;
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    assert_eq!(
        have,
        text,
        "{} is stale: run with WEFT_UPDATE_FIXTURES=1",
        path.display()
    );
}

#[test]
fn statuses_from_reports() {
    let nodes: BTreeMap<String, NodeReport> = BTreeMap::from([
        ("node-a".into(), node(&[("shop.allow", "v3")])),
        ("node-b".into(), node(&[("shop.allow", "v2")])),
        ("node-c".into(), node(&[])),
    ]);
    let mut all = Vec::new();

    // Served on every selected node (node-c is not selected): Ready.
    let ready = desired(&state(Some(&["node-a"]), None), &nodes, NOW);
    assert_eq!(ready["phase"], "Ready");
    assert_eq!(ready["readyNodes"], "1/1");
    assert_eq!(cond(&ready, "Accepted")["status"], "True");
    assert_eq!(cond(&ready, "Ready")["status"], "True");
    assert_eq!(ready["servingSha256"], SHA);
    assert_eq!(ready["observedGeneration"], 3);
    all.push(ready.clone());

    // node-b still runs v2: Pending, 1/2.
    let pending = desired(&state(Some(&["node-a", "node-b"]), None), &nodes, NOW);
    assert_eq!(pending["phase"], "Pending");
    assert_eq!(
        pending["nodes"],
        json!({"selected": 2, "serving": 1, "nacking": 0, "rolledBack": 0})
    );
    assert_eq!(cond(&pending, "Ready")["reason"], "Pending");
    all.push(pending);

    // node-b NACKs v3 and rolled back this code: Degraded, with the last rollback.
    let mut bad = nodes.clone();
    let b = bad.get_mut("node-b").unwrap();
    b.nacked.insert(
        "shop.allow".into(),
        ("v3".into(), "shop.allow: fetch failed: 401".into()),
    );
    b.rollbacks.push(RollbackSeen {
        plugin: "shop.allow".into(),
        sha256: SHA.into(),
        reason: "7 of 20 calls failed (5 traps, 2 timeouts) within 3.0s; threshold 0.2".into(),
        at: "2026-12-07T09:59:00.123Z".into(),
    });
    let degraded = desired(&state(Some(&["node-a", "node-b"]), None), &bad, NOW);
    assert_eq!(degraded["phase"], "Degraded");
    assert_eq!(degraded["nodes"]["nacking"], 1);
    assert_eq!(degraded["nodes"]["rolledBack"], 1);
    assert_eq!(degraded["lastRollback"]["node"], "node-b");
    all.push(degraded);

    // Refused, never accepted: nothing served.
    let refused = desired(
        &state(
            None,
            Some("spec.url: \"file:///x\": file:// is not allowed"),
        ),
        &nodes,
        NOW,
    );
    assert_eq!(refused["phase"], "Refused");
    assert_eq!(cond(&refused, "Accepted")["reason"], "Refused");
    assert_eq!(cond(&refused, "Ready")["status"], "False");
    all.push(refused);

    // Refused edit while the last accepted version serves everywhere: Accepted=False, still Ready.
    let edit = desired(
        &state(
            Some(&["node-a"]),
            Some("spec.rollout.window: invalid duration"),
        ),
        &nodes,
        NOW,
    );
    assert_eq!(edit["phase"], "Refused");
    assert_eq!(cond(&edit, "Ready")["status"], "True");
    all.push(edit);

    // No selected node: Ready, nothing to wait for.
    let none = desired(&state(Some(&[]), None), &nodes, NOW);
    assert_eq!(none["readyNodes"], "0/0");
    assert_eq!(cond(&none, "Ready")["reason"], "NoSelectedNodes");
    all.push(none);

    // Staged on node-a: Staged.
    let mut staged = state(Some(&["node-a", "node-b"]), None);
    if let Some(s) = staged.serving.as_mut() {
        s.staged = Some(vec!["node-a".into()]);
    }
    let st = desired(&staged, &nodes, NOW);
    assert_eq!(st["phase"], "Staged");
    assert_eq!(st["readyNodes"], "1/1");
    all.push(st);

    // Shadow reports from the selected nodes: totals and the newest samples, with their node.
    let mut shadowed = nodes.clone();
    let record = |at: &str, allow_deny: u64, allow_allow: u64| crate::ads::shadow::ShadowRecord {
        serving_sha256: SHA.into(),
        shadow_sha256: "b".repeat(64),
        load_error: None,
        decisions: vec![
            crate::ads::shadow::Decisions {
                direction: "inbound".into(),
                serving: "allow".into(),
                shadow: "deny".into(),
                count: allow_deny,
            },
            crate::ads::shadow::Decisions {
                direction: "inbound".into(),
                serving: "allow".into(),
                shadow: "allow".into(),
                count: allow_allow,
            },
        ],
        divergences: allow_deny,
        skipped: 0,
        samples: vec![crate::ads::shadow::Sample {
            direction: "inbound".into(),
            source: "10.0.0.1:40000".into(),
            destination: "10.0.0.2:9090".into(),
            source_identity: "spiffe://cluster.local/ns/shop/sa/web".into(),
            source_workload: "shop/web-1".into(),
            destination_workload: "shop/db-1".into(),
            serving: "allow".into(),
            serving_reason: String::new(),
            shadow: "deny".into(),
            shadow_reason: "port 9090 is not allowed".into(),
        }],
        at: at.into(),
    };
    shadowed.get_mut("node-a").unwrap().shadows.insert(
        "shop.allow".into(),
        record("2026-12-07T09:00:00.000Z", 3, 10),
    );
    shadowed.get_mut("node-b").unwrap().shadows.insert(
        "shop.allow".into(),
        record("2026-12-07T09:30:00.000Z", 1, 5),
    );
    // node-c reports too, but is not selected: not counted.
    shadowed.get_mut("node-c").unwrap().shadows.insert(
        "shop.allow".into(),
        record("2026-12-07T09:45:00.000Z", 100, 0),
    );
    let sh = desired(&state(Some(&["node-a", "node-b"]), None), &shadowed, NOW);
    assert_eq!(sh["shadow"]["nodes"], 2);
    assert_eq!(sh["shadow"]["decisions"], 19);
    assert_eq!(sh["shadow"]["divergences"], 4);
    assert_eq!(sh["shadow"]["sha256"], "b".repeat(64));
    let samples = sh["shadow"]["samples"].as_array().unwrap();
    assert_eq!(samples.len(), 2);
    assert_eq!(samples[1]["node"], "node-b", "newest last");
    assert_eq!(samples[0]["shadowReason"], "port 9090 is not allowed");
    all.push(sh);

    // A very long refusal is bounded as the CRD bounds it.
    let long = desired(&state(None, Some(&"x".repeat(40_000))), &nodes, NOW);
    assert!(cond(&long, "Accepted")["message"].as_str().unwrap().len() <= 32768);
    all.push(long);

    fixture(&all);
}

#[test]
fn a_condition_keeps_its_transition_time_until_its_status_changes() {
    let nodes = BTreeMap::from([("node-a".to_owned(), node(&[("shop.allow", "v3")]))]);
    let mut s = state(Some(&["node-a"]), None);
    let first = desired(&s, &nodes, NOW);
    s.status = Some(first.clone());
    let again = desired(&s, &nodes, LATER);
    assert_eq!(cond(&again, "Ready")["lastTransitionTime"], NOW);
    assert!(!differs(Some(&first), &again));
    // node-a falls behind: Ready turns False, at the later time.
    let behind = BTreeMap::from([("node-a".to_owned(), node(&[("shop.allow", "v2")]))]);
    let changed = desired(&s, &behind, LATER);
    assert_eq!(cond(&changed, "Ready")["lastTransitionTime"], LATER);
    assert_eq!(cond(&changed, "Accepted")["lastTransitionTime"], NOW);
    assert!(differs(Some(&first), &changed));
}
