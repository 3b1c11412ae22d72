//! The real `weft-control` process: serves over TLS with a certificate from the dev CA, answers on its status
//! endpoint, refuses a bad plugin file while serving on, and stops cleanly on SIGTERM.
#![allow(clippy::unwrap_used)] // a test panics to fail

mod common;

use std::collections::HashMap;
use std::io::BufRead as _;
use std::process::{Command, Stdio};

use common::*;
use weft_proto::type_url::EXTENSION_CONFIG;

fn free_port() -> std::net::SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_process_serves_reports_refuses_bad_files_and_stops_on_sigterm() {
    let env = Env::new(&["node-a"]);
    std::fs::write(env.path("plugins/code.wasm"), b"code").unwrap();
    env.write("plugins/p.yaml", &plugin_yaml("p", "code.wasm", "{}", ""));
    let (addr, status_addr) = (free_port(), free_port());
    let mut child = Command::new(env!("CARGO_BIN_EXE_weft-control"))
        .args([
            "--listen",
            &addr.to_string(),
            "--status",
            &status_addr.to_string(),
        ])
        .args(["--metrics", "off", "--poll", "20ms", "--log-json"])
        .arg("--ca-dir")
        .arg(env.path("ca"))
        .arg("--tokens")
        .arg(env.path("tokens.yaml"))
        .arg("--mesh")
        .arg(env.path("mesh.yaml"))
        .arg("--plugins-dir")
        .arg(env.path("plugins"))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Its log, line by line, on a thread.
    let (log_tx, mut log) = tokio::sync::mpsc::unbounded_channel::<serde_json::Value>();
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            if let Ok(v) = serde_json::from_str(&line) {
                let _ = log_tx.send(v);
            }
        }
    });
    let mut wait_log = async |msg: &str| loop {
        let v = tokio::time::timeout(WAIT, log.recv())
            .await
            .unwrap_or_else(|_| panic!("no log line {msg:?}"))
            .unwrap_or_else(|| panic!("log ended before {msg:?}"));
        if v["message"] == msg {
            return v;
        }
    };
    let serving = wait_log("weft control serving Delta ADS").await;
    assert_eq!(serving["addr"], addr.to_string());

    let mut a = env.client(addr, "node-a").await;
    a.subscribe(EXTENSION_CONFIG, HashMap::new()).await;
    let r = a.recv().await;
    assert_eq!(names(&r), vec!["p".to_owned()]);
    a.ack(&r).await;
    let ack = wait_log("ACK").await;
    assert_eq!(ack["node"], a.node.id.as_str());

    // A bad file: refused, logged with file and line, shown in the status; serving goes on.
    env.write(
        "plugins/q.yaml",
        "kind: WeftPlugin\nmetadata: {name: q}\nspec:\n  url: ftp://x/y\n",
    );
    let refused =
        wait_log("plugin directory change refused; the last good plugins keep being served").await;
    let err = refused["error"].as_str().unwrap();
    assert!(
        err.contains("q.yaml: line 4") && err.contains("unsupported URL"),
        "{err}"
    );
    let st = status(status_addr).await;
    assert_eq!(st["connectedNodes"], 1);
    assert_eq!(
        st["nodes"][0]["plugins"]["p"]["version"],
        r.resources[0].version.as_str()
    );
    assert!(
        st["sources"]["plugins"]["lastError"]
            .as_str()
            .unwrap()
            .contains("q.yaml")
    );
    let mut b = env.client(addr, "node-a").await;
    b.subscribe(EXTENSION_CONFIG, HashMap::new()).await;
    assert_eq!(names(&b.recv().await), vec!["p".to_owned()]);

    let kill = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    wait_log("weft control stopping").await;
    let exit = tokio::task::spawn_blocking(move || child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(exit.success(), "{exit:?}");
}
