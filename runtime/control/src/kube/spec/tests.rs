//! Tests of the resource conversion: what a WeftPlugin's spec becomes, what it selects, what is refused and why.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;

use prost::Message as _;
use serde_json::{Value, json};
use weft_proto::envoy::config::core::v3::TypedExtensionConfig;
use weft_proto::weft::plugin::v1::WeftPlugin;

use super::*;

const SHA: &str = "0167d5e1a7c1b1f4b5ef4fa3a8c7e42d3a6d0e1f2a3b4c5d6e7f8091a2b3c4d5";

fn pods() -> ByName<PodInfo> {
    let pod = |app: &str, node: Option<&str>| PodInfo {
        labels: BTreeMap::from([("app".to_owned(), app.to_owned())]),
        node: node.map(str::to_owned),
    };
    BTreeMap::from([
        (("shop".into(), "web-1".into()), pod("web", Some("node-a"))),
        (("shop".into(), "db-1".into()), pod("db", Some("node-b"))),
        (("shop".into(), "web-2".into()), pod("web", None)),
        (("blog".into(), "web-1".into()), pod("web", Some("node-c"))),
    ])
}

fn labels(app: &str) -> BTreeMap<String, String> {
    BTreeMap::from([("app".to_owned(), app.to_owned())])
}

fn nodes(names: &[&str]) -> Option<BTreeSet<String>> {
    Some(names.iter().map(|s| (*s).to_owned()).collect())
}

/// The WeftPlugin message of an entry's resource.
fn message(e: &PluginEntry) -> WeftPlugin {
    let ecds = TypedExtensionConfig::decode(e.current.body.value.as_slice()).unwrap();
    WeftPlugin::decode(ecds.typed_config.unwrap().value.as_slice()).unwrap()
}

fn build(ns: &str, spec: Value, pull: Option<Vec<u8>>) -> Result<(PluginEntry, Selection), String> {
    let x = extract(Some(&spec))?;
    let sel = select(
        ns,
        "istio-system",
        x.match_labels.as_ref(),
        &pods(),
        "Kubernetes",
    );
    entry(ns, "p", &x, &sel, pull).map(|e| (e, sel))
}

#[test]
fn a_namespace_resource_selects_its_namespace_and_the_nodes_of_its_pods() {
    let sel = select("shop", "istio-system", None, &pods(), "Kubernetes");
    assert_eq!(sel.namespaces, ["shop"]);
    assert!(sel.workloads.is_empty());
    assert_eq!(sel.nodes, nodes(&["node-a", "node-b"]));
}

#[test]
fn match_labels_resolve_to_workload_uids_of_the_namespace_only() {
    let sel = select(
        "shop",
        "istio-system",
        Some(&labels("web")),
        &pods(),
        "Kubernetes",
    );
    assert_eq!(sel.namespaces, ["shop"]);
    // Sorted, the unscheduled pod included (it will run somewhere), blog's web-1 not.
    assert_eq!(
        sel.workloads,
        ["Kubernetes//Pod/shop/web-1", "Kubernetes//Pod/shop/web-2"]
    );
    assert_eq!(sel.nodes, nodes(&["node-a"]));
}

#[test]
fn the_root_namespace_is_mesh_wide_and_with_labels_selects_in_every_namespace() {
    let all = select("istio-system", "istio-system", None, &pods(), "c1");
    assert!(all.namespaces.is_empty() && all.workloads.is_empty());
    assert_eq!(all.nodes, None, "every node");
    let web = select(
        "istio-system",
        "istio-system",
        Some(&labels("web")),
        &pods(),
        "c1",
    );
    assert!(web.namespaces.is_empty());
    assert_eq!(
        web.workloads,
        [
            "c1//Pod/blog/web-1",
            "c1//Pod/shop/web-1",
            "c1//Pod/shop/web-2"
        ]
    );
    assert_eq!(web.nodes, nodes(&["node-a", "node-c"]));
}

#[test]
fn a_selector_matching_no_pod_is_sent_to_no_node() {
    let sel = select(
        "shop",
        "istio-system",
        Some(&labels("none")),
        &pods(),
        "Kubernetes",
    );
    assert!(sel.workloads.is_empty());
    assert_eq!(sel.nodes, nodes(&[]));
    let (e, _) = build(
        "shop",
        json!({"url": "oci://r.example/p:v1", "selector": {"matchLabels": {"app": "none"}}}),
        None,
    )
    .unwrap();
    let placement = e.placement.unwrap();
    assert!(placement.0.is_empty(), "{placement:?}");
}

#[test]
fn the_resource_becomes_the_model_with_wasmplugin_priority_and_default_scheme() {
    let (e, _) = build(
        "shop",
        json!({
            "url": "r.example/plugins/allow:v1",
            "sha256": SHA,
            "priority": 10,
            "pluginConfig": {"ports": [8080]},
            "failStrategy": "FAIL_OPEN",
            "selector": {"matchLabels": {"app": "web"}},
            "imagePullPolicy": "Always",
        }),
        Some(b"{\"auths\":{}}".to_vec()),
    )
    .unwrap();
    assert_eq!(e.current.name, "shop.p");
    assert_eq!(e.info.url, "oci://r.example/plugins/allow:v1");
    assert_eq!(e.info.sha256.as_deref(), Some(SHA));
    assert_eq!(e.info.file, "weftplugins/shop/p");
    let m = message(&e);
    // WasmPlugin's 10 (runs before 0) is the model's -10 (lower first).
    assert_eq!(m.priority, -10, "{m:?}");
    let sel = m.selector.clone().unwrap();
    assert_eq!(sel.namespaces, ["shop"]);
    assert_eq!(
        sel.workloads,
        ["Kubernetes//Pod/shop/web-1", "Kubernetes//Pod/shop/web-2"]
    );
    let text = format!("{m:?}");
    assert!(
        text.contains("ISTIO_META_WASM_IMAGE_PULL_SECRET"),
        "the pull secret travels: {text}"
    );
}

#[test]
fn a_shadow_takes_the_default_scheme_and_travels_with_the_serving_version() {
    let (e, _) = build(
        "shop",
        json!({"url": "r.example/p:v1", "shadow": {"url": "r.example/p:v2", "pluginConfig": {"ports": []}}}),
        None,
    )
    .unwrap();
    let text = format!("{:?}", message(&e));
    assert!(text.contains("oci://r.example/p:v2"), "{text}");
}

#[test]
fn the_same_resource_gives_the_same_version_every_time() {
    let spec = json!({"url": "oci://r.example/p:v1", "pluginConfig": {"b": 1, "a": [2, 3]}, "selector": {"matchLabels": {"app": "web"}}});
    let one = build("shop", spec.clone(), Some(b"x".to_vec())).unwrap().0;
    let two = build("shop", spec, Some(b"x".to_vec())).unwrap().0;
    assert_eq!(one.current.version, two.current.version);
    let other = build(
        "shop",
        json!({"url": "oci://r.example/p:v1", "pluginConfig": {"b": 2}}),
        None,
    )
    .unwrap()
    .0;
    assert_ne!(one.current.version, other.current.version);
}

#[test]
fn refusals_name_the_field() {
    let cases = [
        (json!({"url": "file:///etc/passwd"}), "spec.url"),
        (json!({"url": "http://r.example/p.wasm"}), "http://"),
        (
            json!({"url": "https://r.example/p.wasm"}),
            "spec.sha256: required for https://",
        ),
        (
            json!({"url": "oci://r/p:v1", "selector": {"namespaces": ["x"]}}),
            "spec.selector.namespaces",
        ),
        (
            json!({"url": "oci://r/p:v1", "selector": {"matchLabels": {"app": 1}}}),
            "spec.selector.matchLabels.app",
        ),
        (
            json!({"url": "oci://r/p:v1", "imagePullPolicy": "Sometimes"}),
            "spec.imagePullPolicy",
        ),
        (
            json!({"url": "oci://r/p:v1", "priority": 1u64 << 40}),
            "spec.priority",
        ),
        (
            json!({"url": "oci://r/p:v1", "rollout": {"window": "soon"}}),
            "spec.rollout.window",
        ),
        (
            json!({"url": "oci://r/p:v1", "failStrategy": "FAIL_MAYBE"}),
            "spec.failStrategy",
        ),
        (
            json!({"url": "oci://r/p:v1", "directions": []}),
            "spec.directions",
        ),
        (json!({"url": "oci://r/p:v1", "surprise": true}), "surprise"),
        (
            json!({"url": "oci://r/p:v1", "sha256": "abc"}),
            "spec.sha256",
        ),
    ];
    for (spec, want) in cases {
        let err = build("shop", spec.clone(), None)
            .err()
            .unwrap_or_else(|| panic!("{spec} accepted"));
        assert!(err.contains(want), "{spec}: {err:?} does not name {want:?}");
    }
    assert!(extract(None).unwrap_err().contains("spec"));
}

#[test]
fn stages_become_the_plan_of_the_entry() {
    let (e, _) = build(
        "shop",
        json!({
            "url": "registry.example/p:v1",
            "rollout": {"stages": [{"nodes": 1, "bake": "1m", "shadowFirst": true}, {"percent": 100, "bake": "1m"}],
                        "abortWhen": {"divergenceRatio": 0.01}},
        }),
        None,
    )
    .unwrap();
    let plan = e.plan.unwrap();
    assert_eq!(plan.stages.len(), 2);
    assert_eq!(plan.abort_when.divergence_ratio, Some(0.01));
}
