//! ACK and NACK records per node (registry, status endpoint, metrics), rollback reports, and bad source files
//! refused with file, field and line while the last good set keeps being served. Real gRPC over real TLS.
#![allow(clippy::unwrap_used)] // a test panics to fail

mod common;

use std::collections::HashMap;

use common::*;
use weft_proto::type_url::{ADDRESS, EXTENSION_CONFIG, ROLLBACK_REPORT};
use weft_proto::weft::plugin::v1::RollbackReport;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acks_nacks_and_rollbacks_are_recorded_per_node() {
    let env = Env::new(&["node-a", "node-b"]);
    std::fs::write(env.path("plugins/good.wasm"), b"good").unwrap();
    std::fs::write(env.path("plugins/bad.wasm"), b"bad").unwrap();
    env.write(
        "plugins/good.yaml",
        &plugin_yaml("good", "good.wasm", "{}", ""),
    );
    env.write(
        "plugins/bad.yaml",
        &plugin_yaml("bad", "bad.wasm", "{}", ""),
    );
    let srv = env.start().await;
    let st_addr = srv.status_addr.unwrap();

    let mut a = env.client(srv.addr, "node-a").await;
    a.subscribe(EXTENSION_CONFIG, HashMap::new()).await;
    let r = a.recv().await;
    assert_eq!(names(&r), vec!["bad".to_owned(), "good".to_owned()]);
    let v = versions(&r);
    // One of the two refused, with its reason; the other applied.
    a.nack(&r, "bad: instantiate: wrong world", vec![]).await;
    let mut b = env.client(srv.addr, "node-b").await;
    b.subscribe(EXTENSION_CONFIG, HashMap::new()).await;
    let rb = b.recv().await;
    b.ack(&rb).await;
    assert!(
        srv.registry
            .wait_for(WAIT, |reg| reg.acked_count(
                EXTENSION_CONFIG,
                "good",
                &v["good"]
            ) == 2
                && reg.acked_count(EXTENSION_CONFIG, "bad", &v["bad"]) == 1)
            .await
    );

    let st = status(st_addr).await;
    assert_eq!(st["connectedNodes"], 2);
    let node_a = st["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["name"] == "node-a")
        .unwrap()
        .clone();
    assert_eq!(node_a["plugins"]["good"]["version"], v["good"].as_str());
    assert_eq!(node_a["plugins"]["good"]["current"], true);
    assert!(node_a["plugins"]["good"]["sha256"].as_str().unwrap().len() == 64);
    assert!(node_a["plugins"].get("bad").is_none(), "{node_a}");
    let nacked = &node_a["nacked"][EXTENSION_CONFIG]["bad"];
    assert_eq!(nacked["version"], v["bad"].as_str());
    assert_eq!(nacked["reason"], "bad: instantiate: wrong world");
    assert_eq!(
        node_a["caller"],
        "spiffe://cluster.local/ns/weft-system/sa/weft"
    );
    assert_eq!(node_a["callerNode"], "node-a");
    assert_eq!(st["plugins"]["good"]["nodesRunningIt"], 2);
    assert_eq!(st["plugins"]["bad"]["nodesRunningIt"], 1);

    // node-b rolls `good` back on its own: an unsolicited NACK with a RollbackReport.
    let report = RollbackReport {
        plugin: "good".into(),
        rolled_back_sha256: "ab".repeat(32),
        restored_sha256: String::new(),
        calls: 40,
        failures: 12,
        traps: 12,
        timeouts: 0,
        after: Some(prost_types::Duration {
            seconds: 2,
            nanos: 0,
        }),
        max_failure_ratio: 0.2,
    };
    b.send(
        weft_proto::envoy::service::discovery::v3::DeltaDiscoveryRequest {
            type_url: EXTENSION_CONFIG.into(),
            error_detail: Some(weft_proto::google::rpc::Status {
                code: 13,
                message: "good: rolled back: 12 of 40 calls failed".into(),
                details: vec![weft_proto::to_any(ROLLBACK_REPORT, &report)],
            }),
            ..Default::default()
        },
    )
    .await;
    assert!(
        srv.registry
            .wait_for(WAIT, |reg| reg.acked_count(
                EXTENSION_CONFIG,
                "good",
                &v["good"]
            ) == 1)
            .await
    );
    let st = status(st_addr).await;
    let node_b = st["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["name"] == "node-b")
        .unwrap()
        .clone();
    assert_eq!(node_b["rollbacks"][0]["plugin"], "good");
    assert_eq!(node_b["rollbacks"][0]["failures"], 12);
    assert_eq!(node_b["rollbacks"][0]["afterSeconds"], 2.0);
    assert!(
        node_b["nacked"][EXTENSION_CONFIG]["good"]["reason"]
            .as_str()
            .unwrap()
            .contains("rolled back after 12 of 40")
    );
    assert!(node_b["plugins"].get("good").is_none());

    let (_, m) = http_get(srv.metrics_addr.unwrap(), "/metrics").await;
    for line in [
        "weft_control_acks_total{type=\"envoy.config.core.v3.TypedExtensionConfig\"} 1",
        "weft_control_nacks_total{type=\"envoy.config.core.v3.TypedExtensionConfig\"} 2",
        "weft_control_rollbacks_total{plugin=\"good\"} 1",
        "weft_control_connected_nodes 2",
    ] {
        assert!(m.contains(line), "missing {line:?} in\n{m}");
    }

    // A disconnected node leaves the status.
    drop(a);
    assert!(
        srv.registry
            .wait_for(WAIT, |reg| reg.connected() == 1)
            .await
    );
    let st = status(st_addr).await;
    assert_eq!(st["connectedNodes"], 1);
    srv.stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_plugin_file_is_refused_with_its_line_and_the_last_good_set_keeps_serving() {
    let env = Env::new(&["node-a"]);
    std::fs::write(env.path("plugins/code.wasm"), b"code").unwrap();
    env.write("plugins/p.yaml", &plugin_yaml("p", "code.wasm", "{}", ""));
    let srv = env.start().await;
    let mut a = env.client(srv.addr, "node-a").await;
    a.subscribe(EXTENSION_CONFIG, HashMap::new()).await;
    let r = a.recv().await;
    a.ack(&r).await;
    let good = srv.publisher.current();

    let cases: [(&str, String, &[&str]); 4] = [
        (
            "a bad sha256",
            plugin_yaml("q", "code.wasm", "{}", "  sha256: xyz\n"),
            &["q.yaml", "line 9", "spec.sha256", "64 hex digits"],
        ),
        (
            "an unknown field",
            plugin_yaml("q", "code.wasm", "{}", "  prority: 3\n"),
            &["q.yaml", "line 9", "unknown field `prority`"],
        ),
        (
            "a sha256 that does not match the code",
            plugin_yaml(
                "q",
                "code.wasm",
                "{}",
                &format!("  sha256: {}\n", "0".repeat(64)),
            ),
            &["q.yaml", "line 9", "spec.sha256", "has sha256"],
        ),
        (
            "https code without a sha256",
            "kind: WeftPlugin\nmetadata: {name: q}\nspec:\n  url: https://example.invalid/q.wasm\n"
                .into(),
            &["q.yaml", "line 4", "required for https://"],
        ),
    ];
    for (i, (what, text, wants)) in cases.iter().enumerate() {
        env.write("plugins/q.yaml", text);
        until(what, || srv.publisher.sources().1.refused == i as u64 + 1).await;
        let err = srv.publisher.sources().1.last_error.unwrap();
        for w in *wants {
            assert!(err.contains(w), "{what}: {w:?} not in {err:?}");
        }
        assert_eq!(
            srv.publisher.current(),
            good,
            "{what}: the served set changed"
        );
        let st = status(srv.status_addr.unwrap()).await;
        assert!(
            st["sources"]["plugins"]["lastError"]
                .as_str()
                .unwrap()
                .contains("q.yaml"),
            "{st}"
        );
    }
    // Serving continues: a new node gets the last good set.
    let mut late = env.client(srv.addr, "node-a").await;
    late.subscribe(EXTENSION_CONFIG, HashMap::new()).await;
    assert_eq!(names(&late.recv().await), vec!["p".to_owned()]);

    // Fixed: applied, the error cleared, and the first node's next message is exactly the new plugin.
    env.write("plugins/q.yaml", &plugin_yaml("q", "code.wasm", "{}", ""));
    let r = a.recv().await;
    assert_eq!(names(&r), vec!["q".to_owned()]);
    assert!(srv.publisher.sources().1.last_error.is_none());

    // Two plugins with one name: refused.
    env.write("plugins/r.yaml", &plugin_yaml("q", "code.wasm", "{}", ""));
    until("duplicate refused", || {
        srv.publisher.sources().1.refused == 5
    })
    .await;
    let err = srv.publisher.sources().1.last_error.unwrap();
    assert!(err.contains("already defined"), "{err}");
    srv.stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_mesh_edit_is_refused_with_its_line_and_the_last_good_mesh_keeps_serving() {
    let env = Env::new(&["node-a"]);
    let srv = env.start().await;
    let mut a = env.client(srv.addr, "node-a").await;
    a.subscribe(ADDRESS, HashMap::new()).await;
    let r = a.recv().await;
    a.ack(&r).await;
    let good = srv.publisher.current();
    env.write(
        "mesh.yaml",
        &mesh(&["echo-1"]).replace("workloadIps: [127.0.2.1]", "workloadIps: [127.0.2.300]"),
    );
    until("mesh edit refused", || {
        srv.publisher.sources().0.last_error.is_some()
    })
    .await;
    let err = srv.publisher.sources().0.last_error.unwrap();
    assert!(err.contains("mesh.yaml"), "{err}");
    assert!(err.contains("line 6"), "{err}");
    assert!(err.contains("workloadIps"), "{err}");
    assert_eq!(srv.publisher.current(), good);
    env.write("mesh.yaml", &mesh(&["echo-1", "echo-2"]));
    let r = a.recv().await;
    assert_eq!(names(&r), vec!["Kubernetes//Pod/default/echo-2".to_owned()]);
    srv.stop.cancel();
}
