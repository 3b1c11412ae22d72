//! weft's log lines as an operator's log pipeline gets them: stderr is a pipe there (a container runtime, systemd),
//! so the text format carries no terminal escape codes, every JSON line is one JSON object with the fields a
//! log shipper keys on, and the data path's access lines are ztunnel's. Runs the real binary; every wait is for an
//! event with a generous overall bound.
//!
//! Needs `cargo build -p weft` first.
#![allow(clippy::unwrap_used)] // a test panics to fail

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use serde_json::Value;
use weft_conformance::{Addrs, Mesh, eventually, mesh_yaml};
use weft_devmesh::{NodeOptions, NodeProcess, socks5, workload};

/// The overall bound of every wait for an event: generous, since a loaded machine is slow, and never reached
/// when things work.
const PATIENCE: Duration = Duration::from_secs(60);

/// Starts a node logging in `format` until it is ready, and returns its stderr.
async fn ready_log(n: u8, format: &str) -> String {
    let a = Addrs { n };
    let dir = tempfile::tempdir().unwrap();
    let ca_dir = dir.path().join("ca");
    weft_identity::ca::write_root(&ca_dir, "cluster.local", Duration::from_secs(3600)).unwrap();
    let config = dir.path().join("a.yaml");
    std::fs::write(&config, mesh_yaml(a, "echo")).unwrap();
    let mut opts = NodeOptions::loopback("node-a", a.node_a(), &config, &ca_dir, dir.path());
    // The last `--log-format` wins.
    opts.extra.extend(["--log-format".into(), format.into()]);
    let weft = weft_devmesh::weft_binary().unwrap();
    let mut node = NodeProcess::spawn(&weft, &opts).unwrap();
    node.wait_ready(PATIENCE).await.unwrap();
    std::fs::read_to_string(&node.log_path).unwrap()
}

/// Text lines written to a pipe have no ANSI escape codes: each starts with its timestamp and reads as plain
/// `LEVEL target: message key=value`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_lines_on_a_pipe_have_no_terminal_escape_codes() {
    let log = ready_log(84, "text").await;
    let starting = log
        .lines()
        .find(|l| l.contains("weft starting"))
        .unwrap_or_else(|| panic!("no start line in:\n{log}"));
    assert!(!log.contains('\u{1b}'), "escape codes in:\n{log}");
    let (ts, rest) = starting.split_once(' ').unwrap();
    humantime::parse_rfc3339(ts).unwrap_or_else(|e| panic!("{e}: {starting}"));
    assert!(
        rest.trim_start()
            .starts_with("INFO weft::run: weft starting node=node-a"),
        "{starting}"
    );
}

/// Every JSON line is one object with ztunnel's keys (`src/telemetry.rs` `IstioJsonFormat`): `time`, a lower-case
/// `level`, `scope` (the target) and `message`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_lines_are_one_object_each_with_the_fields_shippers_key_on() {
    let log = ready_log(86, "json").await;
    let mut seen = 0;
    for line in log.lines() {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        let ts = v["time"].as_str().unwrap_or_else(|| panic!("{line}"));
        humantime::parse_rfc3339(ts).unwrap_or_else(|e| panic!("{e}: {line}"));
        for k in ["level", "scope", "message"] {
            assert!(v[k].is_string(), "{k} in {line}");
        }
        let level = v["level"].as_str().unwrap_or_default();
        assert_eq!(level, level.to_ascii_lowercase(), "{line}");
        seen += 1;
    }
    assert!(log.contains("\"message\":\"weft starting\""), "{log}");
    assert!(seen >= 2, "{log}");
}

/// ztunnel's access fields, from the shared test kit (which cites ztunnel's source).
use weft_testkit::ztunnel::ACCESS_FIELDS as ZTUNNEL_ACCESS_KEYS;

/// The keys of the line itself, ztunnel's (`src/telemetry.rs` `IstioJsonFormat`) plus weft's `target`, and weft's
/// extra access fields: `conn` (the connection's id) and, inbound, `forwarded_for`.
const LINE_KEYS: [&str; 5] = ["level", "time", "scope", "message", "target"];

/// Checks one data-path access line: exactly `LINE_KEYS`, `conn`, the `extra` weft keys and the ztunnel keys
/// but those in `absent`; ztunnel's types (addresses as text, byte counts as numbers, `duration` as `<n>ms`);
/// `level`.
fn assert_access_line(l: &Value, level: &str, absent: &[&str], extra: &[&str]) {
    let got: BTreeSet<&str> = l.as_object().unwrap().keys().map(String::as_str).collect();
    let want: BTreeSet<&str> = LINE_KEYS
        .iter()
        .chain(&["conn"])
        .chain(extra)
        .chain(ZTUNNEL_ACCESS_KEYS.iter().filter(|k| !absent.contains(k)))
        .copied()
        .collect();
    assert_eq!(got, want, "{l}");
    assert_eq!(l["level"], level, "{l}");
    assert_eq!(l["scope"], "access", "{l}");
    assert_eq!(l["message"], "connection complete", "{l}");
    assert!(l["conn"].is_u64(), "{l}");
    for k in ["src.addr", "dst.addr", "dst.hbone_addr", "forwarded_for"] {
        if let Some(v) = l.get(k) {
            let text = v.as_str().unwrap_or_else(|| panic!("{k} is not text: {l}"));
            text.parse::<SocketAddr>()
                .unwrap_or_else(|e| panic!("{k}: {e}: {l}"));
        }
    }
    for k in ["bytes_sent", "bytes_recv"] {
        assert!(l[k].is_u64(), "{k} is not a number: {l}");
    }
    let duration = l["duration"].as_str().unwrap_or_else(|| panic!("{l}"));
    let ms = duration.strip_suffix("ms").unwrap_or_else(|| panic!("{l}"));
    assert!(
        !ms.is_empty() && ms.bytes().all(|b| b.is_ascii_digit()),
        "{l}"
    );
    for k in ZTUNNEL_ACCESS_KEYS {
        if let Some(v) = l.get(k).filter(|_| !k.starts_with("bytes_")) {
            assert!(v.as_str().is_some_and(|s| !s.is_empty()), "{k}: {l}");
        }
    }
}

/// The data path's access line for an HBONE connection, at both ends, and for one node B's policy denies: ztunnel's
/// keys and types, absent fields left out rather than written empty, the cluster where the workload has one, error
/// level (with `error`) for the denied connection, info for the one that succeeded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn access_lines_have_ztunnels_keys_types_and_levels() {
    let a = Addrs { n: 88 };
    // The HBONE workloads (client, echo) name their cluster; the policy denies any port of echo but 8080.
    let base = mesh_yaml(a, "echo").replace(
        "  protocol: HBONE\n",
        "  protocol: HBONE\n  clusterId: cluster-1\n",
    );
    let yaml_b = format!(
        r#"{base}policies:
- name: only-8080
  namespace: default
  scope: Namespace
  action: Deny
  rules:
  - - - notDestinationPorts: [8080]
"#
    );
    let mesh = Mesh::start(a, &base, &yaml_b).await.unwrap();
    let src = Some(IpAddr::V4(a.client()));
    let allowed = SocketAddr::from((a.echo(), 8080));
    let s = socks5::connect(mesh.a.socks5, src, allowed).await.unwrap();
    assert_eq!(workload::round_trip(s, b"hello").await.unwrap(), b"hello");
    let denied = SocketAddr::from((a.echo(), 8081));
    let r = socks5::connect(mesh.a.socks5, src, denied).await;
    assert!(matches!(r, Err(socks5::Socks5Error::Reply(2))), "{r:?}");

    let find = |logs: Vec<Value>, dst: SocketAddr| {
        logs.into_iter()
            .find(|l| l.get("conn").is_some() && l["dst.addr"] == dst.to_string())
    };
    let wait = |what: &'static str, b: bool, dst: SocketAddr| {
        let mesh = &mesh;
        eventually(Duration::from_secs(30), what, move || async move {
            find(
                if b {
                    mesh.b.access_logs()
                } else {
                    mesh.a.access_logs()
                },
                dst,
            )
        })
    };

    // Both ends of the allowed connection: info, no error, no service (the workload was dialled), every other
    // field known.
    let inbound = wait("node B's line for the allowed connection", true, allowed).await;
    assert_access_line(
        &inbound,
        "info",
        &["dst.service", "error"],
        &["forwarded_for"],
    );
    assert_eq!(inbound["direction"], "inbound", "{inbound}");
    assert_eq!(inbound["src.workload"], "client", "{inbound}");
    assert_eq!(inbound["src.cluster"], "cluster-1", "{inbound}");
    assert_eq!(inbound["dst.cluster"], "cluster-1", "{inbound}");
    assert_eq!(
        inbound["src.identity"], "spiffe://cluster.local/ns/default/sa/client",
        "{inbound}"
    );
    assert_eq!(inbound["bytes_sent"], 5, "{inbound}");
    let outbound = wait("node A's line for the allowed connection", false, allowed).await;
    assert_access_line(&outbound, "info", &["dst.service", "error"], &[]);
    assert_eq!(outbound["direction"], "outbound", "{outbound}");
    assert_eq!(
        outbound["dst.hbone_addr"],
        format!("{}:15008", a.echo()),
        "{outbound}"
    );
    assert_eq!(
        outbound["dst.identity"], "spiffe://cluster.local/ns/default/sa/echo",
        "{outbound}"
    );

    // Both ends of the denied one: error level, with `error`.
    let inbound = wait("node B's line for the denied connection", true, denied).await;
    assert_access_line(&inbound, "error", &["dst.service"], &["forwarded_for"]);
    assert!(
        inbound["error"]
            .as_str()
            .unwrap()
            .contains("default/only-8080"),
        "{inbound}"
    );
    assert_eq!(inbound["bytes_sent"], 0, "{inbound}");
    let outbound = wait("node A's line for the denied connection", false, denied).await;
    assert_access_line(&outbound, "error", &["dst.service"], &[]);
    assert!(
        outbound["error"].as_str().unwrap().contains("401"),
        "{outbound}"
    );
}
