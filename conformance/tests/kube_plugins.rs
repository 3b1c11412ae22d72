//! WeftPlugin resources end to end: two real `weft-control` replicas (`--plugins-from-kube`) watch an API-server
//! stand-in (real HTTP, kube-rs as their client) and serve three real `weft run` nodes, which pull the code from a
//! real OCI registry that wants credentials (the resources' `imagePullSecret`). Resources in two namespaces and the
//! root namespace are created, edited and deleted as `kubectl apply` would: each node gets exactly the plugins of
//! the workloads it runs (by namespace and `selector.matchLabels`), a bad resource says `Accepted=False` with the
//! reason while the others keep flowing, killing the leader moves status writing to the other replica, and the
//! nodes of the killed replica move to the other with no plugin change.
#![allow(clippy::unwrap_used)] // a test panics to fail

#[path = "kube_plugins/relay.rs"]
mod relay;

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};
use weft_conformance::eventually;
use weft_conformance::xdsmesh::plugin_loads;
use weft_devmesh::control::{Control, free_port, plugin_xds_flags, write_tokens, xds_flags};
use weft_devmesh::{NodeOptions, NodeProcess};
use weft_fetch::testing::{Registry, TestCa, oci_client, push_artifact};
use weft_kubeapi::{ApiServer, Resource};
use weft_plugin_host::testing::build_plugin;

const NS: &str = "weft-system";
const WAIT: Duration = Duration::from_secs(60);

fn pod(ns: &str, name: &str, app: &str, node: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"namespace": ns, "name": name, "labels": {"app": app}},
        "spec": {"nodeName": node, "containers": [{"name": "app", "image": "app"}]},
        "status": {"phase": "Running"},
    })
}

fn plugin(
    ns: &str,
    name: &str,
    url: &str,
    sha: &str,
    ports: &[u16],
    selector: Option<&str>,
) -> Value {
    let mut spec = json!({
        "url": url,
        "sha256": sha,
        "imagePullSecret": "regcred",
        "pluginConfig": {"ports": ports},
        "failStrategy": "FAIL_CLOSE",
    });
    if let Some(app) = selector {
        spec["selector"] = json!({"matchLabels": {"app": app}});
    }
    json!({
        "apiVersion": "weft.dev/v1alpha1", "kind": "WeftPlugin",
        "metadata": {"namespace": ns, "name": name},
        "spec": spec,
    })
}

/// A node's serving plugins from weft-control: xDS name → (sha256, loaded at). Their names are
/// `<namespace>.<name>`; the node's built-ins (`istio-authz`, `istio-telemetry`) have no dot.
async fn serving(node: &NodeProcess) -> Option<BTreeMap<String, (String, u64)>> {
    let d = node.config_dump().await.ok()?;
    Some(
        d["plugins"]
            .as_array()?
            .iter()
            .filter(|p| {
                p["state"] == "serving" && p["name"].as_str().is_some_and(|n| n.contains('.'))
            })
            .map(|p| {
                (
                    p["name"].as_str().unwrap_or_default().to_owned(),
                    (
                        p["sha256"].as_str().unwrap_or_default().to_owned(),
                        p["loadedAt"].as_u64().unwrap_or_default(),
                    ),
                )
            })
            .collect(),
    )
}

/// Wait until `node` serves exactly `names`, each with code `sha`; returns what it serves.
async fn until_plugins(
    node: &NodeProcess,
    names: &[&str],
    sha: &str,
) -> BTreeMap<String, (String, u64)> {
    let want: BTreeSet<&str> = names.iter().copied().collect();
    eventually(
        WAIT,
        &format!("{} serving exactly {want:?}", node.name),
        || async {
            serving(node).await.filter(|s| {
                s.keys().map(String::as_str).collect::<BTreeSet<_>>() == want
                    && s.values().all(|(h, _)| h == sha)
            })
        },
    )
    .await
}

/// The node's plugin xDS source (`sources.xds[name=plugins]`).
async fn plugin_source(node: &NodeProcess) -> Option<Value> {
    let d = node.config_dump().await.ok()?;
    d["sources"]["xds"]
        .as_array()?
        .iter()
        .find(|s| s["name"] == "plugins")
        .cloned()
}

/// Wait until a WeftPlugin's status satisfies `pred` (the last status seen is in the failure).
async fn until_status(
    api: &ApiServer,
    ns: &str,
    name: &str,
    what: &str,
    pred: impl Fn(&Value) -> bool,
) -> Value {
    let last = std::sync::Mutex::new(Value::Null);
    let found = weft_testkit::poll_within(WAIT, Duration::from_millis(25), what, || async {
        let s = api
            .get(Resource::WeftPlugin, ns, name)
            .map(|o| o["status"].clone())?;
        *last.lock().unwrap() = s.clone();
        pred(&s).then_some(s)
    })
    .await;
    found.unwrap_or_else(|e| panic!("{ns}/{name}: {e}; its status: {}", last.lock().unwrap()))
}

fn condition<'a>(status: &'a Value, kind: &str) -> Option<&'a Value> {
    status["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind)
}

/// Ready on `n` of `n` selected nodes at `generation`.
fn ready_on(status: &Value, n: u64, generation: u64) -> bool {
    status["observedGeneration"] == generation
        && status["nodes"]["selected"] == n
        && status["nodes"]["serving"] == n
        && condition(status, "Accepted").is_some_and(|c| c["status"] == "True")
        && condition(status, "Ready").is_some_and(|c| c["status"] == "True")
        && status["phase"] == "Ready"
}

fn generation(api: &ApiServer, ns: &str, name: &str) -> u64 {
    api.get(Resource::WeftPlugin, ns, name).unwrap()["metadata"]["generation"]
        .as_u64()
        .unwrap()
}

fn lease_holder(api: &ApiServer) -> Option<String> {
    api.get(Resource::Lease, NS, "weft-control-leader")?["spec"]["holderIdentity"]
        .as_str()
        .map(str::to_owned)
}

/// A replica and its status endpoint.
fn replica(dir: &Path, api: &ApiServer, name: &str) -> (Control, SocketAddr) {
    let addr = free_port().unwrap();
    let status = free_port().unwrap();
    let args: Vec<String> = [
        "--listen",
        &addr.to_string(),
        "--ca-dir",
        &dir.join("ca").display().to_string(),
        "--tokens",
        &dir.join("tokens.yaml").display().to_string(),
        "--kube-api",
        &api.url(),
        "--plugins-from-kube",
        "--namespace",
        NS,
        "--replica",
        name,
        "--leader-lease-duration",
        "2s",
        "--leader-retry-period",
        "200ms",
        "--status",
        &status.to_string(),
        "--metrics",
        "off",
        "--log-json",
        "--log",
        "info,weft_control=debug",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    let c = Control::with_args(
        &weft_devmesh::control_binary().unwrap(),
        addr,
        args,
        &dir.join(format!("{name}.log")),
    )
    .unwrap();
    (c, status)
}

/// A replica's `/status` document.
async fn control_status(at: SocketAddr) -> Value {
    let (code, body) = weft_devmesh::http::get(at, "/status").await.unwrap();
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weftplugins_by_namespace_from_two_replicas_to_three_nodes() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    weft_devmesh::write_dev_ca(&d.join("ca"), "cluster.local").unwrap();
    write_tokens(d, &["node-a", "node-b", "node-c"]).unwrap();

    // The code, in a registry that wants credentials.
    let code = std::fs::read(build_plugin("plugins/port-allowlist").unwrap()).unwrap();
    let sha = weft_fetch::sha256_hex(&code);
    let rca = TestCa::new("registry CA");
    let reg = Registry::start(&rca, Some(("weft", "s3cret"))).await;
    let roots = rca.write(d);
    let auth = oci_client::secrets::RegistryAuth::Basic("weft".into(), "s3cret".into());
    push_artifact(
        &oci_client(&rca),
        &format!("{}/weft/allowlist:v1", reg.addr),
        &code,
        &auth,
    )
    .await;
    let url = format!("oci://{}/weft/allowlist:v1", reg.addr);
    let docker_config =
        json!({"auths": {reg.addr.to_string(): {"username": "weft", "password": "s3cret"}}});

    // The cluster: pods of two namespaces on three nodes, pull secrets, plugins in both and in the root namespace.
    let api = ApiServer::start().await.unwrap();
    for p in [
        pod("shop", "web-1", "web", "node-a"),
        pod("shop", "db-1", "db", "node-c"),
        pod("blog", "post-1", "post", "node-b"),
        pod("blog", "post-2", "post", "node-c"),
    ] {
        api.apply(p).unwrap();
    }
    for ns in ["shop", "blog", "istio-system"] {
        api.apply(json!({
            "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/dockerconfigjson",
            "metadata": {"namespace": ns, "name": "regcred"},
            "stringData": {".dockerconfigjson": docker_config.to_string()},
        }))
        .unwrap();
    }
    api.apply(plugin("shop", "allow", &url, &sha, &[8080], None))
        .unwrap();
    api.apply(plugin("shop", "web-only", &url, &sha, &[80], Some("web")))
        .unwrap();
    api.apply(plugin("blog", "allow", &url, &sha, &[9090], None))
        .unwrap();
    api.apply(plugin(
        "istio-system",
        "everywhere",
        &url,
        &sha,
        &[15008],
        None,
    ))
    .unwrap();

    // Replica 1 first, so it leads; then replica 2.
    let (mut r1, r1_status) = replica(d, &api, "weft-control-1");
    eventually(WAIT, "replica 1 holds the Lease", || async {
        (lease_holder(&api).as_deref() == Some("weft-control-1")).then_some(())
    })
    .await;
    let (r2, r2_status) = replica(d, &api, "weft-control-2");
    for r in [&r1, &r2] {
        eventually(WAIT, "both replicas serve", || async {
            r.log_lines()
                .iter()
                .any(|l| l["message"] == "weft control serving Delta ADS")
                .then_some(())
        })
        .await;
    }

    // Nodes a and b reach replica 1 (replica 2 when 1 is gone), node c replica 2: as through a Service.
    let (front1, _f1) = relay::front(vec![r1.addr, r2.addr]).await;
    let (front2, _f2) = relay::front(vec![r2.addr, r1.addr]).await;
    let root = d.join("ca").join("root-cert.pem");
    let node = |name: &str, third: u8, front: SocketAddr| {
        let ip = IpAddr::V4(Ipv4Addr::new(127, 0, third, 254));
        let mut o = NodeOptions::loopback(name, ip, Path::new(""), &d.join("ca"), d);
        let token = d.join(format!("{name}.token"));
        o.extra.extend(xds_flags(front, &root, &token, name));
        o.extra.extend(plugin_xds_flags(front, &root, &token));
        o.extra
            .extend(["--plugin-fetch-roots".into(), roots.display().to_string()]);
        NodeProcess::spawn(&weft_devmesh::weft_binary().unwrap(), &o).unwrap()
    };
    let mut a = node("node-a", 236, front1);
    let mut b = node("node-b", 237, front1);
    let mut c = node("node-c", 238, front2);
    for n in [&mut a, &mut b, &mut c] {
        n.wait_ready(WAIT).await.unwrap();
    }

    // Each node gets exactly the plugins of its workloads.
    until_plugins(
        &a,
        &["shop.allow", "shop.web-only", "istio-system.everywhere"],
        &sha,
    )
    .await;
    until_plugins(&b, &["blog.allow", "istio-system.everywhere"], &sha).await;
    until_plugins(
        &c,
        &["shop.allow", "blog.allow", "istio-system.everywhere"],
        &sha,
    )
    .await;

    // The leader's status aggregates both replicas' nodes.
    for (ns, name, nodes) in [
        ("shop", "allow", 2),
        ("shop", "web-only", 1),
        ("blog", "allow", 2),
        ("istio-system", "everywhere", 3),
    ] {
        let s = until_status(&api, ns, name, "Ready on its nodes", |s| {
            ready_on(s, nodes, 1)
        })
        .await;
        assert_eq!(s["servingSha256"], sha.as_str(), "{s}");
        assert_eq!(s["readyNodes"], format!("{nodes}/{nodes}"), "{s}");
    }

    // A bad resource is refused alone, with its reason; an edit of another keeps flowing.
    api.apply(plugin(
        "blog",
        "broken",
        "file:///etc/passwd",
        &sha,
        &[1],
        None,
    ))
    .unwrap();
    let s = until_status(&api, "blog", "broken", "refused", |s| {
        condition(s, "Accepted").is_some_and(|c| c["status"] == "False")
    })
    .await;
    let refusal = condition(&s, "Accepted").unwrap();
    assert_eq!(refusal["reason"], "Refused", "{s}");
    assert!(
        refusal["message"].as_str().unwrap().contains("file://"),
        "{s}"
    );
    assert_eq!(s["phase"], "Refused", "{s}");
    // Each replica's status page says the same of the resource, and which of them leads.
    for (at, leads) in [(r1_status, true), (r2_status, false)] {
        let doc = control_status(at).await;
        let c = &doc["controller"];
        assert_eq!(c["leader"], leads, "{doc}");
        let broken = c["resources"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["namespace"] == "blog" && r["name"] == "broken")
            .unwrap_or_else(|| panic!("{doc}"));
        assert!(
            broken["refused"].as_str().unwrap().contains("file://"),
            "{doc}"
        );
    }
    let before = plugin_loads(&a).await["shop.allow"];
    api.apply(plugin("shop", "allow", &url, &sha, &[8080, 8081], None))
        .unwrap();
    eventually(WAIT, "node-a loads the edited shop/allow", || async {
        let now = plugin_loads(&a).await.get("shop.allow").copied();
        now.filter(|n| *n > before)
    })
    .await;
    until_status(&api, "shop", "allow", "Ready at generation 2", |s| {
        ready_on(s, 2, 2)
    })
    .await;

    // Deleted: gone from its node. A pod of blog scheduled on node-a: blog's plugin follows it there.
    api.delete(Resource::WeftPlugin, "shop", "web-only")
        .unwrap();
    until_plugins(&a, &["shop.allow", "istio-system.everywhere"], &sha).await;
    api.apply(pod("blog", "post-3", "post", "node-a")).unwrap();
    until_plugins(
        &a,
        &["shop.allow", "blog.allow", "istio-system.everywhere"],
        &sha,
    )
    .await;
    until_status(&api, "blog", "allow", "Ready on three nodes", |s| {
        ready_on(s, 3, 1)
    })
    .await;

    // A staged edit of blog/allow (on all three nodes): one node, then all. The leader (replica 1, nodes a and b)
    // steps over both replicas' reports and records the rollout in the status; replica 2 serves node c as it says.
    let mut staged = plugin("blog", "allow", &url, &sha, &[9090, 9092], None);
    staged["spec"]["rollout"] = json!({
        "stages": [{"nodes": 1, "bake": "1s"}, {"percent": 100, "bake": "1s"}],
        "abortWhen": {"nacks": 0},
    });
    api.apply(staged).unwrap();
    let staged_generation = generation(&api, "blog", "allow");
    let s = until_status(&api, "blog", "allow", "the staged edit complete", |s| {
        s["rolloutState"]["rollout"]["state"] == "complete" && ready_on(s, 3, staged_generation)
    })
    .await;
    let events: Vec<&str> = s["rolloutState"]["rollout"]["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["event"].as_str().unwrap())
        .collect();
    assert!(
        events
            .iter()
            .any(|e| e.starts_with("1 of 3 node(s) serves the version")),
        "{events:#?}"
    );
    assert!(
        events
            .iter()
            .any(|e| e.starts_with("3 of 3 node(s) serves the version")),
        "{events:#?}"
    );
    assert_eq!(
        s["rolloutState"]["stable"]["version"], s["rolloutState"]["rollout"]["targetVersion"],
        "{s}"
    );
    // The pull secret the nodes get is not in the status: the recorded stable resource (hex) carries none.
    let stable_hex = s["rolloutState"]["stable"]["valueHex"].as_str().unwrap();
    let stable: Vec<u8> = (0..stable_hex.len() / 2)
        .map(|i| u8::from_str_radix(&stable_hex[2 * i..2 * i + 2], 16).unwrap())
        .collect();
    let stable = String::from_utf8_lossy(&stable);
    assert!(stable.contains("oci://"), "{stable}");
    assert!(
        !stable.contains("s3cret") && !stable.contains("auths"),
        "{stable}"
    );

    // A staged version the nodes refuse (a configuration port-allowlist cannot read): the first stage's node NACKs
    // it, the rollout aborts there, and every node keeps the stable version; putting the spec back ends it.
    let mut bad = plugin("blog", "allow", &url, &sha, &[9090, 9092], None);
    bad["spec"]["pluginConfig"] = json!({"ports": "not a list"});
    bad["spec"]["rollout"] =
        json!({"stages": [{"nodes": 1, "bake": "1s"}, {"percent": 100, "bake": "1s"}]});
    api.apply(bad).unwrap();
    let s = until_status(&api, "blog", "allow", "the refused version aborted", |s| {
        s["rolloutState"]["rollout"]["state"] == "aborted"
    })
    .await;
    let abort = &s["rolloutState"]["rollout"]["abort"];
    assert_eq!(abort["stage"], 1, "{s}");
    assert_eq!(abort["nodes"].as_array().map(Vec::len), Some(1), "{s}");
    assert!(
        abort["reason"]
            .as_str()
            .is_some_and(|r| r.contains("1 node(s) refused the version")),
        "{s}"
    );
    let stable_version = s["rolloutState"]["stable"]["version"].clone();
    for r in [r1_status, r2_status] {
        eventually(WAIT, "every node back on the stable version", || async {
            let doc = control_status(r).await;
            doc["nodes"]
                .as_array()?
                .iter()
                .filter(|n| n["plugins"]["blog.allow"].is_object())
                .all(|n| n["plugins"]["blog.allow"]["version"] == stable_version)
                .then_some(())
        })
        .await;
    }
    let mut back = plugin("blog", "allow", &url, &sha, &[9090, 9092], None);
    back["spec"]["rollout"] = json!({"stages": [{"nodes": 1, "bake": "1s"}]});
    api.apply(back).unwrap();
    let reverted = generation(&api, "blog", "allow");
    until_status(
        &api,
        "blog",
        "allow",
        "Ready again on the stable version",
        |s| ready_on(s, 3, reverted),
    )
    .await;

    // Kill the leader, which serves nodes a and b: they move to replica 2 and keep what they run, untouched.
    let mut kept = Vec::new();
    for n in [&a, &b] {
        let src = plugin_source(n).await.unwrap();
        kept.push((
            serving(n).await.unwrap(),
            plugin_loads(n).await,
            src["connections"].as_u64().unwrap(),
        ));
    }
    r1.kill();
    assert!(!r1.running());
    eventually(WAIT, "replica 2 takes the Lease", || async {
        (lease_holder(&api).as_deref() == Some("weft-control-2")).then_some(())
    })
    .await;
    for (n, (plugins, loaded, connections)) in [&a, &b].into_iter().zip(&kept) {
        eventually(
            WAIT,
            &format!("{} reconnected to replica 2", n.name),
            || async {
                plugin_source(n).await.filter(|s| {
                    s["connected"] == true && s["connections"].as_u64() > Some(*connections)
                })
            },
        )
        .await;
        assert_eq!(
            serving(n).await.as_ref(),
            Some(plugins),
            "{}: a plugin changed on the move",
            n.name
        );
        assert_eq!(
            &plugin_loads(n).await,
            loaded,
            "{}: a plugin was loaded again on the move",
            n.name
        );
        assert!(loaded.len() >= 2, "{}: {loaded:?}", n.name);
    }

    // Status writing moved with the Lease: an edit made now shows in the status, written by replica 2.
    api.apply(plugin("blog", "allow", &url, &sha, &[9090, 9091], None))
        .unwrap();
    let s = until_status(
        &api,
        "blog",
        "allow",
        "Ready at the next generation after the failover",
        |s| ready_on(s, 3, reverted + 1),
    )
    .await;
    assert_eq!(generation(&api, "blog", "allow"), reverted + 1, "{s}");
    let r2_log = std::fs::read_to_string(d.join("weft-control-2.log")).unwrap();
    assert!(
        r2_log.contains("leading: this replica writes WeftPlugin status"),
        "{r2_log}"
    );
    drop(r2);
}
