//! The Istio CA protocol end to end: real weft nodes get their certificates from the reference CA process
//! (`weft-ca`) over gRPC+TLS; the CA refuses an identity the node does not host (and the connection that needed
//! it fails fast); a CA answering with the wrong SAN is refused; certificates rotate under traffic without a
//! failed connection; a CA outage is ridden out on the current certificates and recovered from without a restart.
//!
//! Needs `cargo build -p weft -p weft-ca-server` first (the binaries are found next to each other).
#![allow(clippy::unwrap_used)]

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use weft_conformance::{Addrs, Mesh, eventually, mesh_yaml, metric_sum};
use weft_devmesh::{NodeOptions, NodeProcess, socks5, workload};

fn ca_binary() -> PathBuf {
    let weft = weft_devmesh::weft_binary().unwrap();
    let ca = weft.with_file_name("weft-ca");
    assert!(
        ca.is_file(),
        "{} not found: run `cargo build -p weft -p weft-ca-server` first",
        ca.display()
    );
    ca
}

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

    async fn restart(&mut self) {
        self.starts += 1;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let child = Command::new(ca_binary())
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.child = Some(child);
        let start = Instant::now();
        while tokio::net::TcpStream::connect(self.addr).await.is_err() {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "weft-ca did not listen on {}:\n{}",
                self.addr,
                std::fs::read_to_string(&self.log).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Audit lines so far.
    fn audit(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|l| l["target"] == "audit")
            .collect()
    }
}

impl Drop for CaProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A CA with its own root, token file and workload source, listening on 127.0.N.253:15012.
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
        for node in ["node-a", "node-b"] {
            std::fs::write(
                dir.path().join(format!("{node}.token")),
                format!("secret-of-{node}\n"),
            )
            .unwrap();
            tokens.push_str(&format!(
                "- token: secret-of-{node}\n  node: {node}\n  identity: spiffe://cluster.local/ns/weft-system/sa/{node}\n"
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
    let mesh = Mesh::start_with(a, &yaml, &yaml, w.node_flags("1h"))
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
        assert_eq!(squash(c["rootCerts"][0].as_str().unwrap()), root, "{c}");
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
    for (node, sa) in [("node-a", "client"), ("node-b", "echo")] {
        assert!(
            audit.iter().any(|l| l["decision"] == "allow"
                && l["node"] == node
                && l["cluster"] == "Kubernetes"
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
    let c = eventually(Duration::from_secs(10), "node A's refusal", || async {
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
    // A connection from that workload fails at once with a SOCKS5 error, not a hang.
    let start = Instant::now();
    let r = socks5::connect(
        mesh.a.socks5,
        Some(IpAddr::V4(intruder_ip)),
        SocketAddr::from((a.echo(), 8080)),
    )
    .await;
    assert!(
        matches!(r, Err(socks5::Socks5Error::Reply(code)) if code != 0),
        "{r:?}"
    );
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "took {:?}",
        start.elapsed()
    );
    let logged = eventually(
        Duration::from_secs(5),
        "the failed connection's log line",
        || async {
            mesh.a
                .access_logs()
                .into_iter()
                .find(|l| l.to_string().contains("PermissionDenied"))
        },
    )
    .await;
    assert!(logged.to_string().contains("sa/intruder"), "{logged}");
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
        Duration::from_secs(10),
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
    let c = eventually(
        Duration::from_secs(15),
        "the refused certificate",
        || async {
            let dump = node.config_dump().await.ok()?;
            let c = cert(&dump, "client")?.clone();
            (c["state"] == "Unavailable").then_some(c)
        },
    )
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
    let start = Instant::now();
    let r = socks5::connect(
        node.socks5,
        Some(IpAddr::V4(a.client())),
        SocketAddr::from((a.echo(), 8080)),
    )
    .await;
    assert!(
        matches!(r, Err(socks5::Socks5Error::Reply(code)) if code != 0),
        "{r:?}"
    );
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "took {:?}",
        start.elapsed()
    );
}

/// Serials each node's certificate has had, sampled while `f` runs.
async fn sample_serials(mesh: &Mesh, until: Instant, serials: &mut [Vec<String>; 2]) {
    while Instant::now() < until {
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
        tokio::time::sleep(Duration::from_millis(200)).await;
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
    let until = Instant::now() + Duration::from_secs(9);
    // New connections all along, and one long-lived connection talking all along.
    let (socks, client) = (mesh.a.socks5, a.client());
    let short = tokio::spawn(async move {
        let (mut ok, mut failed) = (0u32, Vec::new());
        while Instant::now() < until {
            match round_trip(socks, client, dst).await {
                Ok(()) => ok += 1,
                Err(e) => failed.push(e),
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        (ok, failed)
    });
    let long = tokio::spawn(async move {
        let mut s = socks5::connect(socks, Some(IpAddr::V4(client)), dst)
            .await
            .map_err(|e| e.to_string())?;
        let mut rounds = 0u32;
        while Instant::now() < until {
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
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok::<u32, String>(rounds)
    });
    let mut serials = [Vec::new(), Vec::new()];
    sample_serials(&mesh, until, &mut serials).await;
    let (ok, failed) = short.await.unwrap();
    let rounds = long.await.unwrap().unwrap();
    assert!(
        failed.is_empty(),
        "{} of {} connections failed: {failed:?}",
        failed.len(),
        ok as usize + failed.len()
    );
    assert!(ok >= 40, "only {ok} connections");
    assert!(
        rounds >= 40,
        "only {rounds} rounds on the long-lived connection"
    );
    // 4 s certificates renewed at half-life: at least 3 serials each in 9 s.
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
    // Renewals fail, and are retried with backoff (0.5 s, 1 s, 2 s...), not in a tight loop.
    let c = eventually(Duration::from_secs(15), "failed renewals", || async {
        let d = mesh.a.config_dump().await.ok()?;
        let c = cert(&d, "client")?.clone();
        (c["consecutiveFailures"].as_u64()? >= 2).then_some(c)
    })
    .await;
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
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let d = mesh.a.config_dump().await.unwrap();
    let fails = cert(&d, "client").unwrap()["consecutiveFailures"]
        .as_u64()
        .unwrap();
    assert!(
        fails <= 4,
        "backoff: {fails} failures within ~1.5 s of the first"
    );
    let m = mesh.a.scrape().await.unwrap();
    assert!(
        metric_sum(&m, "weft_certificate_fetch_failures_total") >= 2.0,
        "{m}"
    );
    // The CA comes back: renewal succeeds on the next retry, no restart of weft.
    w.ca.restart().await;
    let c = eventually(Duration::from_secs(10), "recovery", || async {
        let d = mesh.a.config_dump().await.ok()?;
        let c = cert(&d, "client")?.clone();
        (c["consecutiveFailures"] == 0 && c["serialNumber"] != first).then_some(c)
    })
    .await;
    assert_eq!(c["state"], "Available");
    round_trip(mesh.a.socks5, a.client(), dst).await.unwrap();
    assert_eq!((mesh.a.pid(), mesh.b.pid()), pids);
}
