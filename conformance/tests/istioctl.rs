//! istioctl compatibility: `istioctl ztunnel-config {workloads,services,policies,certificates,connections,all}`
//! decodes a live weft node's `/config_dump` into istio/istio's own structs and prints every table with no blank
//! column; `POST /logging` answers as ztunnel's.
//!
//! istioctl itself is not run (it needs a Kubernetes API to reach a pod's admin port). Its decoding is: the Go
//! checker in `conformance/istioctl` vendors istioctl's `configdump/api.go` verbatim, decodes the dump with
//! `encoding/json` (case-insensitive keys, numbers into the declared integer types, null allowed) after the same
//! top-level split as istioctl's `ConfigWriter.Prime`, lists every declared non-`omitempty` field the dump lacks,
//! and fills each table's columns from the fields istioctl's printers read. It needs `go` (Debian's `golang-go`,
//! installed by `.ci/run`), and builds offline (standard library only).
#![allow(clippy::unwrap_used)] // a test panics to fail

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use weft_conformance::{Addrs, Mesh, eventually, mesh_yaml};
use weft_devmesh::{NodeProcess, socks5, workload};

/// Build the checker (once per test binary run) under this crate's target tmpdir.
fn checker() -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("istioctl");
    let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join("istioctl-go");
    let bin = root.join("istioctl-check");
    let out = Command::new("go")
        .args(["build", "-o"])
        .arg(&bin)
        .arg(".")
        .current_dir(&src)
        // Offline and self-contained: the installed toolchain only, no module proxy, caches under target/.
        .env("GOTOOLCHAIN", "local")
        .env("GOPROXY", "off")
        .env("GOFLAGS", "")
        .env("GOPATH", root.join("path"))
        .env("GOCACHE", root.join("cache"))
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run `go` ({e}): install Go (Debian: apt-get install golang-go; .ci/run does)")
        });
    assert!(
        out.status.success(),
        "go build of the istioctl checker failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    bin
}

/// Run the checker on `dump`; its report.
fn check(bin: &Path, dump: &serde_json::Value) -> serde_json::Value {
    let mut child = Command::new(bin)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(
        &mut child.stdin.take().unwrap(),
        dump.to_string().as_bytes(),
    )
    .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Assert istioctl decodes `node`'s dump and prints `tables` with at least one row each and no blank cell.
fn assert_clean(name: &str, report: &serde_json::Value, tables: &[&str]) {
    assert_eq!(report["decode"], "ok", "{name}: {report:#}");
    assert_eq!(
        report["missing"],
        serde_json::json!([]),
        "{name}: fields istioctl declares (not omitempty) missing from the dump"
    );
    for t in tables {
        let tab = &report["tables"][t];
        let rows = tab["rows"].as_array().unwrap();
        println!("{name} {t}: {}", tab["columns"]);
        for r in rows {
            println!("  {r}");
        }
        assert!(!rows.is_empty(), "{name}: table {t} is empty: {report:#}");
        assert_eq!(
            tab["blanks"],
            serde_json::json!([]),
            "{name}: blank columns in table {t}: {tab:#}"
        );
    }
}

fn yaml(a: Addrs) -> String {
    // The standard mesh (workloads, the echo service with its endpoint), plus a policy with a presence match.
    format!(
        "{}policies:
- name: authenticated-only
  namespace: default
  scope: Namespace
  action: Allow
  rules:
  - - - principals: [!Presence []]
",
        mesh_yaml(a, "echo")
    )
}

async fn dump_with_connection(node: &NodeProcess, what: &str) -> serde_json::Value {
    eventually(
        std::time::Duration::from_secs(30),
        &format!("{what}: a live connection in workloadState"),
        || async {
            let d = node.config_dump().await.ok()?;
            d["workloadState"]
                .as_object()?
                .values()
                .any(|w| {
                    w["connections"]["inbound"]
                        .as_array()
                        .is_some_and(|c| !c.is_empty())
                        || w["connections"]["outbound"]
                            .as_array()
                            .is_some_and(|c| !c.is_empty())
                })
                .then_some(d)
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn istioctl_decodes_the_dump_and_prints_every_table_without_a_blank_column() {
    let bin = tokio::task::spawn_blocking(checker).await.unwrap();
    let a = Addrs { n: 230 };
    let y = yaml(a);
    let mesh = Mesh::start(a, &y, &y).await.unwrap();
    // A live connection: client (node A) → the echo service's VIP → echo (node B), held open.
    let mut s = socks5::connect(
        mesh.a.socks5,
        Some(IpAddr::V4(a.client())),
        SocketAddr::from((a.vip(), 80)),
    )
    .await
    .unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut s, b"hold")
        .await
        .unwrap();
    let mut back = [0u8; 4];
    tokio::io::AsyncReadExt::read_exact(&mut s, &mut back)
        .await
        .unwrap();
    assert_eq!(&back, b"hold");

    let all = [
        "workloads",
        "services",
        "policies",
        "certificates",
        "connections",
    ];
    // Node A: the client's certificate and its outbound connection.
    let da = dump_with_connection(&mesh.a, "node A").await;
    let ra = check(&bin, &da);
    assert_clean("node A", &ra, &all);
    // Node B: the echo workload's certificate and the inbound side.
    let db = dump_with_connection(&mesh.b, "node B").await;
    let rb = check(&bin, &db);
    assert_clean("node B", &rb, &all);

    // What the tables say, beyond not being blank.
    let t = |r: &serde_json::Value, t: &str| r["tables"][t]["rows"].as_array().unwrap().clone();
    let echo = t(&ra, "workloads")
        .into_iter()
        .find(|r| r[1] == "echo")
        .unwrap();
    assert_eq!(echo[2], a.echo().to_string(), "ADDRESS: {echo}");
    assert_eq!(echo[3], "node-b");
    assert_eq!(echo[5], "HBONE");
    let svc = &t(&ra, "services")[0];
    assert_eq!(svc[2], a.vip().to_string(), "SERVICE VIP: {svc}");
    assert_eq!(svc[4], "1/1", "ENDPOINTS (healthy/all): {svc}");
    let pol = &t(&ra, "policies")[0];
    assert_eq!(
        pol,
        &serde_json::json!(["default", "authenticated-only", "Allow", "Namespace"])
    );
    // The dev CA signs with its root: a leaf and the root (not the root again as an intermediate).
    let certs = t(&ra, "certificates");
    let kinds: Vec<&str> = certs.iter().map(|r| r[1].as_str().unwrap()).collect();
    assert_eq!(kinds, ["Leaf", "Root"], "{certs:?}");
    assert!(
        certs
            .iter()
            .all(|r| r[0] == "spiffe://cluster.local/ns/default/sa/client" && r[2] == "Available"),
        "{certs:?}"
    );
    let out = &t(&ra, "connections")[0];
    assert_eq!(out[0], "client.default");
    assert_eq!(out[1], "Outbound");
    assert_eq!(
        out[4], "echo.default.svc.cluster.local:80",
        "REMOTE TARGET: {out}"
    );
    assert_eq!(out[5], "HBONE");
    let inb = &t(&rb, "connections")[0];
    assert_eq!(inb[0], "echo.default");
    assert_eq!(inb[1], "Inbound");
    assert_eq!(inb[2], "echo.default:8080", "LOCAL: {inb}");
    assert_eq!(inb[5], "HBONE");

    // Every key a real ztunnel writes in these sections (its dump of an equivalent mesh, captured once: see
    // conformance/istioctl/README.md), weft writes too, with the same JSON type.
    let z: serde_json::Value =
        serde_json::from_str(include_str!("../istioctl/testdata/ztunnel-dump.json")).unwrap();
    for section in ["workloads", "services", "policies"] {
        let (zs, ws) = (&z[section][0], &da[section][0]);
        let mut diffs = Vec::new();
        same_shape(section, zs, ws, &mut diffs);
        assert!(
            diffs.is_empty(),
            "{section}: not ztunnel's shape: {diffs:#?}\nztunnel: {zs:#}\nweft: {ws:#}"
        );
    }

    // weft's own sections stay beside ztunnel's.
    for k in ["version", "config", "sources", "plugins", "connections"] {
        assert!(da.get(k).is_some(), "{k} missing from weft's dump");
    }
    drop(s);
}

/// Whether `w` has every key of `z`, recursively, with the same JSON type (`null` in either matches anything: an
/// unset optional). Maps keyed by data (`endpoints`, `ports`, `port`) compare their first values.
fn same_shape(path: &str, z: &serde_json::Value, w: &serde_json::Value, diffs: &mut Vec<String>) {
    use serde_json::Value;
    match (z, w) {
        (Value::Null, _) | (_, Value::Null) => {}
        (Value::Object(zo), Value::Object(wo)) => {
            let data_keyed = ["endpoints", "ports", "port"]
                .iter()
                .any(|k| path.ends_with(&format!(".{k}")));
            if data_keyed {
                if let (Some(zv), Some(wv)) = (zo.values().next(), wo.values().next()) {
                    same_shape(&format!("{path}.*"), zv, wv, diffs);
                }
                return;
            }
            for (k, zv) in zo {
                match wo.get(k) {
                    Some(wv) => same_shape(&format!("{path}.{k}"), zv, wv, diffs),
                    None => diffs.push(format!("{path}.{k}: missing")),
                }
            }
        }
        (Value::Array(za), Value::Array(wa)) => {
            if let (Some(zv), Some(wv)) = (za.first(), wa.first()) {
                same_shape(&format!("{path}[0]"), zv, wv, diffs);
            }
        }
        (Value::String(_), Value::String(_))
        | (Value::Number(_), Value::Number(_))
        | (Value::Bool(_), Value::Bool(_)) => {}
        _ => diffs.push(format!("{path}: ztunnel {z}, weft {w}")),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logging_lists_sets_and_refuses_as_ztunnel() {
    let a = Addrs { n: 232 };
    let y = mesh_yaml(a, "echo");
    let mesh = Mesh::start(a, &y, &y).await.unwrap();
    let node = &mesh.a;
    let post = |q: &'static str| async move { node.http(node.admin, "POST", q).await.unwrap() };
    // No level, and `level=` (what `istioctl ztunnel-config log` sends without --level): the current levels,
    // unchanged.
    for q in ["/logging", "/logging?level="] {
        let (code, body) = post(q).await;
        assert_eq!(
            (code, body.as_str()),
            (200, "current log level is info\n"),
            "{q}"
        );
    }
    // A level: set (a module's level beside the default), and listed.
    let (code, body) = post("/logging?level=weft_proxy=debug").await;
    assert_eq!(code, 200, "{body}");
    assert!(
        body.starts_with("current log level is ")
            && body.contains("weft_proxy=debug")
            && body.contains("info"),
        "{body}"
    );
    let (_, now) = node.admin_get("/logging").await.unwrap();
    assert!(now.contains("weft_proxy=debug"), "{now}");
    // A bare level replaces the default.
    let (code, body) = post("/logging?level=warn").await;
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("warn") && !body.contains("info"), "{body}");
    // A bad level: 400 with the reason; the filter is unchanged.
    let (code, body) = post("/logging?level=verbose").await;
    assert_eq!(code, 400, "{body}");
    assert!(
        body.starts_with("Invalid level provided: verbose")
            && body.contains("usage: POST /logging"),
        "{body}"
    );
    let (_, after) = post("/logging").await;
    assert!(
        after.contains("warn") && after.contains("weft_proxy=debug"),
        "{after}"
    );
    // istioctl's --reset (`level=info&reset`): back to the default.
    let (code, body) = post("/logging?level=info&reset").await;
    assert_eq!((code, body.as_str()), (200, "current log level is info\n"));
    // Traffic still flows (the node is unharmed).
    let s = socks5::connect(
        node.socks5,
        Some(IpAddr::V4(a.client())),
        SocketAddr::from((a.echo(), 8080)),
    )
    .await
    .unwrap();
    assert_eq!(workload::round_trip(s, b"x").await.unwrap(), b"x");
}
