//! The stand-in's API semantics, over HTTP as a client sees them: list then watch from the list's resourceVersion,
//! chunked lists, 410 Gone on a stale resourceVersion, 409 Conflict on a stale write, the status subresource,
//! Leases as leader election takes them, and core-group Pods and Secrets with label selectors.
#![allow(clippy::unwrap_used)] // a test panics to fail

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::{Value, json};
use weft_kubeapi::{ApiServer, Client, Reply, Resource, WatchStream};

const ALL: &str = "/apis/weft.dev/v1alpha1/weftplugins";

fn plugins(ns: &str) -> String {
    format!("/apis/weft.dev/v1alpha1/namespaces/{ns}/weftplugins")
}

fn plugin(ns: &str, name: &str, tag: u32) -> Value {
    json!({
        "apiVersion": "weft.dev/v1alpha1",
        "kind": "WeftPlugin",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"url": format!("oci://registry.example/{name}:{tag}")},
    })
}

fn rv(obj: &Value) -> u64 {
    obj["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap()
}

async fn next(watch: &mut WatchStream) -> Option<Value> {
    tokio::time::timeout(Duration::from_secs(5), watch.next())
        .await
        .expect("a watch event (or its end) within 5 s")
        .unwrap()
}

/// The next event's type and object name.
async fn event(watch: &mut WatchStream) -> (String, String) {
    let ev = next(watch).await.expect("the watch is still open");
    (
        ev["type"].as_str().unwrap().to_owned(),
        ev["object"]["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
    )
}

fn pair(t: &str, n: &str) -> (String, String) {
    (t.to_owned(), n.to_owned())
}

#[tokio::test]
async fn watch_from_a_list_sees_exactly_the_later_events_in_order() {
    let server = ApiServer::start().await.unwrap();
    let client = server.client();
    server.apply(plugin("ns1", "a", 1)).unwrap();
    server.apply(plugin("ns1", "b", 1)).unwrap();
    server.apply(plugin("ns2", "x", 1)).unwrap();

    let list = client.get(&plugins("ns1")).await.unwrap();
    assert_eq!(list.code, 200);
    let names: Vec<&str> = list.body["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["a", "b"]);
    let from = list.body["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_owned();

    // Changes after the list, before the watch starts.
    assert_eq!(
        client
            .post(&plugins("ns1"), &plugin("ns1", "c", 1))
            .await
            .unwrap()
            .code,
        201
    );
    let mut a = server.get(Resource::WeftPlugin, "ns1", "a").unwrap();
    a["spec"]["url"] = json!("oci://registry.example/a:2");
    assert_eq!(
        client
            .put(&format!("{}/a", plugins("ns1")), &a)
            .await
            .unwrap()
            .code,
        200
    );
    assert_eq!(
        client
            .delete(&format!("{}/b", plugins("ns1")))
            .await
            .unwrap()
            .code,
        200
    );
    server.apply(plugin("ns2", "y", 1)).unwrap();

    let path =
        |base: &str| format!("{base}?watch=1&resourceVersion={from}&allowWatchBookmarks=true");
    let mut ns1 = client.watch(&path(&plugins("ns1"))).await.unwrap();
    let mut all = client.watch(&path(ALL)).await.unwrap();
    assert_eq!(ns1.code, 200);
    assert_eq!(event(&mut ns1).await, pair("ADDED", "c"));
    assert_eq!(event(&mut ns1).await, pair("MODIFIED", "a"));
    assert_eq!(event(&mut ns1).await, pair("DELETED", "b"));
    // And one after the watch started.
    server.apply(plugin("ns1", "d", 1)).unwrap();
    assert_eq!(event(&mut ns1).await, pair("ADDED", "d"));
    // A bookmark now proves nothing else was queued before it.
    server.bookmark();
    let bookmark = next(&mut ns1).await.unwrap();
    assert_eq!(bookmark["type"], "BOOKMARK");
    assert_eq!(
        bookmark["object"]["metadata"]["resourceVersion"],
        server.resource_version()
    );

    let mut seen = Vec::new();
    let mut last = from.parse::<u64>().unwrap();
    loop {
        let ev = next(&mut all).await.unwrap();
        if ev["type"] == "BOOKMARK" {
            break;
        }
        assert!(rv(&ev["object"]) > last, "resourceVersions increase");
        last = rv(&ev["object"]);
        seen.push((
            ev["type"].as_str().unwrap().to_owned(),
            ev["object"]["metadata"]["name"]
                .as_str()
                .unwrap()
                .to_owned(),
        ));
    }
    assert_eq!(
        seen,
        [
            pair("ADDED", "c"),
            pair("MODIFIED", "a"),
            pair("DELETED", "b"),
            pair("ADDED", "y"),
            pair("ADDED", "d")
        ]
    );

    // Without a resourceVersion a watch starts with every object as ADDED.
    let mut fresh = client
        .watch(&format!("{}?watch=true", plugins("ns1")))
        .await
        .unwrap();
    assert_eq!(event(&mut fresh).await, pair("ADDED", "a"));
    assert_eq!(event(&mut fresh).await, pair("ADDED", "c"));
    assert_eq!(event(&mut fresh).await, pair("ADDED", "d"));
    // A watch without allowWatchBookmarks gets none; timeoutSeconds ends the stream.
    server.bookmark();
    let mut timed = client
        .watch(&format!(
            "{}?watch=1&resourceVersion={}&timeoutSeconds=1",
            plugins("ns1"),
            server.resource_version()
        ))
        .await
        .unwrap();
    assert!(next(&mut timed).await.is_none());
    assert_eq!(server.requests("watch"), 4);
    assert_eq!(server.requests("list"), 1);
}

#[tokio::test]
async fn a_chunked_list_returns_every_object_once() {
    let server = ApiServer::start().await.unwrap();
    let client = server.client();
    let mut want = BTreeSet::new();
    for i in 0..10 {
        let ns = if i % 3 == 0 { "ns1" } else { "ns2" };
        server.apply(plugin(ns, &format!("p{i}"), 1)).unwrap();
        want.insert(format!("{ns}/p{i}"));
    }
    let mut got = Vec::new();
    let mut path = format!("{ALL}?limit=3");
    let mut list_rv = None;
    let mut pages = 0;
    loop {
        let page = client.get(&path).await.unwrap();
        assert_eq!(page.code, 200, "{}", page.body);
        pages += 1;
        let meta = &page.body["metadata"];
        let page_rv = meta["resourceVersion"].as_str().unwrap().to_owned();
        // Every page is of the first page's resourceVersion: later writes do not show.
        assert_eq!(list_rv.get_or_insert_with(|| page_rv.clone()), &page_rv);
        for item in page.body["items"].as_array().unwrap() {
            got.push(format!(
                "{}/{}",
                item["metadata"]["namespace"].as_str().unwrap(),
                item["metadata"]["name"].as_str().unwrap()
            ));
        }
        server
            .apply(plugin("ns1", &format!("late{pages}"), 1))
            .unwrap();
        server
            .delete(Resource::WeftPlugin, "ns2", &format!("p{}", pages * 3 - 1))
            .ok();
        match meta["continue"].as_str() {
            Some(token) => {
                assert_eq!(meta["remainingItemCount"], 10 - got.len());
                path = format!("{ALL}?limit=3&continue={token}");
            }
            None => break,
        }
    }
    assert_eq!(pages, 4);
    assert_eq!(got.len(), want.len(), "{got:?}");
    assert_eq!(got.iter().cloned().collect::<BTreeSet<_>>(), want);

    let ns1 = client
        .get(&format!("{}?limit=100", plugins("ns1")))
        .await
        .unwrap();
    assert!(ns1.body["metadata"].get("continue").is_none());
}

#[tokio::test]
async fn a_stale_resource_version_is_410_gone() {
    let server = ApiServer::with_history(3).await.unwrap();
    let client = server.client();
    let start = server.resource_version();
    for i in 0..5 {
        server.apply(plugin("ns1", &format!("p{i}"), 1)).unwrap();
    }
    // Older than the bounded history: the API server answers 200, then one ERROR event with a 410 Status, and ends.
    let mut watch = client
        .watch(&format!(
            "{}?watch=1&resourceVersion={start}",
            plugins("ns1")
        ))
        .await
        .unwrap();
    assert_eq!(watch.code, 200);
    let err = next(&mut watch).await.unwrap();
    assert_eq!(err["type"], "ERROR");
    assert_eq!(err["object"]["kind"], "Status");
    assert_eq!(err["object"]["code"], 410);
    assert_eq!(err["object"]["reason"], "Expired");
    assert!(next(&mut watch).await.is_none());

    // Within the history it is served; after a compaction it is not.
    let recent = server.resource_version();
    server.apply(plugin("ns1", "q", 1)).unwrap();
    let mut watch = client
        .watch(&format!(
            "{}?watch=1&resourceVersion={recent}",
            plugins("ns1")
        ))
        .await
        .unwrap();
    assert_eq!(event(&mut watch).await, pair("ADDED", "q"));
    server.compact();
    let mut watch = client
        .watch(&format!(
            "{}?watch=1&resourceVersion={recent}",
            plugins("ns1")
        ))
        .await
        .unwrap();
    assert_eq!(next(&mut watch).await.unwrap()["object"]["code"], 410);
    // From the current version (e.g. a bookmark's) a watch goes on.
    let now = server.resource_version();
    let mut watch = client
        .watch(&format!("{}?watch=1&resourceVersion={now}", plugins("ns1")))
        .await
        .unwrap();
    server.apply(plugin("ns1", "r", 1)).unwrap();
    assert_eq!(event(&mut watch).await, pair("ADDED", "r"));

    // A continue token older than the history.
    let first = client.get(&format!("{ALL}?limit=2")).await.unwrap();
    let token = first.body["metadata"]["continue"]
        .as_str()
        .unwrap()
        .to_owned();
    // Compaction keeps the version it is at: a change, then a compaction, leaves the token behind.
    server.apply(plugin("ns1", "s", 1)).unwrap();
    server.compact();
    let gone = client
        .get(&format!("{ALL}?limit=2&continue={token}"))
        .await
        .unwrap();
    assert_eq!(gone.code, 410);
    assert_eq!(gone.body["reason"], "Expired");
    // One that was never a token.
    let bad = client
        .get(&format!("{ALL}?limit=2&continue=not-a-token"))
        .await
        .unwrap();
    assert_eq!(bad.code, 400);
    assert_eq!(bad.body["reason"], "BadRequest");
}

#[tokio::test]
async fn writes_check_resource_versions_and_status_keeps_the_generation() {
    let server = ApiServer::start().await.unwrap();
    let client = server.client();
    let url = format!("{}/a", plugins("ns1"));
    let mut body = plugin("ns1", "a", 1);
    body["status"] = json!({"phase": "ignored on create"});
    let created = client.post(&plugins("ns1"), &body).await.unwrap();
    assert_eq!(created.code, 201);
    let obj = created.body;
    assert_eq!(obj["metadata"]["generation"], 1);
    assert_eq!(obj["metadata"]["uid"].as_str().unwrap().len(), 36);
    assert!(
        obj["metadata"]["creationTimestamp"]
            .as_str()
            .unwrap()
            .ends_with('Z')
    );
    assert!(obj.get("status").is_none());

    // A spec change bumps the generation; the stale version then conflicts.
    let mut edit = obj.clone();
    edit["spec"]["url"] = json!("oci://registry.example/a:2");
    let updated = client.put(&url, &edit).await.unwrap();
    assert_eq!(updated.code, 200);
    assert_eq!(updated.body["metadata"]["generation"], 2);
    assert_eq!(updated.body["metadata"]["uid"], obj["metadata"]["uid"]);
    assert!(rv(&updated.body) > rv(&obj));
    let conflict = client.put(&url, &edit).await.unwrap();
    assert_eq!(conflict.code, 409);
    assert_eq!(conflict.body["reason"], "Conflict");
    assert_eq!(conflict.body["details"]["name"], "a");

    // The status subresource: status only, generation unchanged, resourceVersion checked.
    let mut with_status = updated.body.clone();
    with_status["status"] = json!({"phase": "Ready", "readyNodes": 3});
    with_status["spec"]["url"] = json!("oci://registry.example/ignored:9");
    let put = client
        .put(&format!("{url}/status"), &with_status)
        .await
        .unwrap();
    assert_eq!(put.code, 200, "{}", put.body);
    assert_eq!(put.body["status"]["phase"], "Ready");
    assert_eq!(put.body["spec"], updated.body["spec"]);
    assert_eq!(put.body["metadata"]["generation"], 2);
    assert_eq!(
        client
            .put(&format!("{url}/status"), &with_status)
            .await
            .unwrap()
            .code,
        409
    );
    let patched = client
        .merge_patch(
            &format!("{url}/status"),
            &json!({"status": {"readyNodes": 2}}),
        )
        .await
        .unwrap();
    assert_eq!(patched.code, 200);
    assert_eq!(
        patched.body["status"],
        json!({"phase": "Ready", "readyNodes": 2})
    );
    assert_eq!(patched.body["metadata"]["generation"], 2);
    let stale_patch = json!({"metadata": {"resourceVersion": put.body["metadata"]["resourceVersion"]}, "status": {"phase": "x"}});
    assert_eq!(
        client
            .merge_patch(&format!("{url}/status"), &stale_patch)
            .await
            .unwrap()
            .code,
        409
    );

    // The main resource leaves status alone; a write that changes nothing changes no version.
    let mut main = patched.body.clone();
    main["status"] = json!({"phase": "overwritten?"});
    let same = client.put(&url, &main).await.unwrap();
    assert_eq!(same.code, 200);
    assert_eq!(same.body, patched.body);
    let relabeled = client
        .merge_patch(&url, &json!({"metadata": {"labels": {"team": "x"}}}))
        .await
        .unwrap();
    assert_eq!(relabeled.body["metadata"]["generation"], 2);
    assert_eq!(relabeled.body["status"]["readyNodes"], 2);

    let wrong_type = client
        .request(
            http::Method::PATCH,
            &url,
            "application/json-patch+json",
            Some(&json!([])),
        )
        .await
        .unwrap();
    assert_eq!(wrong_type.code, 415);
    assert_eq!(client.delete(&url).await.unwrap().code, 200);
    assert_eq!(client.get(&url).await.unwrap().code, 404);
    assert_eq!(client.put(&url, &edit).await.unwrap().code, 404);
    assert_eq!(server.requests("create"), 1);
    assert_eq!(server.requests("update"), 6);
    assert_eq!(server.requests("patch"), 4);
    assert_eq!(server.requests("delete"), 1);
    assert_eq!(server.requests("get"), 1);
}

const LEASES: &str = "/apis/coordination.k8s.io/v1/namespaces/weft-system/leases";

fn lease(holder: &str) -> Value {
    json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "weft-control", "namespace": "weft-system"},
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15},
    })
}

/// Two candidates writing at once, each on its own task and connection: POST (create) or PUT (update).
async fn race(
    client: Client,
    one: (String, Value),
    two: (String, Value),
    update: bool,
) -> (Reply, Reply) {
    let send = |(path, body): (String, Value)| {
        let client = client.clone();
        tokio::spawn(async move {
            if update {
                client.put(&path, &body).await.unwrap()
            } else {
                client.post(&path, &body).await.unwrap()
            }
        })
    };
    let (a, b) = (send(one), send(two));
    (a.await.unwrap(), b.await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_candidates_racing_for_a_lease_exactly_one_wins() {
    let server = ApiServer::start().await.unwrap();
    let client = server.client();
    for round in 0..20 {
        let url = format!("{LEASES}/weft-control");
        // Nobody holds it yet: both create; one gets it.
        let (a, b) = race(
            client.clone(),
            (LEASES.to_owned(), lease("a")),
            (LEASES.to_owned(), lease("b")),
            false,
        )
        .await;
        let mut codes = [a.code, b.code];
        codes.sort();
        assert_eq!(codes, [201, 409], "round {round}");
        let loser = if a.code == 409 { &a } else { &b };
        assert_eq!(loser.body["reason"], "AlreadyExists");

        // Both read it and both try to take it over from the same resourceVersion; one gets it.
        let held = client.get(&url).await.unwrap().body;
        assert!(held["metadata"].get("generation").is_none());
        let take = |who: &str| {
            let mut next = held.clone();
            next["spec"]["holderIdentity"] = json!(who);
            next
        };
        let (c, d) = race(
            client.clone(),
            (url.clone(), take("c")),
            (url.clone(), take("d")),
            true,
        )
        .await;
        let mut codes = [c.code, d.code];
        codes.sort();
        assert_eq!(codes, [200, 409], "round {round}");
        let winner = if c.code == 200 { "c" } else { "d" };
        assert_eq!(
            server
                .get(Resource::Lease, "weft-system", "weft-control")
                .unwrap()["spec"]["holderIdentity"],
            winner
        );
        let released = client.delete(&url).await.unwrap();
        assert_eq!(released.code, 200);
        assert_eq!(released.body["status"], "Success");
    }
}

#[tokio::test]
async fn core_resources_serve_label_selectors_and_store_secrets_as_the_api_server() {
    let server = ApiServer::start().await.unwrap();
    let client = server.client();
    let pods = Resource::Pod.collection("web");
    let pod = |name: &str, labels: Value| json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "web", "labels": labels}});
    server.apply(pod("a", json!({"app": "web"}))).unwrap();
    server.apply(pod("b", json!({"app": "db"}))).unwrap();
    // A percent-encoded selector (`app=web`) on a cluster-wide watch: only matching objects' events.
    let mut watch = client
        .watch("/api/v1/pods?watch=true&labelSelector=app%3Dweb")
        .await
        .unwrap();
    assert_eq!(event(&mut watch).await, pair("ADDED", "a"));
    server.apply(pod("c", json!({"app": "db"}))).unwrap();
    server.apply(pod("d", json!({"app": "web"}))).unwrap();
    server.delete(Resource::Pod, "web", "b").unwrap();
    server.delete(Resource::Pod, "web", "a").unwrap();
    assert_eq!(event(&mut watch).await, pair("ADDED", "d"));
    assert_eq!(event(&mut watch).await, pair("DELETED", "a"));
    // `+` is a space; `!=` matches objects without the label too.
    let list = client
        .get(&format!("{pods}?labelSelector=app+!%3D+web"))
        .await
        .unwrap();
    assert_eq!(list.code, 200, "{}", list.body);
    assert_eq!(list.body["kind"], "PodList");
    assert_eq!(list.body["items"][0]["metadata"]["name"], "c");
    assert_eq!(list.body["items"].as_array().unwrap().len(), 1);
    for bad in [
        "fieldSelector=metadata.name%3Dc",
        "labelSelector=app+in+(web)",
        "labelSelector=%zz",
    ] {
        let reply = client.get(&format!("{pods}?{bad}")).await.unwrap();
        assert_eq!(reply.code, 400, "{bad}");
        assert_eq!(reply.body["reason"], "BadRequest", "{bad}");
    }
    // Paths the core group does not serve here.
    for path in [
        "/api/v1/namespaces/web",
        "/api/v1/namespaces/web/configmaps/x/status",
        "/api/v2/pods",
    ] {
        assert_eq!(client.get(path).await.unwrap().code, 404, "{path}");
    }

    // Secrets: stringData folded into data, data must be base64; deletes answer with a Status naming no group.
    let secrets = Resource::Secret.collection("web");
    let created = client
        .post(
            &secrets,
            &json!({"metadata": {"name": "s"}, "stringData": {"k": "v"}}),
        )
        .await
        .unwrap();
    assert_eq!(created.code, 201, "{}", created.body);
    assert_eq!(created.body["data"], json!({"k": "dg=="}));
    assert_eq!(created.body["type"], "Opaque");
    assert!(created.body.get("stringData").is_none());
    let patched = client
        .merge_patch(&format!("{secrets}/s"), &json!({"stringData": {"k2": "w"}}))
        .await
        .unwrap();
    assert_eq!(patched.body["data"], json!({"k": "dg==", "k2": "dw=="}));
    let bad = client
        .post(
            &secrets,
            &json!({"metadata": {"name": "t"}, "data": {"k": "not base64!"}}),
        )
        .await
        .unwrap();
    assert_eq!(bad.code, 400);
    let deleted = client.delete(&format!("{secrets}/s")).await.unwrap();
    assert_eq!(deleted.body["status"], "Success");
    assert_eq!(deleted.body["details"]["kind"], "secrets");
    assert!(deleted.body["details"].get("group").is_none());
    let missing = client.get(&format!("{secrets}/s")).await.unwrap();
    assert_eq!(missing.code, 404);
    assert_eq!(missing.body["message"], "secrets \"s\" not found");
}
