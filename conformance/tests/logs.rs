//! weft's log lines as an operator's log pipeline gets them: stderr is a pipe there (a container runtime, systemd),
//! so the text format carries no terminal escape codes, and every JSON line is one JSON object with the fields a
//! log shipper keys on. Runs the real binary; every wait is for an event with a generous overall bound.
//!
//! Needs `cargo build -p weft` first.
#![allow(clippy::unwrap_used)] // a test panics to fail

use std::time::Duration;

use weft_conformance::{Addrs, mesh_yaml};
use weft_devmesh::{NodeOptions, NodeProcess};

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
