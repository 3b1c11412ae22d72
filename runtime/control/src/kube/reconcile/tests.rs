//! Tests of one reconciliation pass: a refused resource is refused alone and keeps its last accepted spec; a
//! resource deleted and created again does not inherit it; pull Secrets that cannot be read refuse the resource.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::json;

use super::*;
use crate::kube::watch::weftplugin_resource;

fn opts() -> KubeOptions {
    KubeOptions {
        api: "http://127.0.0.1:1".into(),
        ca_file: None,
        token_file: None,
        root_namespace: "istio-system".into(),
        cluster_id: "Kubernetes".into(),
        namespace: "weft-system".into(),
        replica: "r1".into(),
        lease_duration: Duration::from_secs(15),
        retry_period: Duration::from_secs(2),
    }
}

fn object(
    ns: &str,
    name: &str,
    uid: &str,
    generation: i64,
    spec: serde_json::Value,
) -> DynamicObject {
    let mut o = DynamicObject::new(name, &weftplugin_resource()).within(ns);
    o.metadata.uid = Some(uid.into());
    o.metadata.generation = Some(generation);
    o.data = json!({"spec": spec});
    o
}

fn pods() -> ByName<PodInfo> {
    BTreeMap::from([(
        ("shop".to_owned(), "web-1".to_owned()),
        PodInfo {
            labels: BTreeMap::from([("app".to_owned(), "web".to_owned())]),
            node: Some("node-a".into()),
        },
    )])
}

fn plugins(objects: Vec<DynamicObject>) -> ByName<DynamicObject> {
    objects
        .into_iter()
        .map(|o| ((o.namespace().unwrap(), o.name_any()), o))
        .collect()
}

#[test]
fn a_refused_edit_keeps_the_last_accepted_spec_and_refuses_alone() {
    let mut last_good = LastGood::new();
    let good = object(
        "shop",
        "allow",
        "u1",
        1,
        json!({"url": "oci://r/p:v1", "pluginConfig": {"ports": [80]}}),
    );
    let other = object("blog", "allow", "u2", 1, json!({"url": "oci://r/p:v1"}));
    let (set, states) = reconcile(
        &opts(),
        &plugins(vec![good, other.clone()]),
        &pods(),
        &Secrets::new(),
        &mut last_good,
    );
    let v1 = set["shop.allow"].current.version.clone();
    assert!(states.values().all(|s| s.refused.is_none()), "{states:?}");

    // The edit is bad: refused with its field, v1 keeps serving, blog's is untouched.
    let bad = object(
        "shop",
        "allow",
        "u1",
        2,
        json!({"url": "oci://r/p:v1", "rollout": {"window": "soon"}}),
    );
    let (set, states) = reconcile(
        &opts(),
        &plugins(vec![bad, other]),
        &pods(),
        &Secrets::new(),
        &mut last_good,
    );
    let shop = &states[&("shop".to_owned(), "allow".to_owned())];
    assert!(
        shop.refused
            .as_ref()
            .unwrap()
            .contains("spec.rollout.window"),
        "{shop:?}"
    );
    assert_eq!(shop.generation, 2);
    assert_eq!(shop.serving.as_ref().unwrap().version, v1);
    assert_eq!(set["shop.allow"].current.version, v1);
    assert!(set.contains_key("blog.allow"));
    assert!(
        states[&("blog".to_owned(), "allow".to_owned())]
            .refused
            .is_none()
    );
}

#[test]
fn a_resource_created_again_does_not_inherit_the_deleted_ones_spec() {
    let mut last_good = LastGood::new();
    let good = object("shop", "allow", "u1", 1, json!({"url": "oci://r/p:v1"}));
    reconcile(
        &opts(),
        &plugins(vec![good]),
        &pods(),
        &Secrets::new(),
        &mut last_good,
    );
    // Deleted, then created again (a new uid) with a bad spec: nothing is served for it.
    reconcile(
        &opts(),
        &plugins(vec![]),
        &pods(),
        &Secrets::new(),
        &mut last_good,
    );
    assert!(last_good.is_empty());
    let bad = object("shop", "allow", "u9", 1, json!({"url": "file:///x.wasm"}));
    let (set, states) = reconcile(
        &opts(),
        &plugins(vec![bad]),
        &pods(),
        &Secrets::new(),
        &mut last_good,
    );
    assert!(set.is_empty());
    let s = &states[&("shop".to_owned(), "allow".to_owned())];
    assert!(s.serving.is_none() && s.refused.is_some(), "{s:?}");
}

#[test]
fn a_pull_secret_that_cannot_be_read_refuses_the_resource_with_the_reason() {
    let mut last_good = LastGood::new();
    let o = object(
        "shop",
        "allow",
        "u1",
        1,
        json!({"url": "oci://r/p:v1", "imagePullSecret": "regcred"}),
    );
    let secrets = Secrets::from([(
        ("shop".to_owned(), "regcred".to_owned()),
        Err("spec.imagePullSecret: Secret shop/regcred not found".to_owned()),
    )]);
    let (set, states) = reconcile(
        &opts(),
        &plugins(vec![o.clone()]),
        &pods(),
        &secrets,
        &mut last_good,
    );
    assert!(set.is_empty());
    let s = &states[&("shop".to_owned(), "allow".to_owned())];
    assert!(s.refused.as_ref().unwrap().contains("not found"), "{s:?}");
    // Once it exists, the resource is served with it.
    let ok = Secrets::from([(
        ("shop".to_owned(), "regcred".to_owned()),
        Ok(b"{\"auths\":{}}".to_vec()),
    )]);
    let (set, _) = reconcile(&opts(), &plugins(vec![o]), &pods(), &ok, &mut last_good);
    assert_eq!(set["shop.allow"].placement.as_ref().unwrap().0, ["node-a"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pull_secrets_are_read_once_not_on_every_pass() {
    let api = weft_kubeapi::ApiServer::start().await.unwrap();
    let mut o = opts();
    o.api = api.url();
    let client = crate::kube::client::build(&o).unwrap();
    let key = ("shop".to_owned(), "regcred".to_owned());
    let mut cache = SecretCache::default();
    let got = cache.refresh(&client, BTreeSet::from([key.clone()])).await;
    assert!(
        got[&key].as_ref().unwrap_err().contains("not found"),
        "{got:?}"
    );
    assert!(cache.has_failures());
    api.apply(json!({
        "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/dockerconfigjson",
        "metadata": {"namespace": "shop", "name": "regcred"},
        "stringData": {".dockerconfigjson": "{\"auths\":{}}"},
    }))
    .unwrap();
    let gets = api.requests("get");
    // Passes within the retry interval read nothing (a pod event must not cost a GET per Secret).
    for _ in 0..3 {
        cache.refresh(&client, BTreeSet::from([key.clone()])).await;
    }
    assert_eq!(api.requests("get"), gets);
    // A Secret no resource names any more is forgotten; named again, it is read (and now found).
    assert!(cache.refresh(&client, BTreeSet::new()).await.is_empty());
    let got = cache.refresh(&client, BTreeSet::from([key.clone()])).await;
    assert_eq!(got[&key].as_ref().unwrap(), b"{\"auths\":{}}");
    assert_eq!(api.requests("get"), gets + 1);
    assert!(!cache.has_failures());
}
