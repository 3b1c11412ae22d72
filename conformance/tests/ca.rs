//! The Istio CA protocol end to end: real weft nodes get their certificates from the reference CA process
//! (`weft-ca`) over gRPC+TLS; the CA refuses an identity the node does not host (and the connection that needed
//! it fails on that refusal, not on a timeout); only trusted node agents may ask for other identities than their
//! own (a workload's token may not get its neighbour's), and every refusal is audited with its reason; a CA
//! answering with the wrong SAN is refused; certificates rotate under traffic without a failed connection; a CA
//! outage is ridden out on the current certificates, retried with doubling backoff and recovered from without a
//! restart. (The CA's files and flags, `weft ca init`'s key mode and `weft run`'s refusal of a readable key, are
//! in `ca_files.rs`.) Every wait is for an event (a log line, a dump, a process exit)
//! with a generous overall bound; nothing asserts on elapsed time.
//!
//! Needs `cargo build -p weft -p weft-control` first (the binaries are found next to each other).
#![allow(clippy::unwrap_used)]

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use weft_conformance::{Addrs, Mesh, eventually, mesh_yaml, metric_sum};
use weft_devmesh::{NodeOptions, NodeProcess, socks5, workload};
use weft_identity::{CaClient, CertRequest, Error, IstioCaClient, IstioCaConfig, SpiffeId};

/// The overall bound of every wait for an event: generous, since a loaded machine is slow, and never reached
/// when things work.
const PATIENCE: Duration = Duration::from_secs(60);

/// The node agents `weft-ca` trusts: the identities of node-a's and node-b's tokens.
const NODE_AGENTS: &str = "weft-system/node-a,weft-system/node-b";

/// The reference CA as a child process, with its JSON log.
struct CaProcess {
    child: Option<Child>,
    args: Vec<String>,
    addr: SocketAddr,
    log: PathBuf,
    starts: u32,
}

impl CaProcess {
    async fn start(args: Vec<String>, addr: SocketAddr, log: PathBuf) -> Self {
        let mut me = Self {
            child: None,
            args,
            addr,
            log,
            starts: 0,
        };
        me.restart().await;
        me
    }

    /// Start the process and wait for its "serving" log line (written once it listens); fails at once, with the
    /// log, if it exits first.
    async fn restart(&mut self) {
        self.starts += 1;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let child = Command::new(weft_conformance::weft_ca_binary())
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.child = Some(child);
        let want = self.starts as usize;
        let serving = eventually(PATIENCE, "weft-ca's serving log line", || {
            let exited = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten());
            let lines = self.lines();
            let serving = lines
                .iter()
                .filter(|l| {
                    l["message"]
                        .as_str()
                        .is_some_and(|m| m.starts_with("weft-ca serving"))
                })
                .count();
            async move {
                if let Some(status) = exited {
                    return Some(Err(status));
                }
                (serving >= want).then_some(Ok(()))
            }
        })
        .await;
        if let Err(status) = serving {
            panic!(
                "weft-ca exited ({status}) before listening on {}:\n{}",
                self.addr,
                std::fs::read_to_string(&self.log).unwrap_or_default()
            );
        }
    }

    /// JSON log lines so far.
    fn lines(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .collect()
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Audit lines so far.
    fn audit(&self) -> Vec<Value> {
        self.lines()
            .into_iter()
            .filter(|l| l["target"] == "audit")
            .collect()
    }

    /// Wait for an audit line that `f` accepts.
    async fn audited(&self, what: &str, f: impl Fn(&Value) -> bool) -> Value {
        eventually(PATIENCE, what, || {
            let found = self.audit().into_iter().find(|l| f(l));
            async move { found }
        })
        .await
    }
}

impl Drop for CaProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A CA with its own root, token file and workload source, listening on 127.0.N.253:15012. Its token file holds
/// the node agents' tokens (`node-a.token`, `node-b.token`, trusted) and a workload's (`client.token`, the
/// service account `default/client` on node-a).
struct World {
    dir: tempfile::TempDir,
    root: PathBuf,
    ca_mesh: PathBuf,
    ca: CaProcess,
}

impl World {
    async fn start(a: Addrs, ca_yaml: &str, extra: &[&str]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let ca_dir = dir.path().join("ca");
        weft_identity::ca::write_root(&ca_dir, "cluster.local", Duration::from_secs(3600)).unwrap();
        let ca_mesh = dir.path().join("ca-mesh.yaml");
        std::fs::write(&ca_mesh, ca_yaml).unwrap();
        let mut tokens = String::from("tokens:\n");
        for (name, node, ns) in [
            ("node-a", "node-a", "weft-system"),
            ("node-b", "node-b", "weft-system"),
            ("client", "node-a", "default"),
        ] {
            std::fs::write(
                dir.path().join(format!("{name}.token")),
                format!("secret-of-{name}\n"),
            )
            .unwrap();
            tokens.push_str(&format!(
                "- token: secret-of-{name}\n  node: {node}\n  identity: spiffe://cluster.local/ns/{ns}/sa/{name}\n"
            ));
        }
        std::fs::write(dir.path().join("tokens.yaml"), tokens).unwrap();
        let addr = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(127, 0, a.n, 253)), 15012);
        let mut args: Vec<String> = [
            "--listen",
            &addr.to_string(),
            "--ca-dir",
            &ca_dir.display().to_string(),
            "--mesh-config",
            &ca_mesh.display().to_string(),
            "--tokens",
            &dir.path().join("tokens.yaml").display().to_string(),
            "--tls-san",
            &addr.ip().to_string(),
            "--trusted-node-accounts",
            NODE_AGENTS,
            "--log-json",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        args.extend(extra.iter().map(|s| s.to_string()));
        let ca = CaProcess::start(args, addr, dir.path().join("ca.log")).await;
        Self {
            root: ca_dir.join("root-cert.pem"),
            dir,
            ca_mesh,
            ca,
        }
    }

    /// A CA client presenting the token `<name>.token`.
    fn client(&self, name: &str) -> IstioCaClient {
        IstioCaClient::new(IstioCaConfig {
            address: format!("https://{}", self.ca.addr),
            root_cert: Some(self.root.clone()),
            token_file: Some(self.dir.path().join(format!("{name}.token"))),
            cluster_id: "Kubernetes".into(),
            server_name: None,
            timeout: PATIENCE,
        })
        .unwrap()
    }

    /// `weft run` flags that make a node use this CA.
    fn node_flags(&self, validity: &str) -> impl Fn(&mut NodeOptions) + use<> {
        let (addr, root, dir) = (
            self.ca.addr,
            self.root.clone(),
            self.dir.path().to_path_buf(),
        );
        let validity = validity.to_owned();
        move |o: &mut NodeOptions| {
            o.extra.extend([
                "--ca-kind".into(),
                "istio".into(),
                "--ca-address".into(),
                format!("https://{addr}"),
                "--ca-root-cert".into(),
                root.display().to_string(),
                "--ca-token-file".into(),
                dir.join(format!("{}.token", o.name)).display().to_string(),
                "--cert-validity".into(),
                validity.clone(),
                "--ca-timeout".into(),
                "2s".into(),
            ]);
        }
    }
}

/// Add an HBONE workload `sa` at `ip` on `node` to a mesh config.
fn with_workload(yaml: &str, sa: &str, ip: Ipv4Addr, node: &str) -> String {
    yaml.replacen(
        "workloads:\n",
        &format!(
            "workloads:\n- uid: Kubernetes//Pod/default/{sa}\n  name: {sa}\n  namespace: default\n  serviceAccount: {sa}\n  workloadIps: [{ip}]\n  protocol: HBONE\n  node: {node}\n  services: {{}}\n"
        ),
        1,
    )
}

async fn round_trip(mesh_socks: SocketAddr, src: Ipv4Addr, dst: SocketAddr) -> Result<(), String> {
    let s = socks5::connect(mesh_socks, Some(IpAddr::V4(src)), dst)
        .await
        .map_err(|e| e.to_string())?;
    let data: Vec<u8> = (0..1024u32).map(|i| (i % 251) as u8).collect();
    let back = workload::round_trip(s, &data)
        .await
        .map_err(|e| e.to_string())?;
    (back == data)
        .then_some(())
        .ok_or_else(|| "echo corrupted".to_owned())
}

fn cert<'a>(dump: &'a Value, sa: &str) -> Option<&'a Value> {
    let want = format!("spiffe://cluster.local/ns/default/sa/{sa}");
    dump["certificates"]
        .as_array()?
        .iter()
        .find(|c| c["identity"] == want)
}

fn squash(pem: &str) -> String {
    pem.split_whitespace().collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_get_certificates_from_the_reference_ca_over_grpc_tls() {
    let a = Addrs { n: 70 };
    let yaml = mesh_yaml(a, "echo");
    let w = World::start(a, &yaml, &[]).await;
    // Node A's cluster id comes from ISTIO_META_CLUSTER_ID (which wins over CLUSTER_ID, as in ztunnel), node B's
    // from the default: the CA must see each node's one cluster id.
    let flags = w.node_flags("1h");
    let mesh = Mesh::start_with(a, &yaml, &yaml, move |o: &mut NodeOptions| {
        flags(o);
        if o.name == "node-a" {
            o.env.push(("ISTIO_META_CLUSTER_ID".into(), "east".into()));
        }
    })
    .await
    .unwrap();
    round_trip(
        mesh.a.socks5,
        a.client(),
        SocketAddr::from((a.echo(), 8080)),
    )
    .await
    .unwrap();
    let root = squash(&std::fs::read_to_string(&w.root).unwrap());
    for (node, sa) in [(&mesh.a, "client"), (&mesh.b, "echo")] {
        let dump = node.config_dump().await.unwrap();
        let c = cert(&dump, sa).unwrap_or_else(|| panic!("{}: {dump}", node.name));
        assert_eq!(c["state"], "Available", "{c}");
        assert!(
            c["serialNumber"].as_str().is_some_and(|s| !s.is_empty()),
            "{c}"
        );
        assert!(c["expirationTime"].as_str().unwrap().ends_with('Z'), "{c}");
        // Issued under the reference CA's root, not the dev CA the harness also writes.
        assert_eq!(
            squash(c["rootCerts"][0]["pem"].as_str().unwrap()),
            root,
            "{c}"
        );
        let m = node.scrape().await.unwrap();
        assert!(
            metric_sum(&m, "weft_certificate_fetches_total") >= 1.0,
            "{m}"
        );
        assert!(
            metric_sum(&m, "weft_certificate_soonest_expiry_seconds") > 3000.0,
            "{m}"
        );
    }
    let audit = w.ca.audit();
    for (node, sa, cluster) in [
        ("node-a", "client", "east"),
        ("node-b", "echo", "Kubernetes"),
    ] {
        assert!(
            audit.iter().any(|l| l["decision"] == "allow"
                && l["node"] == node
                && l["cluster"] == cluster
                && l["identity"] == format!("spiffe://cluster.local/ns/default/sa/{sa}")),
            "{audit:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_identity_not_on_the_node_is_refused_and_its_connection_fails_fast() {
    let a = Addrs { n: 72 };
    let intruder_ip = Ipv4Addr::new(127, 0, a.n, 3);
    let yaml = mesh_yaml(a, "echo");
    // The CA's workload source places `intruder` on node-b.
    let w = World::start(
        a,
        &with_workload(&yaml, "intruder", intruder_ip, "node-b"),
        &[],
    )
    .await;
    let mesh = Mesh::start_with(a, &yaml, &yaml, w.node_flags("1h"))
        .await
        .unwrap();
    // Node A's own config now claims `intruder` runs on node-a: node A asks the CA for it.
    std::fs::write(
        &mesh.config_a,
        with_workload(&yaml, "intruder", intruder_ip, "node-a"),
    )
    .unwrap();
    let c = eventually(PATIENCE, "node A's refusal", || async {
        let dump = mesh.a.config_dump().await.ok()?;
        let c = cert(&dump, "intruder")?.clone();
        (c["state"] == "Unavailable").then_some(c)
    })
    .await;
    let err = c["lastError"].as_str().unwrap();
    assert!(
        err.contains("PermissionDenied") && err.contains("node node-a may not"),
        "{c}"
    );
    // A connection from that workload fails with a SOCKS5 error (no hang), and it failed on the CA's refusal, not
    // on a CA timeout.
    let r = tokio::time::timeout(
        PATIENCE,
        socks5::connect(
            mesh.a.socks5,
            Some(IpAddr::V4(intruder_ip)),
            SocketAddr::from((a.echo(), 8080)),
        ),
    )
    .await
    .expect("the connection hung");
    assert!(
        matches!(r, Err(socks5::Socks5Error::Reply(code)) if code != 0),
        "{r:?}"
    );
    let logged = eventually(PATIENCE, "the failed connection's log line", || async {
        mesh.a
            .access_logs()
            .into_iter()
            .find(|l| l.to_string().contains("sa/intruder"))
    })
    .await;
    let text = logged.to_string();
    assert!(text.contains("PermissionDenied"), "{logged}");
    assert!(!text.contains("no answer within"), "{logged}");
    // The CA's audit line names the node, the identity and the reason.
    let audit = w.ca.audit();
    let deny = audit
        .iter()
        .find(|l| l["decision"] == "deny")
        .unwrap_or_else(|| panic!("{audit:?}"));
    assert_eq!(deny["node"], "node-a");
    assert_eq!(
        deny["identity"],
        "spiffe://cluster.local/ns/default/sa/intruder"
    );
    assert!(
        deny["reason"]
            .as_str()
            .unwrap()
            .contains("no workload on node node-a"),
        "{deny}"
    );
    let m = mesh.a.scrape().await.unwrap();
    assert!(
        metric_sum(&m, "weft_certificate_fetches_refused_total") >= 1.0,
        "{m}"
    );
    // Other workloads are unaffected.
    round_trip(
        mesh.a.socks5,
        a.client(),
        SocketAddr::from((a.echo(), 8080)),
    )
    .await
    .unwrap();
    // The CA's workload source moves `intruder` to node-a: node A gets the certificate without a restart.
    std::fs::write(
        &w.ca_mesh,
        with_workload(&yaml, "intruder", intruder_ip, "node-a"),
    )
    .unwrap();
    eventually(
        PATIENCE,
        "the certificate after the CA's config edit",
        || async {
            let dump = mesh.a.config_dump().await.ok()?;
            (cert(&dump, "intruder")?["state"] == "Available").then_some(())
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ca_answering_with_the_wrong_san_is_refused() {
    let a = Addrs { n: 74 };
    let yaml = mesh_yaml(a, "echo");
    let w = World::start(a, &yaml, &["--fault", "wrong-san"]).await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("a.yaml");
    std::fs::write(&config, &yaml).unwrap();
    let mut opts = NodeOptions::loopback(
        "node-a",
        a.node_a(),
        &config,
        Path::new("/nonexistent"),
        dir.path(),
    );
    w.node_flags("1h")(&mut opts);
    let node = NodeProcess::spawn(&weft_devmesh::weft_binary().unwrap(), &opts).unwrap();
    let c = eventually(PATIENCE, "the refused certificate", || async {
        let dump = node.config_dump().await.ok()?;
        let c = cert(&dump, "client")?.clone();
        (c["state"] == "Unavailable").then_some(c)
    })
    .await;
    let err = c["lastError"].as_str().unwrap();
    assert!(
        err.contains("identity mismatch") && err.contains("sa/impostor"),
        "{c}"
    );
    let (code, body) = node
        .http(node.readiness, "GET", "/healthz/ready")
        .await
        .unwrap();
    assert_ne!(code, 200, "{body}");
    // Not ready, so wait for the data path's own signal that its listeners are up.
    eventually(PATIENCE, "the data path's listeners", || {
        let up = node
            .log_lines()
            .iter()
            .any(|l| l["message"] == "weft ready to serve");
        async move { up.then_some(()) }
    })
    .await;
    // The connection fails (no hang), on the refused certificate.
    let r = tokio::time::timeout(
        PATIENCE,
        socks5::connect(
            node.socks5,
            Some(IpAddr::V4(a.client())),
            SocketAddr::from((a.echo(), 8080)),
        ),
    )
    .await
    .expect("the connection hung");
    assert!(
        matches!(r, Err(socks5::Socks5Error::Reply(code)) if code != 0),
        "{r:?}"
    );
    let logged = eventually(PATIENCE, "the failed connection's log line", || async {
        node.access_logs()
            .into_iter()
            .find(|l| l.to_string().contains("sa/client"))
    })
    .await;
    assert!(logged.to_string().contains("identity mismatch"), "{logged}");
}

/// Sample each node's certificate serial (from `/config_dump`) until both have had `n` distinct serials.
async fn wait_for_serials(mesh: &Mesh, n: usize) -> [Vec<String>; 2] {
    let mut serials = [Vec::new(), Vec::new()];
    let mut tick = tokio::time::interval(Duration::from_millis(200));
    loop {
        tick.tick().await;
        for (i, (node, sa)) in [(&mesh.a, "client"), (&mesh.b, "echo")]
            .into_iter()
            .enumerate()
        {
            if let Ok(d) = node.config_dump().await
                && let Some(s) = cert(&d, sa).and_then(|c| c["serialNumber"].as_str())
                && !serials[i].iter().any(|x| x == s)
            {
                serials[i].push(s.to_owned());
            }
        }
        if serials.iter().all(|s| s.len() >= n) {
            return serials;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificates_rotate_under_traffic_without_a_failed_connection() {
    let a = Addrs { n: 76 };
    let yaml = mesh_yaml(a, "echo");
    let w = World::start(a, &yaml, &[]).await;
    let mesh = Mesh::start_with(a, &yaml, &yaml, w.node_flags("4s"))
        .await
        .unwrap();
    let dst = SocketAddr::from((a.echo(), 8080));
    // Traffic runs until both nodes' certificates have rotated twice (three serials each): new connections all
    // along, and one long-lived connection talking all along. The intervals only pace the traffic.
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let (socks, client) = (mesh.a.socks5, a.client());
    let short = tokio::spawn({
        let stopped = stopped.clone();
        async move {
            let (mut ok, mut failed) = (0u32, Vec::new());
            let mut pace = tokio::time::interval(Duration::from_millis(50));
            while !*stopped.borrow() {
                pace.tick().await;
                match round_trip(socks, client, dst).await {
                    Ok(()) => ok += 1,
                    Err(e) => failed.push(e),
                }
            }
            (ok, failed)
        }
    });
    let long = tokio::spawn(async move {
        let mut s = socks5::connect(socks, Some(IpAddr::V4(client)), dst)
            .await
            .map_err(|e| e.to_string())?;
        let mut rounds = 0u32;
        let mut pace = tokio::time::interval(Duration::from_millis(100));
        // One round more after the stop: the connection outlived every rotation.
        loop {
            let last = *stopped.borrow();
            pace.tick().await;
            let msg = [rounds as u8; 64];
            s.write_all(&msg)
                .await
                .map_err(|e| format!("round {rounds}: {e}"))?;
            let mut back = [0u8; 64];
            s.read_exact(&mut back)
                .await
                .map_err(|e| format!("round {rounds}: {e}"))?;
            if back != msg {
                return Err(format!("round {rounds}: corrupted"));
            }
            rounds += 1;
            if last {
                return Ok::<u32, String>(rounds);
            }
        }
    });
    // 4 s certificates renewed at half-life.
    let serials = tokio::time::timeout(PATIENCE, wait_for_serials(&mesh, 3))
        .await
        .expect("three serials on each node");
    stop.send(true).unwrap();
    let (ok, failed) = short.await.unwrap();
    let rounds = long.await.unwrap().unwrap();
    assert!(
        failed.is_empty(),
        "{} of {} connections failed: {failed:?}",
        failed.len(),
        ok as usize + failed.len()
    );
    assert!(ok >= 1 && rounds >= 2, "{ok} connections, {rounds} rounds");
    // The newest certificates serve new connections too.
    round_trip(socks, client, dst).await.unwrap();
    for (i, s) in serials.iter().enumerate() {
        assert!(s.len() >= 3, "node {i}: serials {s:?}");
    }
    let m = mesh.a.scrape().await.unwrap();
    assert!(
        metric_sum(&m, "weft_certificate_renewals_total") >= 2.0,
        "{m}"
    );
    assert_eq!(
        metric_sum(&m, "weft_certificate_fetch_failures_total"),
        0.0,
        "{m}"
    );
}

/// A Rust `Debug` duration as the manager logs it (`500ms`, `1s`, `1.5s`, `2m`...).
fn debug_duration(text: &str) -> Duration {
    let split = text
        .find(|c: char| c.is_ascii_alphabetic() || c == 'µ')
        .unwrap();
    let (n, unit) = text.split_at(split);
    let n: f64 = n.parse().unwrap();
    let secs = match unit {
        "ns" => n / 1e9,
        "µs" => n / 1e6,
        "ms" => n / 1e3,
        "s" => n,
        other => panic!("unit {other:?} in {text:?}"),
    };
    Duration::from_secs_f64(secs)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ca_outage_is_ridden_out_and_recovered_from_without_a_restart() {
    let a = Addrs { n: 78 };
    let yaml = mesh_yaml(a, "echo");
    let mut w = World::start(a, &yaml, &[]).await;
    // 16 s certificates: renewal is due after about 8 s.
    let mesh = Mesh::start_with(a, &yaml, &yaml, w.node_flags("16s"))
        .await
        .unwrap();
    let pids = (mesh.a.pid(), mesh.b.pid());
    let dst = SocketAddr::from((a.echo(), 8080));
    let first =
        cert(&mesh.a.config_dump().await.unwrap(), "client").unwrap()["serialNumber"].clone();
    w.ca.kill();
    // Renewals fail, and are retried with doubling backoff (0.5 s, 1 s, 2 s...), not in a tight loop: the node's
    // log gives each failure's retry delay.
    let client_id = "spiffe://cluster.local/ns/default/sa/client";
    let delays = eventually(PATIENCE, "three failed renewals", || {
        let delays: Vec<Duration> = mesh
            .a
            .log_lines()
            .into_iter()
            .filter(|l| l["message"] == "certificate fetch failed" && l["identity"] == client_id)
            .filter_map(|l| l["retry_in"].as_str().map(debug_duration))
            .collect();
        async move { (delays.len() >= 3).then_some(delays) }
    })
    .await;
    for pair in delays.windows(2).take(2) {
        assert_eq!(pair[1], pair[0] * 2, "backoff does not double: {delays:?}");
    }
    assert!(delays[0] > Duration::ZERO, "{delays:?}");
    let d = mesh.a.config_dump().await.unwrap();
    let c = cert(&d, "client").unwrap();
    assert!(c["consecutiveFailures"].as_u64().unwrap() >= 3, "{c}");
    assert_eq!(
        c["state"], "Available",
        "the current certificate keeps serving: {c}"
    );
    assert_eq!(c["serialNumber"], first);
    assert!(
        c["lastError"].as_str().unwrap().contains("unavailable"),
        "{c}"
    );
    // Meanwhile traffic flows on the current certificates.
    for _ in 0..5 {
        round_trip(mesh.a.socks5, a.client(), dst).await.unwrap();
    }
    let m = mesh.a.scrape().await.unwrap();
    assert!(
        metric_sum(&m, "weft_certificate_fetch_failures_total") >= 3.0,
        "{m}"
    );
    // The CA comes back: renewal succeeds on the next retry, no restart of weft.
    w.ca.restart().await;
    let c = eventually(PATIENCE, "recovery", || async {
        let d = mesh.a.config_dump().await.ok()?;
        let c = cert(&d, "client")?.clone();
        (c["consecutiveFailures"] == 0 && c["serialNumber"] != first).then_some(c)
    })
    .await;
    assert_eq!(c["state"], "Available");
    round_trip(mesh.a.socks5, a.client(), dst).await.unwrap();
    assert_eq!((mesh.a.pid(), mesh.b.pid()), pids);
}

fn spiffe(ns: &str, sa: &str) -> SpiffeId {
    SpiffeId::new("cluster.local", ns, sa).unwrap()
}

fn cert_request(id: &SpiffeId) -> CertRequest {
    CertRequest {
        identity: id.clone(),
        csr_pem: weft_identity::cert::new_csr(id).unwrap().csr_pem,
        validity: Duration::from_secs(3600),
    }
}

/// Hole 2 of #8 through the `weft-ca` process and its flag: a workload's node-bound token may not obtain its
/// neighbour's identity; the trusted node agent may, but only for identities on its node; each refusal is an
/// audit line with its reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_trusted_node_agents_may_impersonate_and_refusals_are_audited() {
    let a = Addrs { n: 80 };
    let yaml = with_workload(
        &mesh_yaml(a, "echo"),
        "neighbour",
        Ipv4Addr::new(127, 0, a.n, 3),
        "node-a",
    );
    let w = World::start(a, &yaml, &[]).await;
    let (client, neighbour, echo) = (
        spiffe("default", "client"),
        spiffe("default", "neighbour"),
        spiffe("default", "echo"),
    );
    // The workload's own token (default/client on node-a): its own identity, not its neighbour's.
    let workload = w.client("client");
    workload.sign(&cert_request(&client)).await.unwrap();
    let err = workload.sign(&cert_request(&neighbour)).await.unwrap_err();
    assert!(matches!(err, Error::CaRefused { .. }), "{err}");
    assert!(err.to_string().contains("PermissionDenied"), "{err}");
    let deny =
        w.ca.audited("the workload's refusal", |l| {
            l["decision"] == "deny" && l["identity"] == neighbour.to_string()
        })
        .await;
    assert_eq!(deny["caller"], client.to_string(), "{deny}");
    assert_eq!(deny["node"], "node-a", "{deny}");
    assert!(
        deny["reason"]
            .as_str()
            .unwrap()
            .contains("default/client is not a trusted node account"),
        "{deny}"
    );
    // weft's own (trusted) account on node-a: the neighbour's identity is issued.
    let agent = w.client("node-a");
    agent.sign(&cert_request(&neighbour)).await.unwrap();
    let allow =
        w.ca.audited("the agent's issuance", |l| {
            l["decision"] == "allow" && l["identity"] == neighbour.to_string()
        })
        .await;
    assert_eq!(
        allow["caller"], "spiffe://cluster.local/ns/weft-system/sa/node-a",
        "{allow}"
    );
    assert!(
        allow["reason"]
            .as_str()
            .unwrap()
            .contains("trusted node agent weft-system/node-a"),
        "{allow}"
    );
    // The trusted agent asking for an identity that is on another node: refused, with that reason.
    let err = agent.sign(&cert_request(&echo)).await.unwrap_err();
    assert!(err.to_string().contains("PermissionDenied"), "{err}");
    let deny =
        w.ca.audited("the agent's refusal", |l| {
            l["decision"] == "deny" && l["identity"] == echo.to_string()
        })
        .await;
    assert!(
        deny["reason"]
            .as_str()
            .unwrap()
            .contains("no workload on node node-a"),
        "{deny}"
    );
}
