//! The stand-in with kube-rs as its client, as `weft-control` will use it: typed `Api`s for Pods, Secrets,
//! ConfigMaps and Leases, a `DynamicObject` `Api` for WeftPlugins, and `kube::runtime::watcher` listing then
//! watching, relisting after a 410 without losing an update.
#![allow(clippy::unwrap_used)] // a test panics to fail

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::time::Duration;

use futures_util::stream::{BoxStream, StreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch,
    PatchParams, PostParams,
};
use kube::runtime::watcher::{self, Event};
use kube::{Client, Config, ResourceExt};
use serde_json::{Value, json};
use weft_kubeapi::{ApiServer, Resource};

fn client(server: &ApiServer) -> Client {
    Client::try_from(Config::new(server.url().parse().unwrap())).unwrap()
}

fn pod(ns: &str, name: &str, labels: Value) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": labels},
        "spec": {"containers": [{"name": "app", "image": "registry.example/app:1"}]},
    }))
    .unwrap()
}

fn plugin_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("weft.dev", "v1alpha1", "WeftPlugin"),
        "weftplugins",
    )
}

fn plugin(ns: &str, name: &str, tag: u32) -> Value {
    json!({
        "apiVersion": "weft.dev/v1alpha1",
        "kind": "WeftPlugin",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"url": format!("oci://registry.example/{name}:{tag}")},
    })
}

fn rv<K: ResourceExt>(obj: &K) -> u64 {
    obj.resource_version().unwrap().parse().unwrap()
}

/// The API error a request failed with: its code and reason.
fn api_error<T: Debug>(result: Result<T, kube::Error>) -> (u16, String) {
    match result {
        Err(kube::Error::Api(status)) => (status.code, status.reason.clone()),
        other => panic!("expected an API error, got {other:?}"),
    }
}

type Events<K> = BoxStream<'static, watcher::Result<Event<K>>>;

/// The watcher's next item, within 10 s.
async fn next<K>(events: &mut Events<K>) -> watcher::Result<Event<K>> {
    tokio::time::timeout(Duration::from_secs(10), events.next())
        .await
        .expect("a watcher event within 10 s")
        .expect("the watcher goes on")
}

/// An event as `(kind, name)`: `Init`, `InitApply`, `InitDone`, `Apply`, `Delete`.
fn describe<K: ResourceExt>(event: &Event<K>) -> (&'static str, String) {
    match event {
        Event::Init => ("Init", String::new()),
        Event::InitApply(o) => ("InitApply", o.name_any()),
        Event::InitDone => ("InitDone", String::new()),
        Event::Apply(o) => ("Apply", o.name_any()),
        Event::Delete(o) => ("Delete", o.name_any()),
    }
}

/// The next event, which must not be an error.
async fn next_ok<K: Debug>(events: &mut Events<K>) -> Event<K> {
    next(events).await.unwrap()
}

/// Reads one initial list: `Init`, the `InitApply`s (returned), `InitDone`.
async fn initial_list<K: ResourceExt + Debug>(events: &mut Events<K>) -> Vec<K> {
    let first = next_ok(events).await;
    assert!(matches!(first, Event::Init), "{first:?}");
    let mut objects = Vec::new();
    loop {
        match next_ok(events).await {
            Event::InitApply(o) => objects.push(o),
            Event::InitDone => return objects,
            other => panic!("expected InitApply or InitDone, got {other:?}"),
        }
    }
}

fn pair(kind: &'static str, name: &str) -> (&'static str, String) {
    (kind, name.to_owned())
}

#[tokio::test]
async fn pods_are_created_listed_got_and_their_status_patched() {
    let server = ApiServer::start().await.unwrap();
    let client = client(&server);
    let web: Api<Pod> = Api::namespaced(client.clone(), "web");
    let created = web
        .create(
            &PostParams::default(),
            &pod("web", "a", json!({"app": "web"})),
        )
        .await
        .unwrap();
    assert_eq!(created.namespace().as_deref(), Some("web"));
    assert_eq!(created.uid().unwrap().len(), 36);
    assert_eq!(created.metadata.generation, None);
    assert_eq!(
        created.status.as_ref().unwrap().phase.as_deref(),
        Some("Pending")
    );
    let again = web
        .create(&PostParams::default(), &pod("web", "a", json!({})))
        .await;
    assert_eq!(api_error(again), (409, "AlreadyExists".to_owned()));
    web.create(
        &PostParams::default(),
        &pod("web", "b", json!({"app": "web", "tier": "db"})),
    )
    .await
    .unwrap();
    Api::<Pod>::namespaced(client.clone(), "other")
        .create(
            &PostParams::default(),
            &pod("other", "c", json!({"app": "batch"})),
        )
        .await
        .unwrap();

    let got = web.get("a").await.unwrap();
    assert_eq!(got.metadata.uid, created.metadata.uid);
    assert_eq!(
        got.spec.unwrap().containers[0].image.as_deref(),
        Some("registry.example/app:1")
    );
    let names = |list: kube::core::ObjectList<Pod>| -> Vec<String> {
        list.items.iter().map(ResourceExt::name_any).collect()
    };
    let in_web = web.list(&ListParams::default()).await.unwrap();
    assert_eq!(
        in_web.metadata.resource_version,
        Some(server.resource_version())
    );
    assert_eq!(names(in_web), ["a", "b"]);
    let all: Api<Pod> = Api::all(client.clone());
    assert_eq!(
        names(all.list(&ListParams::default()).await.unwrap()),
        ["c", "a", "b"]
    );
    // Label selectors, as kube-rs encodes them.
    let labels = |s: &str| ListParams::default().labels(s);
    assert_eq!(
        names(all.list(&labels("app=web")).await.unwrap()),
        ["a", "b"]
    );
    assert_eq!(
        names(all.list(&labels("app==web,tier!=db")).await.unwrap()),
        ["a"]
    );
    assert_eq!(names(all.list(&labels("tier")).await.unwrap()), ["b"]);
    assert_eq!(
        names(all.list(&labels("!tier,app")).await.unwrap()),
        ["c", "a"]
    );
    assert_eq!(
        api_error(all.list(&labels("app in (web)")).await),
        (400, "BadRequest".to_owned())
    );
    // Pages of one, through continue tokens.
    let first = all.list(&ListParams::default().limit(1)).await.unwrap();
    let token = first.metadata.continue_.clone().unwrap();
    assert_eq!(first.metadata.remaining_item_count, Some(2));
    let second = all
        .list(&ListParams::default().limit(1).continue_token(&token))
        .await
        .unwrap();
    assert_eq!(names(second), ["a"]);

    // The status subresource: status changes, the spec and labels do not.
    let patched = web
        .patch_status(
            "a",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"status": {"phase": "Running"}, "metadata": {"labels": {"x": "y"}}}),
            ),
        )
        .await
        .unwrap();
    assert_eq!(
        patched.status.as_ref().unwrap().phase.as_deref(),
        Some("Running")
    );
    assert_eq!(patched.labels().get("x"), None);
    assert!(rv(&patched) > rv(&created));
    // The main resource leaves the status alone.
    let relabeled = web
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"labels": {"x": "y"}}, "status": {"phase": "Failed"}}),
            ),
        )
        .await
        .unwrap();
    assert_eq!(relabeled.labels()["x"], "y");
    assert_eq!(relabeled.status.unwrap().phase.as_deref(), Some("Running"));

    // A Pod's delete answers with the Pod.
    let deleted = web.delete("a", &DeleteParams::default()).await.unwrap();
    let last = deleted.left().expect("the deleted Pod");
    assert_eq!(last.name_any(), "a");
    assert_eq!(api_error(web.get("a").await), (404, "NotFound".to_owned()));
    assert!(server.get(Resource::Pod, "web", "a").is_none());
}

#[tokio::test]
async fn a_pod_watcher_sees_the_list_then_every_change() {
    let server = ApiServer::start().await.unwrap();
    let client = client(&server);
    server
        .apply(serde_json::to_value(pod("web", "a", json!({"app": "web"}))).unwrap())
        .unwrap();
    server
        .apply(serde_json::to_value(pod("other", "b", json!({"app": "batch"}))).unwrap())
        .unwrap();
    let all: Api<Pod> = Api::all(client.clone());
    let mut events: Events<Pod> = watcher::watcher(all, watcher::Config::default()).boxed();
    let initial = initial_list(&mut events).await;
    let names: Vec<String> = initial.iter().map(ResourceExt::name_any).collect();
    assert_eq!(names, ["b", "a"]);

    let web: Api<Pod> = Api::namespaced(client.clone(), "web");
    web.create(&PostParams::default(), &pod("web", "c", json!({})))
        .await
        .unwrap();
    assert_eq!(describe(&next_ok(&mut events).await), pair("Apply", "c"));
    let mut c = web.get("c").await.unwrap();
    c.labels_mut().insert("app".into(), "web".into());
    let replaced = web.replace("c", &PostParams::default(), &c).await.unwrap();
    match next_ok(&mut events).await {
        Event::Apply(p) => {
            assert_eq!(p.labels()["app"], "web");
            assert_eq!(p.resource_version(), replaced.resource_version());
        }
        other => panic!("expected Apply, got {other:?}"),
    }
    server.delete(Resource::Pod, "other", "b").unwrap();
    assert_eq!(describe(&next_ok(&mut events).await), pair("Delete", "b"));

    // A watcher with a label selector: its list and its events are of matching Pods only.
    let mut selected: Events<Pod> = watcher::watcher(
        Api::<Pod>::all(client.clone()),
        watcher::Config::default().labels("app=web"),
    )
    .boxed();
    let initial = initial_list(&mut selected).await;
    let names: Vec<String> = initial.iter().map(ResourceExt::name_any).collect();
    assert_eq!(names, ["a", "c"]);
    web.create(&PostParams::default(), &pod("web", "unlabeled", json!({})))
        .await
        .unwrap();
    web.create(
        &PostParams::default(),
        &pod("web", "d", json!({"app": "web"})),
    )
    .await
    .unwrap();
    // The unlabeled Pod's ADDED went to the first watcher only.
    assert_eq!(describe(&next_ok(&mut selected).await), pair("Apply", "d"));
    assert_eq!(
        describe(&next_ok(&mut events).await),
        pair("Apply", "unlabeled")
    );
    assert_eq!(describe(&next_ok(&mut events).await), pair("Apply", "d"));
    // kube-rs lists pages of 500, then watches with a timeout and bookmarks: two lists, two watches.
    assert_eq!(server.requests("list"), 2);
    assert_eq!(server.requests("watch"), 2);
}

#[tokio::test]
async fn a_weftplugin_watcher_relists_after_410_and_loses_no_update() {
    let server = ApiServer::start().await.unwrap();
    let client = client(&server);
    let ar = plugin_resource();
    server.apply(plugin("ns1", "a", 1)).unwrap();
    server.apply(plugin("ns2", "b", 1)).unwrap();
    let all: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
    let mut events: Events<DynamicObject> =
        watcher::watcher(all, watcher::Config::default()).boxed();
    let names: Vec<String> = initial_list(&mut events)
        .await
        .iter()
        .map(ResourceExt::name_any)
        .collect();
    assert_eq!(names, ["a", "b"]);

    let ns1: Api<DynamicObject> = Api::namespaced_with(client.clone(), "ns1", &ar);
    let body: DynamicObject = serde_json::from_value(plugin("ns1", "c", 1)).unwrap();
    ns1.create(&PostParams::default(), &body).await.unwrap();
    assert_eq!(describe(&next_ok(&mut events).await), pair("Apply", "c"));
    server.apply(plugin("ns1", "c", 2)).unwrap();
    match next_ok(&mut events).await {
        Event::Apply(o) => assert_eq!(o.data["spec"]["url"], "oci://registry.example/c:2"),
        other => panic!("expected Apply, got {other:?}"),
    }
    ns1.delete("c", &DeleteParams::default()).await.unwrap();
    assert_eq!(describe(&next_ok(&mut events).await), pair("Delete", "c"));
    // A bookmark moves the watcher's resourceVersion on without an event of its own.
    server.bookmark();

    // The watch ends (as when the API server restarts); while it is down `a` changes, `b` goes, `d` comes, and
    // the history is compacted, so the watcher's resourceVersion is too old to resume from.
    server.close_watches();
    server.apply(plugin("ns1", "a", 2)).unwrap();
    server.delete(Resource::WeftPlugin, "ns2", "b").unwrap();
    server.apply(plugin("ns2", "d", 1)).unwrap();
    server.compact();
    match next(&mut events).await {
        Err(watcher::Error::WatchError(status)) => {
            assert_eq!(status.code, 410);
            assert_eq!(status.reason, "Expired");
        }
        other => panic!("expected the 410 ERROR event, got {other:?}"),
    }
    let relisted = initial_list(&mut events).await;
    let state: BTreeMap<String, Value> = relisted
        .iter()
        .map(|o| (o.name_any(), o.data["spec"]["url"].clone()))
        .collect();
    assert_eq!(
        state,
        BTreeMap::from([
            ("a".to_owned(), json!("oci://registry.example/a:2")),
            ("d".to_owned(), json!("oci://registry.example/d:1")),
        ])
    );
    // And it watches on from the relist.
    server.apply(plugin("ns2", "e", 1)).unwrap();
    assert_eq!(describe(&next_ok(&mut events).await), pair("Apply", "e"));
    assert_eq!(server.requests("list"), 2);
}

#[tokio::test]
async fn patch_status_of_a_weftplugin_changes_status_only() {
    let server = ApiServer::start().await.unwrap();
    let client = client(&server);
    let api: Api<DynamicObject> = Api::namespaced_with(client, "ns1", &plugin_resource());
    let body: DynamicObject = serde_json::from_value(plugin("ns1", "a", 1)).unwrap();
    let created = api.create(&PostParams::default(), &body).await.unwrap();
    assert_eq!(created.metadata.generation, Some(1));

    let patch = json!({
        "status": {"phase": "Ready", "readyNodes": 3},
        "spec": {"url": "oci://registry.example/ignored:9"},
    });
    let patched = api
        .patch_status("a", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    assert_eq!(
        patched.data["status"],
        json!({"phase": "Ready", "readyNodes": 3})
    );
    assert_eq!(patched.data["spec"], created.data["spec"]);
    assert_eq!(patched.metadata.generation, Some(1));
    assert!(rv(&patched) > rv(&created));
    let stored = server.get(Resource::WeftPlugin, "ns1", "a").unwrap();
    assert_eq!(stored["status"]["readyNodes"], 3);
    assert_eq!(
        stored["metadata"]["resourceVersion"],
        server.resource_version()
    );

    // A merge patch removes with null and keeps the rest; get_status reads it back.
    api.patch_status(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"readyNodes": null}})),
    )
    .await
    .unwrap();
    let status = api.get_status("a").await.unwrap();
    assert_eq!(status.data["status"], json!({"phase": "Ready"}));
    // A spec change through the main resource bumps the generation and keeps the status.
    let edited = api
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"url": "oci://registry.example/a:2"}})),
        )
        .await
        .unwrap();
    assert_eq!(edited.metadata.generation, Some(2));
    assert_eq!(edited.data["status"], json!({"phase": "Ready"}));
    assert_eq!(
        api_error(
            api.patch_status("missing", &PatchParams::default(), &Patch::Merge(&patch))
                .await
        ),
        (404, "NotFound".to_owned())
    );
    assert_eq!(server.requests("patch"), 4);
}

#[tokio::test]
async fn replacing_a_lease_from_a_stale_version_is_a_409_conflict() {
    let server = ApiServer::start().await.unwrap();
    let api: Api<Lease> = Api::namespaced(client(&server), "weft-system");
    let lease: Lease = serde_json::from_value(json!({
        "metadata": {"name": "weft-control"},
        "spec": {"holderIdentity": "a", "leaseDurationSeconds": 15},
    }))
    .unwrap();
    let created = api.create(&PostParams::default(), &lease).await.unwrap();
    let mut taken = created.clone();
    taken.spec.as_mut().unwrap().holder_identity = Some("b".into());
    let replaced = api
        .replace("weft-control", &PostParams::default(), &taken)
        .await
        .unwrap();
    assert!(rv(&replaced) > rv(&created));
    // The same write again carries the resourceVersion it read, now stale.
    taken.spec.as_mut().unwrap().holder_identity = Some("c".into());
    let stale = api
        .replace("weft-control", &PostParams::default(), &taken)
        .await;
    match stale {
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 409);
            assert_eq!(status.reason, "Conflict");
            assert!(status.message.contains("the object has been modified"));
        }
        other => panic!("expected a 409 Conflict, got {other:?}"),
    }
    let held = api.get("weft-control").await.unwrap();
    assert_eq!(held.spec.unwrap().holder_identity.as_deref(), Some("b"));
}

#[tokio::test]
async fn a_missing_secret_is_404_not_found_and_string_data_becomes_data() {
    let server = ApiServer::start().await.unwrap();
    let api: Api<Secret> = Api::namespaced(client(&server), "weft-system");
    match api.get("ca-key").await {
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 404);
            assert_eq!(status.reason, "NotFound");
            assert_eq!(status.message, "secrets \"ca-key\" not found");
            let details = status.details.unwrap();
            assert_eq!(details.name, "ca-key");
            assert_eq!(details.kind, "secrets");
            assert_eq!(details.group, "");
        }
        other => panic!("expected a 404 NotFound, got {other:?}"),
    }
    assert!(api.get_opt("ca-key").await.unwrap().is_none());

    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "ca-key"},
        "stringData": {"token": "s3cret"},
        "data": {"cert": "Y2VydA=="},
    }))
    .unwrap();
    api.create(&PostParams::default(), &secret).await.unwrap();
    let got = api.get("ca-key").await.unwrap();
    assert_eq!(got.type_.as_deref(), Some("Opaque"));
    assert!(got.string_data.is_none());
    let data = got.data.unwrap();
    assert_eq!(data["token"].0, b"s3cret");
    assert_eq!(data["cert"].0, b"cert");
    let raw = server
        .get(Resource::Secret, "weft-system", "ca-key")
        .unwrap();
    assert_eq!(raw["data"]["token"], "czNjcmV0");
    // A Secret's delete answers with a Success Status.
    let deleted = api
        .delete("ca-key", &DeleteParams::default())
        .await
        .unwrap();
    let status = deleted.right().expect("a Success Status");
    assert_eq!(status.details.unwrap().name, "ca-key");
}

#[tokio::test]
async fn configmaps_are_created_replaced_listed_and_watched() {
    let server = ApiServer::start().await.unwrap();
    let client = client(&server);
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "weft-system");
    let report = |name: &str, replica: &str, value: &str| -> ConfigMap {
        serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {"weft.dev/report": replica}},
            "data": {"state": value},
        }))
        .unwrap()
    };
    let mut events: Events<ConfigMap> = watcher::watcher(
        api.clone(),
        watcher::Config::default().labels("weft.dev/report"),
    )
    .boxed();
    assert!(initial_list(&mut events).await.is_empty());

    let created = api
        .create(
            &PostParams::default(),
            &report("replica-0", "0", "starting"),
        )
        .await
        .unwrap();
    assert_eq!(created.metadata.generation, None);
    assert_eq!(
        describe(&next_ok(&mut events).await),
        pair("Apply", "replica-0")
    );
    let mut next_report = created.clone();
    next_report
        .data
        .as_mut()
        .unwrap()
        .insert("state".into(), "ready".into());
    let replaced = api
        .replace("replica-0", &PostParams::default(), &next_report)
        .await
        .unwrap();
    assert_eq!(replaced.data.as_ref().unwrap()["state"], "ready");
    match next_ok(&mut events).await {
        Event::Apply(cm) => assert_eq!(cm.data.unwrap()["state"], "ready"),
        other => panic!("expected Apply, got {other:?}"),
    }
    assert_eq!(
        api_error(
            api.replace("replica-0", &PostParams::default(), &next_report)
                .await
        ),
        (409, "Conflict".to_owned())
    );
    api.create(
        &PostParams::default(),
        &report("replica-1", "1", "starting"),
    )
    .await
    .unwrap();
    assert_eq!(
        describe(&next_ok(&mut events).await),
        pair("Apply", "replica-1")
    );
    // One without the label: listed without a selector, neither listed nor watched with it.
    let plain: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "settings"}, "data": {"a": "b"}}))
            .unwrap();
    api.create(&PostParams::default(), &plain).await.unwrap();
    let everything = api.list(&ListParams::default()).await.unwrap();
    let names: Vec<String> = everything.items.iter().map(ResourceExt::name_any).collect();
    assert_eq!(names, ["replica-0", "replica-1", "settings"]);
    let reports = api
        .list(&ListParams::default().labels("weft.dev/report=1"))
        .await
        .unwrap();
    assert_eq!(reports.items.len(), 1);
    assert_eq!(reports.items[0].name_any(), "replica-1");
    assert_eq!(reports.items[0].data.as_ref().unwrap()["state"], "starting");

    let deleted = api
        .delete("replica-1", &DeleteParams::default())
        .await
        .unwrap();
    assert!(deleted.is_right());
    // The next event is the deletion: the unlabeled ConfigMap's creation never reached this watch.
    assert_eq!(
        describe(&next_ok(&mut events).await),
        pair("Delete", "replica-1")
    );
}
