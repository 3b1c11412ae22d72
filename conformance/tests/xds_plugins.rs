//! Plugins over xDS, end to end: a real `weft-control` serves `WeftPlugin` files (code inline from the directory,
//! or pulled by the nodes from a real OCI registry) to two real `weft run` processes over TLS. A pushed plugin runs
//! on both nodes and changes the verdict of the next connection; a broken one is NACKed with its reason while the
//! rest of the batch applies and a live connection keeps flowing; a pinned sha256 that does not match the pulled
//! image is refused; a new version that starts trapping is rolled back and reported, a healthy one is not; a shadow
//! version that would deny what the serving one allows changes no verdict and its divergences show on the node
//! and, reported over the plugin stream, in weft-control's `/status`; promoting and discarding it are edits.
#![allow(clippy::unwrap_used)] // a test panics to fail

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;
use weft_conformance::xdsmesh::{MeshOptions, XdsMesh, echo_once, ping, plugin_loads, until_dump};
use weft_conformance::{Addrs, eventually, mesh_yaml};
use weft_devmesh::{NodeProcess, socks5};
use weft_plugin_host::testing::build_plugin;

fn wasm(name: &str) -> PathBuf {
    build_plugin(format!("plugins/{name}"))
        .unwrap_or_else(|e| panic!("building plugin {name}: {e}"))
}

fn sha256_of(path: &Path) -> String {
    weft_fetch::sha256_hex(&std::fs::read(path).unwrap())
}

/// A WeftPlugin document.
fn weft_plugin(name: &str, url: &str, config: &str, extra: &str) -> String {
    format!(
        "apiVersion: weft.dev/v1alpha1\nkind: WeftPlugin\nmetadata:\n  name: {name}\nspec:\n  url: {url}\n  \
         pluginConfig: {config}\n  kind: policy\n  directions: [inbound]\n{extra}"
    )
}

/// Write `file` in the plugin directory atomically (as a ConfigMap update lands).
fn put(dir: &Path, file: &str, text: &str) {
    let tmp = dir.join(format!(".{file}.tmp"));
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, dir.join(file)).unwrap();
}

/// Copy a built module into the plugin directory under `file`.
fn put_code(dir: &Path, file: &str, built: &Path) {
    let tmp = dir.join(format!(".{file}.tmp"));
    std::fs::copy(built, &tmp).unwrap();
    std::fs::rename(&tmp, dir.join(file)).unwrap();
}

/// The status of plugin `name` in a node's `/config_dump`.
fn plugin<'a>(dump: &'a Value, name: &str) -> Option<&'a Value> {
    dump["plugins"]
        .as_array()?
        .iter()
        .find(|p| p["name"] == name)
}

/// The node's plugin source (`sources.xds[name=plugins]`), its extension-config type status.
fn ecds(dump: &Value) -> Option<&Value> {
    dump["sources"]["xds"]
        .as_array()?
        .iter()
        .find(|s| s["name"] == "plugins")?["types"]
        .as_array()?
        .iter()
        .find(|t| t["typeUrl"] == "type.googleapis.com/envoy.config.core.v3.TypedExtensionConfig")
}

/// Wait until plugin `name` serves code `sha` on `node`.
async fn until_serving(node: &NodeProcess, name: &str, sha: &str) -> Value {
    until_dump(node, &format!("{name} serving {sha}"), |d| {
        plugin(d, name).is_some_and(|p| p["sha256"] == sha && p["state"] == "serving")
    })
    .await
}

/// A mesh whose plugins come from `weft-control`'s directory (returned too).
async fn plugin_mesh(a: Addrs, extra: Vec<String>) -> (XdsMesh, PathBuf) {
    let plugins = tempfile::tempdir().unwrap().keep();
    let mesh = XdsMesh::start_with(
        a,
        &mesh_yaml(a, "echo"),
        &[IpAddr::V4(a.echo())],
        MeshOptions {
            plugins_dir: Some(plugins.clone()),
            node_extra: extra,
        },
    )
    .await
    .unwrap();
    (mesh, plugins)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pushed_plugin_runs_on_both_nodes_and_decides_the_next_connection() {
    let a = Addrs { n: 170 };
    let allow = wasm("port-allowlist");
    let (mesh, dir) = plugin_mesh(a, vec![]).await;
    let echo = SocketAddr::new(IpAddr::V4(a.echo()), 8080);
    // Ready means the plugin source synced too (an empty directory is an empty, complete answer).
    for node in [&mesh.a, &mesh.b] {
        let d = node.config_dump().await.unwrap();
        assert_eq!(ecds(&d).unwrap()["synced"], true, "{d}");
    }
    echo_once(&mesh.a, a, echo).await.unwrap();

    put_code(&dir, "allowlist.wasm", &allow);
    put(
        &dir,
        "allowlist.yaml",
        &weft_plugin("allowlist", "file://allowlist.wasm", "{ports: [9999]}", ""),
    );
    let sha = sha256_of(&allow);
    for node in [&mesh.a, &mesh.b] {
        until_serving(node, "allowlist", &sha).await;
    }
    // Node B's inbound now refuses port 8080; the ACK came only once the plugin served, so the very next
    // connection sees it.
    let err = echo_once(&mesh.a, a, echo).await.unwrap_err();
    assert!(!err.is_empty());
    let d = mesh.b.config_dump().await.unwrap();
    assert!(
        plugin(&d, "allowlist").unwrap()["denials"]
            .as_u64()
            .unwrap()
            >= 1,
        "{d}"
    );

    // A configuration change alone is pushed and applied the same way.
    put(
        &dir,
        "allowlist.yaml",
        &weft_plugin("allowlist", "file://allowlist.wasm", "{ports: [8080]}", ""),
    );
    eventually(Duration::from_secs(30), "8080 allowed again", || async {
        echo_once(&mesh.a, a, echo).await.ok()
    })
    .await;
    // weft-control recorded both nodes' ACKs of the extension configs.
    let acks: Vec<String> = mesh
        .control
        .log_lines()
        .iter()
        .filter(|l| {
            l["message"] == "ACK"
                && l["type"]
                    .as_str()
                    .is_some_and(|t| t.contains("TypedExtensionConfig"))
        })
        .filter_map(|l| l["node"].as_str().map(str::to_owned))
        .collect();
    for n in ["node-a", "node-b"] {
        assert!(
            acks.iter().any(|id| id.contains(&format!("weft-{n}"))),
            "no ACK from {n}: {acks:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_plugin_is_nacked_with_its_reason_while_the_rest_applies_and_traffic_flows() {
    let a = Addrs { n: 172 };
    let allow = wasm("port-allowlist");
    let (mesh, dir) = plugin_mesh(a, vec![]).await;
    let echo = SocketAddr::new(IpAddr::V4(a.echo()), 8080);
    let mut live = socks5::connect(mesh.a.socks5, Some(IpAddr::V4(a.client())), echo)
        .await
        .unwrap();
    ping(&mut live).await.unwrap();

    // One push, two plugins: one good, one whose code is not Wasm.
    put_code(&dir, "allowlist.wasm", &allow);
    std::fs::write(dir.join("broken.wasm"), b"this is not a wasm component").unwrap();
    put(
        &dir,
        "plugins.yaml",
        &format!(
            "{}---\n{}",
            weft_plugin("allowlist", "file://allowlist.wasm", "{ports: [8080]}", ""),
            weft_plugin("broken", "file://broken.wasm", "{}", "")
        ),
    );
    let sha = sha256_of(&allow);
    for node in [&mesh.a, &mesh.b] {
        until_serving(node, "allowlist", &sha).await;
        let d = until_dump(node, "the broken plugin NACKed", |d| {
            ecds(d).is_some_and(|t| {
                t["lastNack"]["error"]
                    .as_str()
                    .is_some_and(|e| e.contains("broken:"))
            })
        })
        .await;
        let error = ecds(&d).unwrap()["lastNack"]["error"]
            .as_str()
            .unwrap()
            .to_owned();
        assert!(
            !error.contains("allowlist"),
            "only the broken one is refused: {error}"
        );
        assert!(
            plugin(&d, "broken").is_none_or(|p| p["state"] != "serving"),
            "{d}"
        );
    }
    ping(&mut live).await.unwrap();
    echo_once(&mesh.a, a, echo).await.unwrap();

    // A broken new version of a serving plugin: NACKed, and the previous version keeps serving.
    std::fs::write(dir.join("allowlist-v2.wasm"), b"\0asm garbage").unwrap();
    put(
        &dir,
        "plugins.yaml",
        &weft_plugin(
            "allowlist",
            "file://allowlist-v2.wasm",
            "{ports: [9999]}",
            "",
        ),
    );
    let d = until_dump(&mesh.b, "the broken version NACKed", |d| {
        ecds(d).is_some_and(|t| {
            t["lastNack"]["error"]
                .as_str()
                .is_some_and(|e| e.contains("allowlist:"))
        })
    })
    .await;
    assert_eq!(
        plugin(&d, "allowlist").unwrap()["sha256"],
        sha.as_str(),
        "{d}"
    );
    // Still the old configuration (8080 allowed), and the live connection never noticed.
    echo_once(&mesh.a, a, echo).await.unwrap();
    ping(&mut live).await.unwrap();
    // weft-control logged the NACKs with the reason.
    assert!(
        mesh.control
            .log_lines()
            .iter()
            .any(|l| l["message"] == "NACK"
                && l["error"].as_str().is_some_and(|e| e.contains("broken:"))),
        "no NACK naming the broken plugin in weft-control's log"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugins_pulled_from_a_real_oci_registry_and_a_sha256_mismatch_refused() {
    use weft_fetch::testing::{Registry, TestCa, oci_client, push_artifact};
    let a = Addrs { n: 174 };
    let allow = wasm("port-allowlist");
    let ca = TestCa::new("registry CA");
    let reg = Registry::start(&ca, None).await;
    let roots = ca.write(reg.dir.path());
    let code = std::fs::read(&allow).unwrap();
    let auth = oci_client::secrets::RegistryAuth::Anonymous;
    let digest = push_artifact(
        &oci_client(&ca),
        &format!("{}/weft/allowlist:v1", reg.addr),
        &code,
        &auth,
    )
    .await;
    let (mesh, dir) = plugin_mesh(
        a,
        vec!["--plugin-fetch-roots".into(), roots.display().to_string()],
    )
    .await;
    let echo = SocketAddr::new(IpAddr::V4(a.echo()), 8080);
    let sha = weft_fetch::sha256_hex(&code);

    // By tag, the module pinned by its sha256.
    put(
        &dir,
        "allowlist.yaml",
        &weft_plugin(
            "allowlist",
            &format!("oci://{}/weft/allowlist:v1", reg.addr),
            "{ports: [9999]}",
            &format!("  sha256: {sha}\n"),
        ),
    );
    for node in [&mesh.a, &mesh.b] {
        until_serving(node, "allowlist", &sha).await;
    }
    assert!(echo_once(&mesh.a, a, echo).await.is_err());

    // By digest, a new configuration.
    put(
        &dir,
        "allowlist.yaml",
        &weft_plugin(
            "allowlist",
            &format!("oci://{}/weft/allowlist@{digest}", reg.addr),
            "{ports: [8080]}",
            "",
        ),
    );
    eventually(
        Duration::from_secs(30),
        "8080 allowed by the digest pull",
        || async { echo_once(&mesh.a, a, echo).await.ok() },
    )
    .await;

    // A pinned sha256 the image's module does not have: refused, the previous version keeps serving.
    let wrong = "0".repeat(64);
    put(
        &dir,
        "allowlist.yaml",
        &weft_plugin(
            "allowlist",
            &format!("oci://{}/weft/allowlist:v1", reg.addr),
            "{ports: [9999]}",
            &format!("  sha256: {wrong}\n"),
        ),
    );
    for node in [&mesh.a, &mesh.b] {
        let d = until_dump(node, "the sha256 mismatch NACKed", |d| {
            ecds(d).is_some_and(|t| {
                t["lastNack"]["error"]
                    .as_str()
                    .is_some_and(|e| e.contains("allowlist:") && e.contains(&wrong))
            })
        })
        .await;
        assert_eq!(
            plugin(&d, "allowlist").unwrap()["sha256"],
            sha.as_str(),
            "{d}"
        );
    }
    echo_once(&mesh.a, a, echo).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_that_starts_trapping_is_rolled_back_and_reported_a_healthy_one_is_not() {
    let a = Addrs { n: 176 };
    let allow = wasm("port-allowlist");
    let misbehave = wasm("testdata/misbehave");
    let (mesh, dir) = plugin_mesh(a, vec![]).await;
    put_code(&dir, "allowlist.wasm", &allow);
    put_code(&dir, "misbehave.wasm", &misbehave);
    let rollout = "  rollout: {window: 10m, maxFailureRatio: 0.5, minCalls: 4}\n";
    let (allow_sha, misbehave_sha) = (sha256_of(&allow), sha256_of(&misbehave));
    // Port 666: misbehave's port. Nothing listens there; the inbound policy decides before the dial.
    let port666 = SocketAddr::new(IpAddr::V4(a.echo()), 666);
    let echo = SocketAddr::new(IpAddr::V4(a.echo()), 8080);
    let calls_to_666 = |n: usize| {
        let node = &mesh.a;
        async move {
            for _ in 0..n {
                let _ = echo_once(node, a, port666).await;
            }
        }
    };

    // Healthy: v1 allows 666, v2 (new code) denies it cleanly. Probation sees no failure: no rollback.
    put(
        &dir,
        "steady.yaml",
        &weft_plugin(
            "steady",
            "file://allowlist.wasm",
            "{ports: [666, 8080]}",
            rollout,
        ),
    );
    until_serving(&mesh.b, "steady", &allow_sha).await;
    put(
        &dir,
        "steady.yaml",
        &weft_plugin("steady", "file://misbehave.wasm", "deny-666", rollout),
    );
    until_serving(&mesh.b, "steady", &misbehave_sha).await;
    calls_to_666(6).await;
    let d = until_dump(&mesh.b, "six clean denials on probation", |d| {
        plugin(d, "steady").is_some_and(|p| p["denials"].as_u64().unwrap_or(0) >= 6)
    })
    .await;
    let p = plugin(&d, "steady").unwrap();
    assert_eq!(p["sha256"], misbehave_sha.as_str(), "{p}");
    assert_eq!(p["onProbation"], true, "{p}");
    assert!(p["rolledBack"].is_null(), "{p}");
    assert!(p["errors"].as_object().is_none_or(|e| e.is_empty()), "{p}");
    echo_once(&mesh.a, a, echo).await.unwrap();
    std::fs::remove_file(dir.join("steady.yaml")).unwrap();
    until_dump(&mesh.b, "steady removed", |d| plugin(d, "steady").is_none()).await;

    // Trapping: v1 allows 666, v2 traps on it. Past 4 calls at > 50% failures the node swaps v1 back.
    put(
        &dir,
        "canary.yaml",
        &weft_plugin(
            "canary",
            "file://allowlist.wasm",
            "{ports: [666, 8080]}",
            rollout,
        ),
    );
    until_serving(&mesh.b, "canary", &allow_sha).await;
    put(
        &dir,
        "canary.yaml",
        &weft_plugin("canary", "file://misbehave.wasm", "trap", rollout),
    );
    until_serving(&mesh.b, "canary", &misbehave_sha).await;
    calls_to_666(6).await;
    let d = until_dump(&mesh.b, "canary rolled back", |d| {
        plugin(d, "canary").is_some_and(|p| p["sha256"] == allow_sha.as_str())
    })
    .await;
    let p = plugin(&d, "canary").unwrap();
    assert_eq!(
        p["rolledBack"]["rolledBackSha256"],
        misbehave_sha.as_str(),
        "{p}"
    );
    // Reported to the control plane as a NACK with the figures.
    let t = ecds(&d).unwrap();
    assert_eq!(t["lastNack"]["solicited"], false, "{t}");
    assert!(
        t["lastNack"]["error"].as_str().unwrap().contains("canary:"),
        "{t}"
    );
    let logged = eventually(
        Duration::from_secs(30),
        "weft-control logs the rollback",
        || async {
            mesh.control
                .log_lines()
                .into_iter()
                .find(|l| l["message"] == "node rolled a plugin version back")
        },
    )
    .await;
    assert_eq!(logged["plugin"], "canary", "{logged}");
    assert_eq!(logged["rolled_back"], misbehave_sha.as_str(), "{logged}");
    assert!(logged["failures"].as_u64().unwrap() >= 2, "{logged}");
    // Node A never called it (inbound only): no rollback there. (Node A applies the push on its own time: wait
    // for it to serve the version instead of reading its dump once.)
    let da = until_serving(&mesh.a, "canary", &misbehave_sha).await;
    assert_eq!(
        plugin(&da, "canary").unwrap()["sha256"],
        misbehave_sha.as_str(),
        "{da}"
    );
    // 666 is allowed again by the restored version (the dial then fails: nothing listens), and 8080 flows.
    echo_once(&mesh.a, a, echo).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_that_would_deny_changes_no_verdict_and_its_divergences_show_on_the_node() {
    let a = Addrs { n: 180 };
    let allow = wasm("port-allowlist");
    let (mesh, dir) = plugin_mesh(
        a,
        vec!["--plugin-shadow-report-interval".into(), "100ms".into()],
    )
    .await;
    let echo = SocketAddr::new(IpAddr::V4(a.echo()), 8080);

    // Serving: 8080 allowed. Shadow: the same code allowing only 9999 (so it would deny 8080).
    put_code(&dir, "allowlist.wasm", &allow);
    put(
        &dir,
        "allowlist.yaml",
        &weft_plugin(
            "allowlist",
            "file://allowlist.wasm",
            "{ports: [8080]}",
            "  shadow:\n    url: file://allowlist.wasm\n    pluginConfig: {ports: [9999]}\n",
        ),
    );
    let sha = sha256_of(&allow);
    for node in [&mesh.a, &mesh.b] {
        let d = until_serving(node, "allowlist", &sha).await;
        assert!(
            plugin(&d, "allowlist").unwrap()["shadow"].is_object(),
            "the shadow is loaded beside the serving version: {d}"
        );
    }
    // The serving verdict is what the connections get: all succeed.
    for _ in 0..3 {
        echo_once(&mesh.a, a, echo).await.unwrap();
    }
    // The destination node (B, inbound) counted the divergences and sampled one naming the port.
    let d = until_dump(&mesh.b, "3 divergences (serving allow, shadow deny)", |d| {
        plugin(d, "allowlist").is_some_and(|p| {
            p["shadow"]["decisions"].as_array().is_some_and(|c| {
                c.iter().any(|c| {
                    c["direction"] == "inbound"
                        && c["serving"] == "allow"
                        && c["shadow"] == "deny"
                        && c["count"].as_u64().is_some_and(|n| n >= 3)
                })
            })
        })
    })
    .await;
    let shadow = &plugin(&d, "allowlist").unwrap()["shadow"];
    assert_eq!(shadow["sha256"], sha.as_str(), "{shadow}");
    assert_eq!(shadow["skipped"], 0, "{shadow}");
    let sample = shadow["samples"]
        .as_array()
        .and_then(|s| s.last())
        .unwrap_or_else(|| panic!("no divergence sample: {shadow}"));
    assert_eq!(sample["serving"], "allow", "{sample}");
    assert_eq!(sample["shadow"], "deny", "{sample}");
    assert_eq!(sample["dstPort"], 8080, "{sample}");
    assert!(
        sample["shadowReason"]
            .as_str()
            .is_some_and(|r| r.contains("port 8080")),
        "{sample}"
    );
    assert!(
        plugin(&d, "allowlist").unwrap()["denials"].as_u64() == Some(0),
        "the serving version denied nothing: {d}"
    );
    // And as metrics.
    let text = mesh.b.scrape().await.unwrap();
    let line = text
        .lines()
        .find(|l| {
            l.starts_with("weft_plugin_shadow_decisions_total{")
                && l.contains(r#"plugin="allowlist""#)
                && l.contains(r#"direction="inbound""#)
                && l.contains(r#"serving="allow""#)
                && l.contains(r#"shadow="deny""#)
        })
        .unwrap_or_else(|| panic!("no shadow decisions series: {text}"));
    let n: f64 = line
        .rsplit(' ')
        .next()
        .and_then(|v| v.parse().ok())
        .unwrap();
    assert!(n >= 3.0, "{line}");

    // And reported to weft-control, whose /status shows node B's figures and the sample.
    let status = eventually(
        Duration::from_secs(30),
        "node-b's shadow report in weft-control's /status",
        || async {
            let (_, body) = weft_devmesh::http::get(mesh.control_status, "/status")
                .await
                .ok()?;
            let doc: Value = serde_json::from_str(&body).ok()?;
            let node = doc["nodes"]
                .as_array()?
                .iter()
                .find(|n| n["name"] == "node-b" && n["shadows"]["allowlist"].is_object())?
                .clone();
            (node["shadows"]["allowlist"]["divergences"].as_u64() >= Some(3)).then_some(node)
        },
    )
    .await;
    let report = &status["shadows"]["allowlist"];
    assert_eq!(report["shadowSha256"], sha.as_str(), "{report}");
    assert_eq!(report["servingSha256"], sha.as_str(), "{report}");
    let sample = report["samples"]
        .as_array()
        .and_then(|s| s.last())
        .unwrap_or_else(|| panic!("no sample reported: {report}"));
    assert!(
        sample["destination"]
            .as_str()
            .is_some_and(|d| d.ends_with(":8080")),
        "{sample}"
    );
    assert!(
        sample["shadowReason"]
            .as_str()
            .is_some_and(|r| r.contains("port 8080")),
        "{sample}"
    );
    // Promote: the shadow's configuration becomes the serving one (an edit; the node swaps it in on probation).
    // 8080 is now refused.
    put(
        &dir,
        "allowlist.yaml",
        &weft_plugin(
            "allowlist",
            "file://allowlist.wasm",
            "{ports: [9999]}",
            "  shadow:\n    url: file://allowlist.wasm\n    pluginConfig: {ports: [8080]}\n",
        ),
    );
    eventually(
        Duration::from_secs(30),
        "the promoted version refuses 8080",
        || async { echo_once(&mesh.a, a, echo).await.is_err().then_some(()) },
    )
    .await;
    // Discard: the same resource without its shadow. The shadow goes from both nodes; the verdicts stay, and the
    // serving version is not loaded again.
    let loads_before = plugin_loads(&mesh.b).await.get("allowlist").copied();
    assert!(loads_before.is_some_and(|n| n >= 2), "{loads_before:?}");
    put(
        &dir,
        "allowlist.yaml",
        &weft_plugin("allowlist", "file://allowlist.wasm", "{ports: [9999]}", ""),
    );
    for node in [&mesh.a, &mesh.b] {
        until_dump(node, "the shadow discarded", |d| {
            plugin(d, "allowlist").is_some_and(|p| p["shadow"].is_null() && p["state"] == "serving")
        })
        .await;
    }
    assert!(echo_once(&mesh.a, a, echo).await.is_err());
    assert_eq!(
        plugin_loads(&mesh.b).await.get("allowlist").copied(),
        loads_before
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_telemetry_shadow_counts_the_same_connections_into_metrics_shadow() {
    let a = Addrs { n: 184 };
    let (mesh, dir) = plugin_mesh(a, vec![]).await;
    let echo = SocketAddr::new(IpAddr::V4(a.echo()), 8080);
    let counter = wasm("conn-counter");
    put_code(&dir, "counter.wasm", &counter);
    put(
        &dir,
        "counter.yaml",
        "apiVersion: weft.dev/v1alpha1\nkind: WeftPlugin\nmetadata:\n  name: counter\nspec:\n  \
         url: file://counter.wasm\n  pluginConfig: {prefix: conns}\n  kind: telemetry\n  shadow:\n    \
         url: file://counter.wasm\n    pluginConfig: {prefix: conns_next}\n",
    );
    let sha = sha256_of(&counter);
    let ready = tokio::time::timeout(
        Duration::from_secs(30),
        until_dump(&mesh.b, "counter and its shadow", |d| {
            plugin(d, "counter")
                .is_some_and(|p| p["sha256"] == sha.as_str() && p["shadow"].is_object())
        }),
    )
    .await;
    if ready.is_err() {
        let d = mesh.b.config_dump().await.unwrap_or_default();
        let (_, st) = weft_devmesh::http::get(mesh.control_status, "/status")
            .await
            .unwrap();
        panic!(
            "no counter with a shadow on node-b: {:#}\n{st}",
            d["plugins"]
        );
    }
    for _ in 0..3 {
        echo_once(&mesh.a, a, echo).await.unwrap();
    }
    // Node B (the destination) counted them in both versions, each in its own exposition.
    let opened = |prefix: &str, text: &str| {
        text.lines()
            .filter(|l| l.starts_with(&format!("{prefix}_opened_total{{direction=\"inbound\"")))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>()
    };
    let shadow = eventually(
        Duration::from_secs(30),
        "3 opens in /metrics/shadow",
        || async {
            let (code, body) = mesh
                .b
                .http(mesh.b.metrics, "GET", "/metrics/shadow")
                .await
                .ok()?;
            (code == 200 && opened("conns_next", &body) >= 3.0).then_some(body)
        },
    )
    .await;
    assert_eq!(opened("conns", &shadow), 0.0, "{shadow}");
    let serving = mesh.b.scrape().await.unwrap();
    assert!(opened("conns", &serving) >= 3.0, "{serving}");
    assert_eq!(opened("conns_next", &serving), 0.0, "{serving}");
}
