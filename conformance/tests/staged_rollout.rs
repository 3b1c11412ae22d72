//! Staged rollout end to end: a real `weft-control` serves a plugin directory to ten real `weft run` nodes, each
//! hosting a server workload, while a client on node-0 connects to all of them. A version that would deny a port
//! the serving one allows runs as a shadow on the first stage's node and the rollout aborts there, its divergence
//! report naming the port and the workloads, with no connection refused; a good version goes stage by stage to all
//! ten nodes, through a weft-control restart that resumes at the same stage; a version that traps is rolled back
//! by the first stage's nodes and every node ends on the previous sha256.
#![allow(clippy::unwrap_used)] // a test panics to fail

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use serde_json::Value;
use weft_conformance::eventually;
use weft_devmesh::control::{Control, free_port, plugin_xds_flags, write_tokens, xds_flags};
use weft_devmesh::{NodeOptions, NodeProcess, socks5, workload};
use weft_plugin_host::testing::build_plugin;

const NODES: usize = 10;
const WAIT: Duration = Duration::from_secs(90);

fn node_ip(i: usize) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 244, 200 + i as u8))
}

fn server_ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(127, 0, 244, 10 + i as u8)
}

const CLIENT: Ipv4Addr = Ipv4Addr::new(127, 0, 244, 1);

fn mesh_yaml() -> String {
    let mut y = format!(
        "workloads:\n- uid: Kubernetes//Pod/default/client\n  name: client\n  namespace: default\n  \
         serviceAccount: client\n  workloadIps: [{CLIENT}]\n  protocol: HBONE\n  node: node-0\n  services: {{}}\n"
    );
    for i in 0..NODES {
        y.push_str(&format!(
            "- uid: Kubernetes//Pod/default/server-{i}\n  name: server-{i}\n  namespace: default\n  \
             serviceAccount: server\n  workloadIps: [{}]\n  protocol: HBONE\n  node: node-{i}\n  services: {{}}\n",
            server_ip(i)
        ));
    }
    y
}

fn sha256_of(path: &Path) -> String {
    weft_fetch::sha256_hex(&std::fs::read(path).unwrap())
}

/// Write `file` in the plugin directory atomically.
fn put(dir: &Path, file: &str, text: &str) {
    let tmp = dir.join(format!(".{file}.tmp"));
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, dir.join(file)).unwrap();
}

fn allowlist(code: &str, config: &str, rollout: &str) -> String {
    format!(
        "apiVersion: weft.dev/v1alpha1\nkind: WeftPlugin\nmetadata:\n  name: allowlist\nspec:\n  url: file://{code}\n  \
         pluginConfig: {config}\n  kind: policy\n  directions: [inbound]\n{rollout}"
    )
}

async fn status(addr: SocketAddr) -> Option<Value> {
    let (code, body) = weft_devmesh::http::get(addr, "/status").await.ok()?;
    (code == 200).then(|| serde_json::from_str(&body).ok())?
}

fn record(s: &Value) -> &Value {
    &s["rollouts"]["plugins"]["allowlist"]
}

/// Node name → the version of `allowlist` it ACKed.
fn versions(s: &Value) -> BTreeMap<String, String> {
    s["nodes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|n| {
            let v = n["plugins"]["allowlist"]["version"].as_str()?;
            Some((n["name"].as_str()?.to_owned(), v.to_owned()))
        })
        .collect()
}

/// Wait until every node ACKed `version`.
async fn until_all_run(addr: SocketAddr, version: &str, what: &str) -> Value {
    eventually(WAIT, what, || async {
        let s = status(addr).await?;
        let v = versions(&s);
        (v.len() == NODES && v.values().all(|x| x == version)).then_some(s)
    })
    .await
}

/// Wait until the rollout satisfies `pred`.
async fn until_rollout(addr: SocketAddr, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
    let last = std::sync::Mutex::new(Value::Null);
    let found = tokio::time::timeout(
        WAIT,
        eventually(WAIT + Duration::from_secs(1), what, || async {
            let s = status(addr).await?;
            *last.lock().unwrap() = record(&s).clone();
            pred(&record(&s)["rollout"]).then_some(s)
        }),
    )
    .await;
    found.unwrap_or_else(|_| {
        panic!(
            "timed out waiting for {what}; the rollout: {:#}",
            last.lock().unwrap()
        )
    })
}

/// Connections from the client (node-0) to every server on `port`, round after round until stopped; counts
/// what got through and what did not.
struct Traffic {
    stop: Arc<AtomicBool>,
    ok: Arc<AtomicU64>,
    failed: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Traffic {
    fn start(socks: SocketAddr, port: u16) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let (ok, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let (s, o, f) = (stop.clone(), ok.clone(), failed.clone());
        let task = tokio::spawn(async move {
            while !s.load(Ordering::Relaxed) {
                for i in 0..NODES {
                    let dst = SocketAddr::new(IpAddr::V4(server_ip(i)), port);
                    let r = match socks5::connect(socks, Some(IpAddr::V4(CLIENT)), dst).await {
                        Ok(c) => workload::round_trip(c, b"staged")
                            .await
                            .map_err(|e| e.to_string()),
                        Err(e) => Err(format!("{e:?}")),
                    };
                    match r {
                        Ok(b) if b == b"staged" => o.fetch_add(1, Ordering::Relaxed),
                        _ => f.fetch_add(1, Ordering::Relaxed),
                    };
                }
                // Yield between rounds (the machine has two cores and twelve processes).
                tokio::task::yield_now().await;
            }
        });
        Self {
            stop,
            ok,
            failed,
            task,
        }
    }

    async fn stop(self) -> (u64, u64) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.task.await;
        (
            self.ok.load(Ordering::Relaxed),
            self.failed.load(Ordering::Relaxed),
        )
    }
}

fn timeline(r: &Value) -> Vec<String> {
    r["timeline"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| {
            format!(
                "{:>7.2}s stage {}: {}",
                e["afterSeconds"].as_f64().unwrap_or(-1.0),
                e["stage"],
                e["event"].as_str().unwrap_or("")
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_divergent_version_stops_at_its_first_stage_a_good_one_reaches_every_node_a_trapping_one_aborts()
 {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let ca = d.join("ca");
    weft_devmesh::write_dev_ca(&ca, "cluster.local").unwrap();
    let names: Vec<String> = (0..NODES).map(|i| format!("node-{i}")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let tokens = write_tokens(d, &refs).unwrap();
    let mesh = d.join("mesh.yaml");
    std::fs::write(&mesh, mesh_yaml()).unwrap();
    let plugins: PathBuf = d.join("plugins");
    std::fs::create_dir_all(&plugins).unwrap();
    let allow = build_plugin("plugins/port-allowlist").unwrap();
    let misbehave = build_plugin("plugins/testdata/misbehave").unwrap();
    std::fs::copy(&allow, plugins.join("allowlist.wasm")).unwrap();
    std::fs::copy(&misbehave, plugins.join("misbehave.wasm")).unwrap();
    let (allow_sha, misbehave_sha) = (sha256_of(&allow), sha256_of(&misbehave));
    let mut echo = Vec::new();
    for i in 0..NODES {
        let (_, t) = workload::echo_server(SocketAddr::new(IpAddr::V4(server_ip(i)), 8080))
            .await
            .unwrap();
        echo.push(t);
    }

    let addr = free_port().unwrap();
    let status_addr = free_port().unwrap();
    let metrics_addr = free_port().unwrap();
    let mut args = Control::args(addr, &ca, &tokens, &mesh, Some(&plugins), Some(status_addr));
    let state = d.join("rollouts.json");
    args.extend(["--rollout-state".to_owned(), state.display().to_string()]);
    let metrics_flag = args.iter().position(|a| a == "--metrics").unwrap();
    args[metrics_flag + 1] = metrics_addr.to_string();
    // v1: ports [8080], served at once.
    put(
        &plugins,
        "allowlist.yaml",
        &allowlist("allowlist.wasm", "{ports: [8080, 666]}", ""),
    );
    let mut control = Control::with_args(
        &weft_devmesh::control_binary().unwrap(),
        addr,
        args,
        &d.join("control.log"),
    )
    .unwrap();
    let root = ca.join("root-cert.pem");
    let mut nodes = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let mut o = NodeOptions::loopback(name, node_ip(i), Path::new(""), &ca, d);
        let token = d.join(format!("{name}.token"));
        o.extra.extend(xds_flags(addr, &root, &token, name));
        o.extra.extend(plugin_xds_flags(addr, &root, &token));
        o.extra
            .extend(["--plugin-shadow-report-interval".into(), "100ms".into()]);
        nodes.push(NodeProcess::spawn(&weft_devmesh::weft_binary().unwrap(), &o).unwrap());
    }
    for n in &mut nodes {
        n.wait_ready(WAIT).await.unwrap();
    }
    let s = eventually(WAIT, "v1 is the stable version", || async {
        let s = status(status_addr).await?;
        record(&s)["stable"]["version"].is_string().then_some(s)
    })
    .await;
    let v1 = record(&s)["stable"]["version"].as_str().unwrap().to_owned();
    until_all_run(status_addr, &v1, "every node runs v1").await;

    // v2 would deny 8080: as a shadow on the first stage's one node, it diverges on the connections to that
    // node's server, and the rollout aborts there. The serving version decides: nothing is refused.
    let traffic = Traffic::start(nodes[0].socks5, 8080);
    put(
        &plugins,
        "allowlist.yaml",
        &allowlist(
            "allowlist.wasm",
            "{ports: [9999]}",
            "  rollout:\n    stages:\n    - {nodes: 1, bake: 10m, shadowFirst: true}\n    - {percent: 100, bake: 1s}\n    \
             abortWhen: {divergenceRatio: 0.05, minCalls: 5}\n",
        ),
    );
    let s = until_rollout(status_addr, "v2 aborted", |r| r["state"] == "aborted").await;
    let (ok, failed) = traffic.stop().await;
    let r = &record(&s)["rollout"];
    println!("divergent version:\n{}", timeline(r).join("\n"));
    let abort = &r["abort"];
    assert_eq!(abort["stage"], 1, "{r}");
    assert_eq!(abort["phase"], "shadow", "{r}");
    assert_eq!(abort["nodes"].as_array().unwrap().len(), 1, "{r}");
    let why = abort["reason"].as_str().unwrap();
    assert!(
        why.contains("shadow divergence ratio")
            && why.contains(":8080")
            && why.contains("default/client -> default/server-")
            && why.contains("port 8080"),
        "{why}"
    );
    let f = &r["figures"];
    println!(
        "divergence: {} of {} shadow decisions; connections {ok} ok, {failed} failed",
        f["divergences"], f["decisions"]
    );
    assert!(f["divergences"].as_u64().unwrap() >= 5, "{f}");
    assert_eq!(failed, 0, "the shadow changed no verdict");
    assert!(ok > 0);
    // Every node back on v1; the other nine never left it.
    until_all_run(status_addr, &v1, "every node back on v1 after the abort").await;

    // v3 allows 8080 and 9999: stage by stage to all ten, with weft-control restarted in stage 2.
    let traffic = Traffic::start(nodes[0].socks5, 8080);
    put(
        &plugins,
        "allowlist.yaml",
        &allowlist(
            "allowlist.wasm",
            "{ports: [8080, 9999, 666]}",
            "  rollout:\n    stages:\n    - {nodes: 1, bake: 1s}\n    - {percent: 50, bake: 5s}\n    \
             - {percent: 100, bake: 1s}\n    abortWhen: {failureRatio: 0.01}\n",
        ),
    );
    let s = until_rollout(status_addr, "v3 baking stage 2", |r| {
        r["state"] == "progressing" && r["stage"] == 1 && r["readyAtMs"].is_u64()
    })
    .await;
    let before = record(&s)["rollout"].clone();
    let v3 = before["targetVersion"].as_str().unwrap().to_owned();
    let half = versions(&s).values().filter(|v| **v == v3).count();
    assert_eq!(half, NODES / 2, "{s}");
    control.restart().unwrap();
    let s = eventually(WAIT, "weft-control back, with the rollout", || async {
        let s = status(status_addr).await?;
        record(&s)["rollout"].is_object().then_some(s)
    })
    .await;
    let after = &record(&s)["rollout"];
    assert_eq!(after["targetVersion"], v3.as_str(), "{after}");
    assert_eq!(
        after["startedAtMs"], before["startedAtMs"],
        "resumed, not restarted"
    );
    assert!(after["stage"].as_u64().unwrap() >= 1, "{after}");
    assert_eq!(after["timeline"][0], before["timeline"][0]);
    let s = until_rollout(status_addr, "v3 complete", |r| r["state"] == "complete").await;
    let (ok, failed) = traffic.stop().await;
    let r = &record(&s)["rollout"];
    println!("good version:\n{}", timeline(r).join("\n"));
    println!("connections during it: {ok} ok, {failed} failed");
    let starts = r["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["event"].as_str().unwrap().starts_with("started"))
        .count();
    assert_eq!(starts, 1, "{r}");
    let resumed = r["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| {
            e["event"]
                .as_str()
                .unwrap()
                .starts_with("weft control restarted")
        })
        .unwrap_or_else(|| panic!("no resume in the timeline: {r}"));
    assert!(resumed["stage"].as_u64().unwrap() >= 2, "{resumed}");
    assert_eq!(record(&s)["stable"]["version"], v3.as_str());
    until_all_run(status_addr, &v3, "every node runs v3").await;
    assert_eq!(failed, 0);

    // v4 traps on port 666: the first stage's two nodes roll it back on their own, the rollout aborts, and every
    // node serves v3's code again.
    let traffic = Traffic::start(nodes[0].socks5, 666);
    put(
        &plugins,
        "allowlist.yaml",
        &allowlist(
            "misbehave.wasm",
            "trap",
            "  rollout:\n    window: 10m\n    maxFailureRatio: 0.5\n    minCalls: 4\n    stages:\n    \
             - {nodes: 2, bake: 10m}\n    - {percent: 100, bake: 1s}\n",
        ),
    );
    let s = until_rollout(status_addr, "v4 aborted", |r| {
        r["state"] == "aborted" && r["targetSha256"] == misbehave_sha.as_str()
    })
    .await;
    traffic.stop().await;
    let r = &record(&s)["rollout"];
    println!("trapping version:\n{}", timeline(r).join("\n"));
    assert_eq!(r["abort"]["stage"], 1, "{r}");
    assert!(
        r["abort"]["reason"]
            .as_str()
            .unwrap()
            .contains("rolled the version back"),
        "{r}"
    );
    assert_eq!(r["previousSha256"], allow_sha.as_str());
    // And as metrics.
    let (_, metrics) = weft_devmesh::http::get(metrics_addr, "/metrics")
        .await
        .unwrap();
    for line in [
        "weft_control_rollout_state{plugin=\"allowlist\",state=\"aborted\"} 1",
        "weft_control_rollout_stage{plugin=\"allowlist\"} 1",
        "weft_control_rollout_nodes{plugin=\"allowlist\"} 2",
    ] {
        assert!(metrics.contains(line), "no {line} in {metrics}");
    }
    let s = until_all_run(status_addr, &v3, "every node back on v3").await;
    for n in s["nodes"].as_array().unwrap() {
        if n["plugins"]["allowlist"].is_object() {
            assert_eq!(
                n["plugins"]["allowlist"]["sha256"],
                allow_sha.as_str(),
                "{n}"
            );
        }
    }
    // And on the nodes themselves.
    for n in &nodes {
        let dump = n.config_dump().await.unwrap();
        let p = dump["plugins"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == "allowlist")
            .cloned()
            .unwrap();
        assert_eq!(p["sha256"], allow_sha.as_str(), "{}: {p}", n.name);
    }
    drop(echo);
}
