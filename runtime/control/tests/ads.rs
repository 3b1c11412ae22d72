//! weft control over real gRPC and real TLS (in-process server, loopback port): initial sync, deltas and
//! removals, reconnect with `initial_resource_versions` (also against a restarted server), staged rollout, token
//! refusals.
#![allow(clippy::unwrap_used)] // a test panics to fail

mod common;

use std::collections::HashMap;

use common::*;
use weft_proto::istio::workload::{Address, TunnelProtocol, address};
use weft_proto::type_url::{ADDRESS, AUTHORIZATION, EXTENSION_CONFIG};

const ECHO1: &str = "Kubernetes//Pod/default/echo-1";
const ECHO2: &str = "Kubernetes//Pod/default/echo-2";
const SVC: &str = "default/echo.default.svc.cluster.local";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn initial_sync_then_only_changes_and_removals() {
    let env = Env::new(&["node-a"]);
    std::fs::write(env.path("plugins/code.wasm"), b"v1 code").unwrap();
    env.write(
        "plugins/p.yaml",
        &plugin_yaml("p", "code.wasm", "{ports: [8080]}", ""),
    );
    let srv = env.start().await;
    let mut a = env.client(srv.addr, "node-a").await;

    a.subscribe(ADDRESS, HashMap::new()).await;
    let r = a.recv().await;
    assert_eq!(r.type_url, ADDRESS);
    assert_eq!(names(&r), vec![ECHO1.to_owned(), SVC.to_owned()]);
    assert!(r.removed_resources.is_empty());
    // The workload as istiod would send it.
    let w = r.resources.iter().find(|x| x.name == ECHO1).unwrap();
    let addr: Address = weft_proto::from_any(ADDRESS, w.resource.as_ref().unwrap()).unwrap();
    let Some(address::Type::Workload(w)) = addr.r#type else {
        panic!("not a workload")
    };
    assert_eq!(w.uid, ECHO1);
    assert_eq!(w.addresses, vec![vec![127, 0, 2, 1]]);
    assert_eq!(w.tunnel_protocol, TunnelProtocol::Hbone as i32);
    assert_eq!(w.service_account, "echo");
    assert_eq!(w.node, "node-b");
    assert_eq!(w.services[SVC].ports[0].service_port, 80);
    assert_eq!(w.services[SVC].ports[0].target_port, 8080);
    a.ack(&r).await;

    a.subscribe(AUTHORIZATION, HashMap::new()).await;
    let r = a.recv().await;
    assert_eq!(r.type_url, AUTHORIZATION);
    assert_eq!(names(&r), vec!["default/allow-sleep".to_owned()]);
    let p: weft_proto::istio::security::Authorization =
        weft_proto::from_any(AUTHORIZATION, r.resources[0].resource.as_ref().unwrap()).unwrap();
    assert_eq!(p.groups.len(), 1);
    assert_eq!(p.groups[0].rules[0].matches[0].principals.len(), 1);
    a.ack(&r).await;

    a.subscribe(EXTENSION_CONFIG, HashMap::new()).await;
    let r = a.recv().await;
    assert_eq!(r.type_url, EXTENSION_CONFIG);
    assert_eq!(names(&r), vec!["p".to_owned()]);
    let wp = weft_plugin(r.resources[0].resource.as_ref().unwrap());
    let cfg = wp.config.unwrap();
    assert_eq!(cfg.name, "p");
    let conf: String = weft_proto::from_any(
        weft_proto::type_url::STRING_VALUE,
        cfg.configuration.as_ref().unwrap(),
    )
    .unwrap();
    assert_eq!(conf, r#"{"ports":[8080]}"#);
    a.ack(&r).await;
    assert!(
        srv.registry
            .wait_for(WAIT, |reg| reg.acked_count(
                EXTENSION_CONFIG,
                "p",
                &r.resources[0].version
            ) == 1)
            .await
    );

    // A workload added: only it goes out (the service and echo-1 did not change; policies send nothing).
    env.write("mesh.yaml", &mesh(&["echo-1", "echo-2"]));
    let r = a.recv().await;
    assert_eq!(r.type_url, ADDRESS);
    assert_eq!(names(&r), vec![ECHO2.to_owned()]);
    assert!(r.removed_resources.is_empty());
    a.ack(&r).await;

    // A workload removed: only its removal.
    env.write("mesh.yaml", &mesh(&["echo-2"]));
    let r = a.recv().await;
    assert_eq!(r.type_url, ADDRESS);
    assert!(r.resources.is_empty(), "{:?}", names(&r));
    assert_eq!(r.removed_resources, vec![ECHO1.to_owned()]);
    a.ack(&r).await;

    // A plugin edit: the next message is the plugin (nothing was sent for Authorization in between).
    env.write(
        "plugins/p.yaml",
        &plugin_yaml("p", "code.wasm", "{ports: [9090]}", ""),
    );
    let r = a.recv().await;
    assert_eq!(r.type_url, EXTENSION_CONFIG);
    assert_eq!(names(&r), vec!["p".to_owned()]);
    a.ack(&r).await;

    // A plugin file removed: its removal.
    std::fs::remove_file(env.path("plugins/p.yaml")).unwrap();
    let r = a.recv().await;
    assert_eq!(r.type_url, EXTENSION_CONFIG);
    assert_eq!(r.removed_resources, vec!["p".to_owned()]);
    srv.stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconnect_with_initial_resource_versions_gets_only_what_differs() {
    let env = Env::new(&["node-a"]);
    let srv = env.start().await;
    let mut a = env.client(srv.addr, "node-a").await;
    a.subscribe(ADDRESS, HashMap::new()).await;
    let first = a.recv().await;
    a.ack(&first).await;
    let had = versions(&first);
    drop(a);
    assert!(srv.registry.wait_for(WAIT, |r| r.connected() == 0).await);

    // While the node is away: echo-2 added; the node also remembers something the server no longer has.
    env.write("mesh.yaml", &mesh(&["echo-1", "echo-2"]));
    until("echo-2 published", || {
        srv.publisher.current().addresses.contains_key(ECHO2)
    })
    .await;
    let mut initial = had.clone();
    initial.insert("Kubernetes//Pod/default/gone".into(), "0123".into());
    let mut a = env.client(srv.addr, "node-a").await;
    a.subscribe(ADDRESS, initial).await;
    let r = a.recv().await;
    assert_eq!(names(&r), vec![ECHO2.to_owned()]);
    assert_eq!(
        r.removed_resources,
        vec!["Kubernetes//Pod/default/gone".to_owned()]
    );
    a.ack(&r).await;
    let mut now = had;
    now.extend(versions(&r));
    srv.stop.cancel();

    // A restarted server (new process state, new hash seeds) derives the same versions: nothing to send but
    // the (empty) answer to the subscription.
    let srv2 = env.start().await;
    let mut a = env.client(srv2.addr, "node-a").await;
    a.subscribe(ADDRESS, now).await;
    let r = a.recv().await;
    assert!(r.resources.is_empty(), "resent: {:?}", names(&r));
    assert!(r.removed_resources.is_empty());
    srv2.stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn staged_rollout_reaches_only_the_selected_nodes_until_promoted() {
    let env = Env::new(&["node-a", "node-b"]);
    std::fs::write(env.path("plugins/v1.wasm"), b"v1").unwrap();
    std::fs::write(env.path("plugins/v2.wasm"), b"v2").unwrap();
    env.write("plugins/p.yaml", &plugin_yaml("p", "v1.wasm", "{}", ""));
    let srv = env.start().await;
    let mut a = env.client(srv.addr, "node-a").await;
    let mut b = env.client(srv.addr, "node-b").await;
    for c in [&mut a, &mut b] {
        c.subscribe(EXTENSION_CONFIG, HashMap::new()).await;
        let r = c.recv().await;
        assert_eq!(names(&r), vec!["p".to_owned()]);
        c.ack(&r).await;
    }
    let v1 = srv.publisher.current().plugins["p"].current.version.clone();

    // v2 staged on node-a only.
    env.write(
        "plugins/p.yaml",
        &plugin_yaml("p", "v2.wasm", "{}", "  rollout:\n    nodes: [node-a]\n"),
    );
    let r = a.recv().await;
    let v2 = r.resources[0].version.clone();
    assert_ne!(v1, v2);
    a.ack(&r).await;
    assert!(
        srv.registry
            .wait_for(WAIT, |reg| reg.acked_count(EXTENSION_CONFIG, "p", &v2) == 1
                && reg.acked_count(EXTENSION_CONFIG, "p", &v1) == 1)
            .await
    );
    let st = status(srv.status_addr.unwrap()).await;
    assert_eq!(st["plugins"]["p"]["base"]["version"], v1.as_str());
    assert_eq!(st["plugins"]["p"]["nodes"], serde_json::json!(["node-a"]));

    // Promoted: node-b's next message is v2; node-a gets nothing new (its next message would be a later change).
    env.write("plugins/p.yaml", &plugin_yaml("p", "v2.wasm", "{}", ""));
    let r = b.recv().await;
    assert_eq!(r.resources[0].version, v2);
    b.ack(&r).await;
    assert!(
        srv.registry
            .wait_for(WAIT, |reg| reg.acked_count(EXTENSION_CONFIG, "p", &v2) == 2)
            .await
    );
    env.write("plugins/p.yaml", &plugin_yaml("p", "v1.wasm", "{}", ""));
    let r = a.recv().await;
    assert_eq!(
        r.resources[0].version, v1,
        "node-a's next message is the next change"
    );
    srv.stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_without_a_valid_token_or_claiming_another_node_are_refused() {
    let env = Env::new(&["node-a"]);
    let srv = env.start().await;
    let ch = || channel(srv.addr, &env.root_pem);

    let e = AdsClient::open(ch(), None, node("node-a"))
        .await
        .err()
        .unwrap();
    assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e}");
    let e = AdsClient::open(ch(), Some("not-a-token"), node("node-a"))
        .await
        .err()
        .unwrap();
    assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e}");
    assert!(e.message().contains("unknown token"), "{e}");

    // node-a's token, node-b's name: refused on the first request.
    let mut c = AdsClient::open(ch(), Some(&token("node-a")), node("node-b"))
        .await
        .unwrap();
    c.subscribe(ADDRESS, HashMap::new()).await;
    let e = c.try_recv().await.err().unwrap();
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e}");
    assert!(e.message().contains("node-a"), "{e}");
    assert_eq!(srv.registry.connected(), 0);

    let (_, metrics) = http_get(srv.metrics_addr.unwrap(), "/metrics").await;
    for reason in ["no_token", "token_rejected", "node_mismatch"] {
        assert!(
            metrics.contains(&format!(
                "weft_control_streams_refused_total{{reason=\"{reason}\"}} 1"
            )),
            "{reason} not counted:\n{metrics}"
        );
    }
    srv.stop.cancel();
}
