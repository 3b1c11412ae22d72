//! The stand-in against the API-server responses shown in the Kubernetes documentation (`tests/fixtures/`, written
//! by hand from those pages, each file naming its page; not recorded from a live server): its lists, chunked lists,
//! watch events, bookmarks and Status errors have the same shape (keys, kinds, value types, codes, reasons) as the
//! documented ones. The documented examples are of Pods, so the stand-in's Pods are also held to their kinds,
//! `apiVersion` and, for the NotFound Status, every value.
#![allow(clippy::unwrap_used)] // a test panics to fail

use std::time::Duration;

use serde_json::{Value, json};
use weft_kubeapi::{ApiServer, Resource};

const PLUGINS: &str = "/apis/weft.dev/v1alpha1/namespaces/test/weftplugins";

fn fixture(name: &str) -> Value {
    let path = format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert!(
        v["source"].as_str().unwrap().starts_with("https://"),
        "{name} cites its source"
    );
    v
}

/// A value's shape: objects keep their keys, scalars become their type's name, arrays become "array".
fn shape(v: &Value) -> Value {
    match v {
        Value::Object(map) => {
            Value::Object(map.iter().map(|(k, v)| (k.clone(), shape(v))).collect())
        }
        Value::Array(_) => json!("array"),
        Value::String(_) => json!("string"),
        Value::Number(_) => json!("number"),
        Value::Bool(_) => json!("bool"),
        Value::Null => json!("null"),
    }
}

fn plugin(name: &str) -> Value {
    json!({
        "apiVersion": "weft.dev/v1alpha1",
        "kind": "WeftPlugin",
        "metadata": {"name": name, "namespace": "test"},
        "spec": {"url": format!("oci://registry.example/{name}:1")},
    })
}

async fn next(watch: &mut weft_kubeapi::WatchStream) -> Value {
    tokio::time::timeout(Duration::from_secs(5), watch.next())
        .await
        .expect("a watch event within 5 s")
        .unwrap()
        .expect("the watch is still open")
}

#[tokio::test]
async fn list_has_the_recorded_shape() {
    let server = ApiServer::start().await.unwrap();
    server.apply(plugin("a")).unwrap();
    let want = fixture("list.json");
    let got = server.client().get(PLUGINS).await.unwrap();
    assert_eq!(got.code, want["code"]);
    assert_eq!(shape(&got.body), shape(&want["response"]));
    assert_eq!(got.body["kind"], "WeftPluginList");
    assert_eq!(got.headers["content-type"], "application/json");
}

#[tokio::test]
async fn chunked_list_has_the_recorded_shape() {
    let server = ApiServer::start().await.unwrap();
    for name in ["a", "b", "c"] {
        server.apply(plugin(name)).unwrap();
    }
    let want = fixture("chunked_list.json");
    let got = server
        .client()
        .get(&format!("{PLUGINS}?limit=2"))
        .await
        .unwrap();
    assert_eq!(got.code, want["code"]);
    assert_eq!(shape(&got.body), shape(&want["response"]));
    assert_eq!(got.body["metadata"]["remainingItemCount"], 1);
}

/// Checks a watch response's code and headers against a recorded one.
fn same_head(watch: &weft_kubeapi::WatchStream, want: &Value) {
    assert_eq!(watch.code, want["code"]);
    for (name, value) in want["headers"].as_object().unwrap() {
        assert_eq!(
            watch.headers[name.as_str()],
            value.as_str().unwrap(),
            "{name}"
        );
    }
}

/// An ADDED or MODIFIED event: `type` and `object`, the object with the recorded fields (the docs elide the rest).
fn same_event(got: &Value, want: &Value) {
    assert_eq!(got.as_object().unwrap().len(), 2, "{got}");
    assert_eq!(got["type"], want["type"]);
    for field in ["kind", "apiVersion"] {
        assert_eq!(
            shape(&got["object"][field]),
            shape(&want["object"][field]),
            "{field}"
        );
    }
    assert!(
        got["object"]["metadata"]["resourceVersion"].is_string(),
        "{got}"
    );
}

#[tokio::test]
async fn watch_events_have_the_recorded_shape() {
    let server = ApiServer::start().await.unwrap();
    let want = fixture("watch.json");
    let from = server.resource_version();
    server.apply(plugin("a")).unwrap();
    let mut edited = plugin("a");
    edited["spec"]["url"] = json!("oci://registry.example/a:2");
    server.apply(edited).unwrap();
    let mut watch = server
        .client()
        .watch(&format!("{PLUGINS}?watch=1&resourceVersion={from}"))
        .await
        .unwrap();
    same_head(&watch, &want);
    for want_event in want["events"].as_array().unwrap() {
        same_event(&next(&mut watch).await, want_event);
    }
}

#[tokio::test]
async fn bookmarks_have_the_recorded_shape() {
    let server = ApiServer::start().await.unwrap();
    let want = fixture("bookmark.json");
    let from = server.resource_version();
    server.apply(plugin("a")).unwrap();
    let mut watch = server
        .client()
        .watch(&format!(
            "{PLUGINS}?watch=1&resourceVersion={from}&allowWatchBookmarks=true"
        ))
        .await
        .unwrap();
    same_head(&watch, &want);
    let events = want["events"].as_array().unwrap();
    same_event(&next(&mut watch).await, &events[0]);
    server.bookmark();
    let bookmark = next(&mut watch).await;
    // A bookmark carries nothing but the kind and the resourceVersion.
    assert_eq!(shape(&bookmark), shape(&events[1]));
    assert_eq!(bookmark["object"]["kind"], "WeftPlugin");
    assert_eq!(
        bookmark["object"]["metadata"]["resourceVersion"],
        server.resource_version()
    );
}

/// The recorded Status's keys, without `details` (which the API server omits when empty).
fn status_keys(status: &Value, with_details: bool) -> Vec<String> {
    let mut keys: Vec<String> = status.as_object().unwrap().keys().cloned().collect();
    if !with_details {
        keys.retain(|k| k != "details");
    }
    keys.sort();
    keys
}

fn same_status(got: &Value, want: &Value, code: u16, reason: &str, with_details: bool) {
    assert_eq!(
        status_keys(got, true),
        status_keys(want, with_details),
        "{got}"
    );
    assert_eq!(got["kind"], "Status");
    assert_eq!(got["apiVersion"], "v1");
    assert_eq!(got["status"], "Failure");
    assert_eq!(got["code"], code);
    assert_eq!(got["reason"], reason);
    assert!(got["message"].is_string());
    if with_details {
        // The recorded one is of the core group, whose empty `group` the API server omits.
        let mut details = got["details"].clone();
        details.as_object_mut().unwrap().remove("group");
        assert_eq!(shape(&details), shape(&want["details"]));
    }
}

#[tokio::test]
async fn errors_are_statuses_of_the_recorded_shape() {
    let server = ApiServer::start().await.unwrap();
    let client = server.client();
    let want = fixture("not_found.json");

    let missing = client.get(&format!("{PLUGINS}/grafana")).await.unwrap();
    assert_eq!(missing.code, want["code"]);
    assert_eq!(shape(&missing.body), {
        let mut s = shape(&want["response"]);
        s["details"]["group"] = json!("string");
        s
    });
    assert_eq!(
        missing.body["message"],
        "weftplugins.weft.dev \"grafana\" not found"
    );
    same_status(&missing.body, &want["response"], 404, "NotFound", true);

    let created = client.post(PLUGINS, &plugin("a")).await.unwrap();
    assert_eq!(created.code, 201);
    let again = client.post(PLUGINS, &plugin("a")).await.unwrap();
    assert_eq!(again.code, 409);
    same_status(&again.body, &want["response"], 409, "AlreadyExists", true);

    let mut stale = created.body.clone();
    stale["spec"]["url"] = json!("oci://registry.example/a:2");
    server.apply(plugin("b")).unwrap();
    let mut fresh = created.body.clone();
    fresh["spec"]["url"] = json!("oci://registry.example/a:3");
    assert_eq!(
        client
            .put(&format!("{PLUGINS}/a"), &fresh)
            .await
            .unwrap()
            .code,
        200
    );
    let conflict = client.put(&format!("{PLUGINS}/a"), &stale).await.unwrap();
    assert_eq!(conflict.code, 409);
    same_status(&conflict.body, &want["response"], 409, "Conflict", true);

    let first = client.get(&format!("{PLUGINS}?limit=1")).await.unwrap();
    let token = first.body["metadata"]["continue"]
        .as_str()
        .unwrap()
        .to_owned();
    server.apply(plugin("c")).unwrap();
    server.compact();
    let gone = client
        .get(&format!("{PLUGINS}?limit=1&continue={token}"))
        .await
        .unwrap();
    assert_eq!(gone.code, 410);
    same_status(&gone.body, &want["response"], 410, "Expired", false);
    assert!(server.get(Resource::WeftPlugin, "test", "a").is_some());
}

/// The fixtures are of Pods: the stand-in's Pods answer with the recorded kinds and `apiVersion` themselves, not just
/// their shapes.
fn pod(name: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "test"},
        "spec": {"containers": [{"name": "app", "image": "registry.example/app:1"}]},
    })
}

#[tokio::test]
async fn pod_lists_are_the_recorded_ones() {
    let server = ApiServer::start().await.unwrap();
    server.apply(pod("a")).unwrap();
    server.apply(pod("b")).unwrap();
    let client = server.client();

    let want = fixture("list.json");
    let got = client.get(&Resource::Pod.collection("test")).await.unwrap();
    assert_eq!(got.code, want["code"]);
    assert_eq!(shape(&got.body), shape(&want["response"]));
    assert_eq!(got.body["kind"], want["response"]["kind"]);
    assert_eq!(got.body["apiVersion"], want["response"]["apiVersion"]);
    assert_eq!(got.body["items"][0]["kind"], "Pod");
    assert_eq!(got.body["items"][0]["status"]["phase"], "Pending");

    // The chunked one is cluster-wide, as recorded (`GET /api/v1/pods?limit=500`, here a limit of 1).
    let want = fixture("chunked_list.json");
    let got = client.get("/api/v1/pods?limit=1").await.unwrap();
    assert_eq!(got.code, want["code"]);
    assert_eq!(shape(&got.body), shape(&want["response"]));
    assert_eq!(got.body["kind"], "PodList");
    assert_eq!(got.body["apiVersion"], "v1");
    assert_eq!(got.body["metadata"]["remainingItemCount"], 1);
}

#[tokio::test]
async fn pod_watch_events_and_bookmarks_are_the_recorded_ones() {
    let server = ApiServer::start().await.unwrap();
    let from = server.resource_version();
    server.apply(pod("a")).unwrap();
    let mut edited = pod("a");
    edited["metadata"]["labels"] = json!({"app": "web"});
    server.apply(edited).unwrap();
    let want = fixture("watch.json");
    let mut watch = server
        .client()
        .watch(&format!(
            "{}?watch=1&resourceVersion={from}&allowWatchBookmarks=true",
            Resource::Pod.collection("test")
        ))
        .await
        .unwrap();
    same_head(&watch, &want);
    for want_event in want["events"].as_array().unwrap() {
        let got = next(&mut watch).await;
        same_event(&got, want_event);
        assert_eq!(got["object"]["kind"], want_event["object"]["kind"]);
        assert_eq!(
            got["object"]["apiVersion"],
            want_event["object"]["apiVersion"]
        );
    }
    let want = fixture("bookmark.json");
    server.bookmark();
    let bookmark = next(&mut watch).await;
    let recorded = &want["events"][1];
    assert_eq!(shape(&bookmark), shape(recorded));
    assert_eq!(bookmark["object"]["kind"], recorded["object"]["kind"]);
    assert_eq!(
        bookmark["object"]["apiVersion"],
        recorded["object"]["apiVersion"]
    );
}

#[tokio::test]
async fn a_missing_pod_is_the_recorded_status() {
    let server = ApiServer::start().await.unwrap();
    let want = fixture("not_found.json");
    let got = server
        .client()
        .get(&format!("{}/grafana", Resource::Pod.collection("default")))
        .await
        .unwrap();
    assert_eq!(got.code, want["code"]);
    // The core group's Status is the recorded one, field for field.
    assert_eq!(got.body, want["response"]);
}
