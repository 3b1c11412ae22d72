//! A live handover between Istio's real ztunnel and weft on one node, both ways (issue #43): pods with steady
//! traffic, the new proxy started in in-pod mode against the same CNI agent, the old one stopped with SIGTERM.
//!
//! The node (node A) has client and server pods and is served first by one proxy, then by the other; a second node
//! (node B), served by weft throughout, has a client and a server too, so traffic crosses the handover node in every
//! direction (outbound from its pods on 15001, HBONE into them on 15008, between the two proxies over HBONE). The
//! CNI agent ([`weft_conformance::cni::Agent`]) does what istio-cni's node agent does (istio/istio
//! `cni/pkg/nodeagent/ztunnelserver.go` at 86c9f01fd735fb01d8192f5bcaf0d424afb7f14c): a snapshot of every pod to each
//! proxy that connects, new pods to the newest connection, deletes to all. So a second proxy on the node receives
//! every pod in its snapshot and opens its listeners in each pod beside the first one's: both set `SO_REUSEPORT`
//! (ztunnel's `INPOD_PORT_REUSE`, true by default, in its `src/inpod/config.rs`; weft's `--inpod-port-reuse`), bind
//! the same wildcard (`[::]` where the pod has IPv6) and run as the same user, so the kernel puts them in one group
//! per port and spreads new connections over both. The old proxy then gets SIGTERM: it stops accepting (its
//! listeners leave the groups; `net.ipv4.tcp_migrate_req`, which weft turns on in each pod, hands connections still
//! queued on them to the new proxy's) and keeps the connections it has until its drain deadline (ztunnel's
//! `CONNECTION_TERMINATION_DEADLINE`, weft's `--drain-deadline`), then exits.
//!
//! Some losses are ztunnel's own, not the handover's: they happen in a rollout of ztunnel itself (the comparison
//! test, ztunnel → ztunnel) and the tests name them, with the log line that proves each, instead of counting them:
//! - drain race: when ztunnel drains, its HBONE server sends GOAWAY and stops accepting streams (its
//!   `src/proxy/h2/server.rs`: `graceful_shutdown()`, then only `poll_closed`), so a CONNECT already on its way
//!   on a pooled connection at that instant is neither served nor refused: it waits until the drain deadline cuts
//!   the connection;
//! - GOAWAY not retried: ztunnel's HBONE client opens a stream on a pooled connection without retrying it
//!   elsewhere when the h2 layer refuses it because the peer's GOAWAY has just arrived (its
//!   `src/proxy/h2/client.rs`, `internal_send`), so a connection it proxies at the instant the old proxy (weft
//!   or ztunnel) starts draining fails at once;
//! - listener reset: ztunnel does not turn on `net.ipv4.tcp_migrate_req`, so in a pod weft never served, closing
//!   a ztunnel listener resets the connections queued on it.
//!
//! As in a cluster, each ztunnel runs in a network namespace of its own (its pod's), with the CA it asks for the
//! pods' certificates (`weft-ca`, trusting ztunnel's account `istio-system/ztunnel` as a node agent, so it may ask
//! for the identities of node A's workloads); weft runs in node A's namespace and signs from the same CA's files.
//! Needs root and `ZTUNNEL_BIN` (a ztunnel built from its public source); without it each test prints why and passes.
#![allow(clippy::unwrap_used)] // a test panics to fail

mod inpod_common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use inpod_common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use weft_conformance::ztunnel::{NsProcess, ztunnel_binary};
use weft_devmesh::netns::Netns;

/// Both proxies' drain deadline: short, so the test is quick, but long enough to tell from an early close.
const DRAIN: Duration = Duration::from_secs(3);
/// How long one short connection's round trip may take before it counts as failed.
const HUNG: Duration = Duration::from_secs(10);
/// How often a long-lived connection carries a ping (traffic, not a wait).
const PING_EVERY: Duration = Duration::from_millis(50);

/// ztunnel first, weft takes over: ztunnel's SIGTERM loses no connection to the handover.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ztunnel_to_weft_loses_no_connection() {
    handover(Kind::Ztunnel, Kind::Weft, "zh", 226, true).await;
}

/// weft first, ztunnel takes over (a rollback): weft's SIGTERM loses no connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weft_to_ztunnel_loses_no_connection() {
    handover(Kind::Weft, Kind::Ztunnel, "hz", 227, true).await;
}

/// For comparison, ztunnel's own rollout (ztunnel → ztunnel) with the same traffic and the same checks, except
/// that failures are printed, not asserted: they show ztunnel's own losses (module doc) without weft.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ztunnel_to_ztunnel_for_comparison() {
    handover(Kind::Ztunnel, Kind::Ztunnel, "zz", 228, false).await;
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Weft,
    Ztunnel,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Weft => "weft",
            Kind::Ztunnel => "ztunnel",
        }
    }
}

/// One failed short connection: when, from which local address (when it got that far), the error.
#[derive(Debug, Clone)]
struct Failure {
    at: Instant,
    local: Option<SocketAddr>,
    what: String,
}

/// What the steady clients saw.
#[derive(Debug, Default)]
struct Tally {
    ok: u64,
    failed: Vec<Failure>,
    /// The slowest connection that worked: how long, which, when it started.
    slowest: Option<(Duration, String, Instant)>,
}

/// A long-lived connection's record: pings answered, and when and why it broke.
#[derive(Debug, Default)]
struct LongLived {
    what: String,
    pings: AtomicU64,
    broke: Mutex<Option<(Instant, String)>>,
}

/// A proxy serving node A: a weft process or a ztunnel one.
enum NodeProxy {
    Weft(NodeProcess),
    Ztunnel(NsProcess),
}

impl NodeProxy {
    /// SIGTERM, and how long it took to exit by itself (`None`: it had to be killed after `grace`).
    async fn stop(&mut self, grace: Duration) -> Option<Duration> {
        let t = Instant::now();
        let exited = match self {
            NodeProxy::Weft(w) => w.terminate(grace).await,
            NodeProxy::Ztunnel(z) => {
                z.terminate(grace).await;
                t.elapsed() < grace
            }
        };
        exited.then(|| t.elapsed())
    }

    fn log_text(&self) -> String {
        let path = match self {
            NodeProxy::Weft(w) => &w.log_path,
            NodeProxy::Ztunnel(z) => &z.log_path,
        };
        std::fs::read_to_string(path).unwrap_or_default()
    }

    /// Connections it logged as served (access log lines).
    fn served(&self) -> usize {
        match self {
            NodeProxy::Weft(w) => w.access_logs().len(),
            NodeProxy::Ztunnel(_) => self
                .log_text()
                .lines()
                .filter(|l| l.contains("\taccess\tconnection complete"))
                .count(),
        }
    }

    fn log_tail(&self) -> String {
        match self {
            NodeProxy::Weft(w) => w.log_tail(40),
            NodeProxy::Ztunnel(z) => z.log_tail(40),
        }
    }
}

/// The node pair, its pods, the agents, the CA, node B's weft and two ztunnel pod namespaces.
struct Bed {
    // Field order is drop order: processes before namespaces.
    weft_b: NodeProcess,
    _ca: NsProcess,
    /// Two ztunnel pods' namespaces (an old and a new ztunnel), linked, the CA on the first one's link address.
    zt_ns: [Netns; 2],
    ca_addr: SocketAddr,
    agent_a: Agent,
    _agent_b: Agent,
    clients: Vec<PodNs>,
    servers: Vec<SocketAddr>,
    server_pods: Vec<PodNs>,
    nodes: Nodes,
    net: u8,
    dir: tempfile::TempDir,
    ztunnel: std::path::PathBuf,
}

/// `mesh_yaml` with `trustDomain: cluster.local` on every workload (ztunnel's local config has no default; weft's
/// is the same value).
fn with_trust_domain(mesh: &str) -> String {
    let mut out = String::new();
    for line in mesh.lines() {
        out.push_str(line);
        out.push('\n');
        if line.starts_with("  serviceAccount:") {
            out.push_str("  trustDomain: cluster.local\n");
        }
    }
    out
}

impl Bed {
    async fn new(tag: &str, net: u8, ztunnel: std::path::PathBuf) -> Self {
        let nodes = Nodes::create(tag, net).expect("network namespaces (needs root)");
        // Node A: two clients, two servers; node B: one of each.
        let a_clients = [
            nodes.pod(false, 1, "client-a1", "client").unwrap(),
            nodes.pod(false, 2, "client-a2", "client").unwrap(),
        ];
        let a_servers = [
            nodes.pod(false, 3, "echo-a1", "echo").unwrap(),
            nodes.pod(false, 4, "echo-a2", "echo").unwrap(),
        ];
        let b_client = nodes.pod(true, 1, "client-b1", "client").unwrap();
        let b_server = nodes.pod(true, 2, "echo-b1", "echo").unwrap();
        let mut placed: Vec<(&PodNs, &str)> = Vec::new();
        for p in a_clients.iter().chain(&a_servers) {
            placed.push((p, "node-a"));
        }
        placed.push((&b_client, "node-b"));
        placed.push((&b_server, "node-b"));
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        weft_devmesh::write_dev_ca(&d.join("ca"), "cluster.local").unwrap();
        std::fs::write(d.join("mesh.yaml"), with_trust_domain(&mesh_yaml(&placed))).unwrap();
        std::fs::write(
            d.join("tokens.yaml"),
            "tokens:\n- {token: ztunnel-a-token, node: node-a, identity: spiffe://cluster.local/ns/istio-system/sa/ztunnel}\n",
        )
        .unwrap();
        std::fs::write(d.join("token-ztunnel"), "ztunnel-a-token").unwrap();
        let agent_a = Agent::start(&d.join("a.sock")).unwrap();
        let agent_b = Agent::start(&d.join("b.sock")).unwrap();
        for p in a_clients.iter().chain(&a_servers) {
            agent_a.know_pod(p.agent_pod());
        }
        agent_b.know_pod(b_client.agent_pod());
        agent_b.know_pod(b_server.agent_pod());

        // Two ztunnel pods' namespaces, linked, with the CA on the first one.
        let id = std::process::id() % 100_000;
        let zt_ns = [
            Netns::create(&format!("weft-{tag}z0-{id}")).unwrap(),
            Netns::create(&format!("weft-{tag}z1-{id}")).unwrap(),
        ];
        weft_devmesh::netns::link(
            &zt_ns[0],
            &format!("wz{tag}0"),
            &format!("10.{net}.9.1/24"),
            &zt_ns[1],
            &format!("wz{tag}1"),
            &format!("10.{net}.9.2/24"),
        )
        .unwrap();
        let ca_addr = SocketAddr::from(([10, net, 9, 1], 15012));
        let path = |n: &str| d.join(n).display().to_string();
        let ca_args: Vec<String> = [
            "--listen",
            &ca_addr.to_string(),
            "--tls-san",
            &ca_addr.ip().to_string(),
            "--ca-dir",
            &path("ca"),
            "--mesh-config",
            &path("mesh.yaml"),
            "--tokens",
            &path("tokens.yaml"),
            "--trusted-node-accounts",
            "istio-system/ztunnel",
            "--log",
            "warn,weft_ca=info",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let mut ca = NsProcess::spawn(
            "weft-ca",
            &zt_ns[0].name,
            &weft_conformance::weft_ca_binary(),
            &ca_args,
            &[],
            d.join("weft-ca.log"),
        )
        .unwrap();
        ca.wait_log("weft-ca serving", WAIT).await.unwrap();

        let servers: Vec<_> = a_servers
            .iter()
            .chain(std::iter::once(&b_server))
            .map(PodNs::spawn_echo)
            .collect();
        let mut weft_b = spawn_weft(
            "node-b",
            &nodes.b.name,
            "127.0.0.1",
            d,
            &agent_b.path,
            "weft-b",
            &[],
        );
        weft_b.wait_ready(WAIT).await.unwrap();
        agent_b
            .wait("node B's weft to take the snapshot", |e| e.snapshots >= 1)
            .await;
        let [c1, c2] = a_clients;
        let [s1, s2] = a_servers;
        Self {
            weft_b,
            _ca: ca,
            zt_ns,
            ca_addr,
            agent_a,
            _agent_b: agent_b,
            clients: vec![c1, c2, b_client],
            servers,
            server_pods: vec![s1, s2, b_server],
            nodes,
            net,
            dir,
            ztunnel,
        }
    }

    /// Start a proxy for node A (a ztunnel in pod namespace `slot`) and wait until it is ready and has taken the
    /// agent's snapshot (its listeners are open in every pod of the node).
    async fn start(&self, kind: Kind, slot: usize, log: &str) -> NodeProxy {
        let before = self.agent_a.events().snapshots;
        let p = match kind {
            Kind::Weft => {
                let mut w = spawn_weft(
                    "node-a",
                    &self.nodes.a.name,
                    "127.0.0.1",
                    self.dir.path(),
                    &self.agent_a.path,
                    log,
                    &["--drain-deadline", "3s"],
                );
                w.wait_ready(WAIT).await.unwrap();
                NodeProxy::Weft(w)
            }
            Kind::Ztunnel => {
                let d = self.dir.path();
                let path = |n: &str| d.join(n).display().to_string();
                let env: Vec<(String, String)> = [
                    ("PROXY_MODE", "shared".to_owned()),
                    ("INPOD_UDS", self.agent_a.path.display().to_string()),
                    ("XDS_ADDRESS", String::new()),
                    ("LOCAL_XDS_PATH", path("mesh.yaml")),
                    ("CA_ADDRESS", format!("https://{}", self.ca_addr)),
                    ("CA_ROOT_CA", path("ca/root-cert.pem")),
                    ("AUTH_TOKEN", path("token-ztunnel")),
                    ("NODE_NAME", "node-a".into()),
                    ("POD_NAME", format!("ztunnel-a{slot}")),
                    ("POD_NAMESPACE", "istio-system".into()),
                    ("SERVICE_ACCOUNT", "ztunnel".into()),
                    ("CONNECTION_TERMINATION_DEADLINE", "3s".into()),
                    ("RUST_LOG", "info".into()),
                ]
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v))
                .collect();
                let mut z = NsProcess::spawn(
                    "ztunnel node-a",
                    &self.zt_ns[slot].name,
                    &self.ztunnel,
                    &[],
                    &env,
                    d.join(format!("{log}.log")),
                )
                .unwrap();
                let ready = SocketAddr::from(([127, 0, 0, 1], 15021));
                z.wait_http_ok(ready, "/healthz/ready", WAIT).await.unwrap();
                NodeProxy::Ztunnel(z)
            }
        };
        self.agent_a
            .wait("the new proxy's connection to take the snapshot", |e| {
                e.snapshots > before
            })
            .await;
        p
    }

    /// Whether `f` is one of ztunnel's own losses (module doc), by the logs; the evidence, or `None`. Each needs the
    /// failure's timing and a proxy's log line for that very connection (by the client's address and port) to a
    /// pod of node A that delivered nothing:
    /// - drain race: the old proxy is a ztunnel, the client saw the failure at its drain deadline, and the old
    ///   ztunnel's outbound side held the connection until its drain cut it, or another proxy (node B's weft, the
    ///   new weft or the new ztunnel) sent a CONNECT to it that was never answered;
    /// - GOAWAY not retried: within two seconds of the old proxy's SIGTERM, a ztunnel's outbound side failed the
    ///   connection with h2's "not a result of an error" (the old proxy's graceful GOAWAY arrived as it opened the
    ///   stream on its pooled connection, and ztunnel does not retry it on a new one);
    /// - listener reset: the old proxy is a ztunnel, the failure came within two seconds of SIGTERM, no proxy logged
    ///   the connection at all, and the client's pod has `net.ipv4.tcp_migrate_req` off (only weft turns it on), so
    ///   the kernel reset what was queued on the closed listener.
    fn ztunnel_loss(
        &self,
        f: &Failure,
        old: Kind,
        logs: &ProxyLogs,
        sigterm: Instant,
    ) -> Option<String> {
        let at = f.at.checked_duration_since(sigterm)?;
        let local = f.local?;
        // How late after the event the client may see the failure (a loaded machine).
        let slack = Duration::from_secs(2);
        // ztunnel's text access log (its outbound side writes the HBONE address as dst.addr) and weft's JSON one.
        let z_src = format!("src.addr={local} ");
        let z_dst = format!("dst.addr=10.{}.1.", self.net);
        let ztunnel_line = |log: &str, more: &[&str]| {
            log.lines()
                .find(|l| {
                    l.contains(&z_src)
                        && l.contains(&z_dst)
                        && l.contains(" bytes_sent=0 ")
                        && more.iter().all(|m| l.contains(m))
                })
                .map(str::to_owned)
        };
        let w_src = format!("\"src.addr\":\"{local}\"");
        let w_dst = format!("\"dst.hbone_addr\":\"10.{}.1.", self.net);
        let weft_line = |log: &str| {
            log.lines()
                .find(|l| {
                    l.contains(&w_src)
                        && l.contains(&w_dst)
                        && l.contains("upstream connect failed")
                })
                .map(str::to_owned)
        };
        if old == Kind::Ztunnel && at >= DRAIN && at <= DRAIN + slack {
            // (Its CONNECT never reached a weft: weft's inbound logs the client's address as forwarded_for.)
            let reached_weft = [&logs.new, &logs.weft_b]
                .iter()
                .any(|log| log.contains(&format!("\"forwarded_for\":\"{local}\"")));
            if let Some(l) = ztunnel_line(&logs.old, &["connection closed due to connection drain"])
                && !reached_weft
            {
                return Some(format!(
                    "drain race: the old ztunnel's outbound held it (its CONNECT reached no weft) and its drain \
                     cut it: {l}"
                ));
            }
            if let Some(l) = ztunnel_line(&logs.new, &["\terror\t"]) {
                return Some(format!(
                    "drain race: the new ztunnel's CONNECT to the draining one was never answered: {l}"
                ));
            }
            for (who, log) in [("node B's weft", &logs.weft_b), ("the new weft", &logs.new)] {
                if let Some(l) = weft_line(log) {
                    return Some(format!(
                        "drain race: {who}'s CONNECT to the draining ztunnel was never answered: {l}"
                    ));
                }
            }
        }
        if at <= slack {
            for log in [&logs.old, &logs.new] {
                if let Some(l) = ztunnel_line(log, &["not a result of an error"]) {
                    return Some(format!(
                        "GOAWAY not retried: ztunnel's outbound failed the CONNECT its pooled connection refused \
                         on the draining proxy's GOAWAY: {l}"
                    ));
                }
            }
            let logged = [&logs.old, &logs.new, &logs.weft_b]
                .iter()
                .any(|log| log.contains(&z_src) || log.contains(&w_src));
            let pod = self.clients.iter().find(|p| p.ip == local.ip())?;
            let migrate = pod
                .ns
                .output("cat", &["/proc/sys/net/ipv4/tcp_migrate_req"])
                .unwrap_or_default();
            if old == Kind::Ztunnel && !logged && migrate == "0" {
                return Some(format!(
                    "listener reset: no proxy logged it and {} has net.ipv4.tcp_migrate_req=0, so closing the old \
                     ztunnel's listener reset what was queued on it",
                    pod.name
                ));
            }
        }
        None
    }
}

/// The proxies' logs at the end of a run.
struct ProxyLogs {
    old: String,
    new: String,
    weft_b: String,
}

/// Steady short connections from `pod` to each of `servers` in turn, until `stop`.
fn steady_client(
    pod: &PodNs,
    servers: Vec<SocketAddr>,
    tally: Arc<Mutex<Tally>>,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<Result<(), String>> {
    let name = pod.name.clone();
    pod.ns.run(move || async move {
        let mut i = 0usize;
        while !stop.load(Ordering::Relaxed) {
            let dst = servers[i % servers.len()];
            i += 1;
            let started = Instant::now();
            let local = Mutex::new(None);
            let r = async {
                let mut s = tokio::net::TcpStream::connect(dst).await?;
                *local.lock().unwrap() = s.local_addr().ok();
                s.write_all(b"0123456789abcdef0123456789abcdef").await?;
                let mut back = [0u8; 32];
                s.read_exact(&mut back).await?;
                std::io::Result::Ok(())
            };
            let r = tokio::time::timeout(HUNG, r)
                .await
                .unwrap_or_else(|_| Err(std::io::Error::other(format!("no answer in {HUNG:?}"))));
            let mut t = tally.lock().unwrap();
            match r {
                Ok(()) => {
                    t.ok += 1;
                    let took = started.elapsed();
                    if t.slowest.as_ref().is_none_or(|(d, _, _)| took > *d) {
                        t.slowest = Some((took, format!("{name} -> {dst}"), started));
                    }
                }
                Err(e) => t.failed.push(Failure {
                    at: Instant::now(),
                    local: *local.lock().unwrap(),
                    what: format!("{name} -> {dst}: {e}"),
                }),
            }
        }
    })
}

/// A long-lived connection from `pod` to `dst`, opened now, carrying a ping every [`PING_EVERY`] until it breaks
/// or `stop`.
async fn long_lived(
    pod: &PodNs,
    dst: SocketAddr,
    stop: Arc<AtomicBool>,
) -> (Arc<LongLived>, std::thread::JoinHandle<Result<(), String>>) {
    let rec = Arc::new(LongLived {
        what: format!("{} -> {dst}", pod.name),
        ..Default::default()
    });
    let (opened_tx, opened_rx) = tokio::sync::oneshot::channel();
    let r = rec.clone();
    let h = pod.ns.run(move || async move {
        let mut s = tokio::net::TcpStream::connect(dst).await.unwrap();
        let mut tick = tokio::time::interval(PING_EVERY);
        let mut first = Some(opened_tx);
        while !stop.load(Ordering::Relaxed) {
            tick.tick().await;
            let res = async {
                s.write_all(b"ping").await?;
                let mut b = [0u8; 4];
                s.read_exact(&mut b).await?;
                if &b != b"ping" {
                    return Err(std::io::Error::other("wrong echo"));
                }
                std::io::Result::Ok(())
            }
            .await;
            match res {
                Ok(()) => {
                    r.pings.fetch_add(1, Ordering::Relaxed);
                    if let Some(tx) = first.take() {
                        let _ = tx.send(());
                    }
                }
                Err(e) => {
                    *r.broke.lock().unwrap() = Some((Instant::now(), e.to_string()));
                    return;
                }
            }
        }
    });
    opened_rx
        .await
        .expect("the long-lived connection's first ping");
    (rec, h)
}

/// The TCP listeners in `pod` on the proxies' ports (15001, 15006, 15008): `(local address, process name)`, from
/// `ss -ltnp` run inside the pod's namespace.
fn proxy_listeners(pod: &PodNs) -> Vec<(String, String)> {
    let out = pod.ns.output("ss", &["-Hltnp"]).unwrap();
    out.lines()
        .filter_map(|l| {
            let local = l.split_whitespace().nth(3)?;
            if ![":15001", ":15006", ":15008"]
                .iter()
                .any(|p| local.ends_with(p))
            {
                return None;
            }
            let name = l.split("users:((\"").nth(1)?.split('"').next()?;
            Some((local.to_owned(), name.to_owned()))
        })
        .collect()
}

fn pings(longs: &[Arc<LongLived>]) -> Vec<u64> {
    longs
        .iter()
        .map(|l| l.pings.load(Ordering::Relaxed))
        .collect()
}

/// Hand node A over from `old_kind` to `new_kind` under traffic; with `strict`, no failure that is not one of
/// ztunnel's own losses may happen.
async fn handover(old_kind: Kind, new_kind: Kind, tag: &str, net: u8, strict: bool) {
    let bin = match ztunnel_binary() {
        Ok(b) => b,
        Err(why) => {
            eprintln!("skipped: {why}");
            return;
        }
    };
    let bed = Bed::new(tag, net, bin).await;
    let (old_name, new_name) = (old_kind.name(), new_kind.name());
    let mut old = bed.start(old_kind, 0, &format!("{old_name}-a-old")).await;

    let tally = Arc::new(Mutex::new(Tally::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let mut threads = Vec::new();
    for c in &bed.clients {
        // Node B's client goes to node A's servers only (the handover node), node A's clients to every server.
        let servers: Vec<_> = if c.name.ends_with("b1") {
            bed.servers[..2].to_vec()
        } else {
            bed.servers.clone()
        };
        threads.push(steady_client(c, servers, tally.clone(), stop.clone()));
    }
    let mut longs = Vec::new();
    for (c, s) in [(0, 1), (0, 2), (1, 0), (2, 0), (2, 1)] {
        let (rec, h) = long_lived(&bed.clients[c], bed.servers[s], stop.clone()).await;
        longs.push(rec);
        threads.push(h);
    }
    let more = |n: u64| {
        let tally = tally.clone();
        async move {
            let target = tally.lock().unwrap().ok + n;
            eventually(WAIT, "steady client progress", || {
                let ok = tally.lock().unwrap().ok;
                async move { (ok >= target).then_some(()) }
            })
            .await
        }
    };
    more(100).await;
    let served_by_old_before = old.served();

    // The new proxy joins; both serve.
    let pings_at_start = pings(&longs);
    let t0 = Instant::now();
    let new = bed.start(new_kind, 1, &format!("{new_name}-a-new")).await;
    let new_ready = t0.elapsed();
    // Both proxies listen in every pod of node A: one listener each per port, in the same SO_REUSEPORT group.
    let mut overlap = String::new();
    for pod in bed.clients[..2].iter().chain(&bed.server_pods[..2]) {
        let ls = proxy_listeners(pod);
        for port in [":15001", ":15006", ":15008"] {
            let owners: Vec<&(String, String)> =
                ls.iter().filter(|(a, _)| a.ends_with(port)).collect();
            let names: Vec<&str> = owners.iter().map(|(_, n)| n.as_str()).collect();
            assert!(
                owners.len() == 2
                    && names.contains(&old_name)
                    && names.contains(&new_name)
                    && owners[0].0 == owners[1].0,
                "{}: during the overlap, port {port} should have one listener of each proxy on the same \
                 address: {ls:?}",
                pod.name
            );
        }
        if overlap.is_empty() {
            overlap = format!("{}: {ls:?}", pod.name);
        }
    }
    more(100).await;
    // Every long-lived connection carries data while both proxies serve.
    eventually(
        WAIT,
        "long-lived connections' pings during the overlap",
        || {
            let now = pings(&longs);
            let moved = now.iter().zip(&pings_at_start).all(|(n, s)| n > s);
            async move { moved.then_some(()) }
        },
    )
    .await;
    let pings_at_sigterm = pings(&longs);

    // The old one goes.
    let t1 = Instant::now();
    let old_exit = old.stop(WAIT).await;
    let taken_over = t0.elapsed();
    more(100).await;
    let served_by_new = new.served();
    stop.store(true, Ordering::Relaxed);
    for h in threads {
        tokio::task::spawn_blocking(move || h.join())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
    }
    let pings_at_end = pings(&longs);

    let t = tally.lock().unwrap();
    let attempted = t.ok + t.failed.len() as u64;
    let label = format!("{old_name} -> {new_name}");
    let since_sigterm = |i: Instant| {
        let ms = |i: Instant| i.saturating_duration_since(t0).as_millis() as i64;
        format!("SIGTERM{:+} ms", ms(i) - ms(t1))
    };
    let logs = ProxyLogs {
        old: old.log_text(),
        new: new.log_text(),
        weft_b: std::fs::read_to_string(&bed.weft_b.log_path).unwrap_or_default(),
    };
    let (mut races, mut lost) = (Vec::new(), Vec::new());
    for f in &t.failed {
        let from = f.local.map(|a| format!(", from {a}")).unwrap_or_default();
        let line = format!("{} (at {}{from})", f.what, since_sigterm(f.at));
        match bed.ztunnel_loss(f, old_kind, &logs, t1) {
            Some(evidence) => races.push(format!("{line}; {evidence}")),
            None => lost.push(line),
        }
    }
    println!(
        "handover {label}: {attempted} connections attempted, {} failed: {} to the handover {lost:?}, {} to \
         ztunnel's own behaviour",
        t.failed.len(),
        lost.len(),
        races.len()
    );
    for r in &races {
        println!("handover {label}: ztunnel's own: {r}");
    }
    if let Some((took, what, at)) = &t.slowest {
        println!(
            "handover {label}: slowest connection that worked {took:?} ({what}, started at {})",
            since_sigterm(*at)
        );
    }
    println!("handover {label}: listeners during the overlap, {overlap}");
    println!(
        "handover {label}: new proxy ready (listeners in every pod) {new_ready:?} after its start; old proxy \
         exited {old_exit:?} after SIGTERM (drain deadline {DRAIN:?}); node taken over {taken_over:?} after the \
         new proxy's start; connections logged: old {served_by_old_before}+ before the overlap, new {served_by_new}"
    );
    if !lost.is_empty() {
        // Keep the logs of a run with failures not named as ztunnel's own, to see what they were.
        let keep = std::env::temp_dir().join(format!("weft-handover-{tag}-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&keep);
        for e in std::fs::read_dir(bed.dir.path()).unwrap().flatten() {
            if e.path().extension().is_some_and(|x| x == "log") {
                let _ = std::fs::copy(e.path(), keep.join(e.file_name()));
            }
        }
        println!("handover {label}: logs kept in {}", keep.display());
    }
    let mut early = Vec::new();
    for (i, l) in longs.iter().enumerate() {
        let broke = l.broke.lock().unwrap().clone();
        let lifetime = broke
            .as_ref()
            .map(|(at, why)| format!("closed {:?} after SIGTERM ({why})", at.duration_since(t1)));
        println!(
            "handover {label}: long-lived {}: {} pings ({} before the new proxy, {} before SIGTERM), {}",
            l.what,
            pings_at_end[i],
            pings_at_start[i],
            pings_at_sigterm[i],
            lifetime.as_deref().unwrap_or("still up")
        );
        if let Some((at, why)) = broke
            && at < t1 + DRAIN
        {
            early.push(format!(
                "{} closed {:?} after SIGTERM: {why}",
                l.what,
                at.duration_since(t1)
            ));
        }
    }

    assert!(
        old_exit.is_some(),
        "the old proxy ({old_name}) did not exit within {WAIT:?} of SIGTERM:\n{}",
        old.log_tail()
    );
    assert!(
        served_by_new > 0,
        "the new proxy ({new_name}) served nothing:\n{}",
        new.log_tail()
    );
    assert!(attempted >= 300, "too few connections: {attempted}");
    assert!(
        !strict || lost.is_empty(),
        "connections failed across the handover {label}: {} of {attempted} ({lost:?})",
        lost.len()
    );
    assert!(
        early.is_empty(),
        "long-lived connections closed before the old proxy's drain deadline ({DRAIN:?}): {early:?}"
    );
    for (i, l) in longs.iter().enumerate() {
        assert!(
            pings_at_sigterm[i] > pings_at_start[i] && pings_at_end[i] > pings_at_sigterm[i],
            "long-lived {} carried no data while both proxies served or while the old one drained: {} pings \
             before the new proxy, {} at SIGTERM, {} in all",
            l.what,
            pings_at_start[i],
            pings_at_sigterm[i],
            pings_at_end[i]
        );
    }
    drop(new);
    drop(bed);
}
