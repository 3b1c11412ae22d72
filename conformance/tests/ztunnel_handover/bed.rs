//! The test bed: the two nodes, their pods, the CNI agents, the CA, node B's weft, ztunnel's pod namespaces, and
//! the proxy serving node A (weft or ztunnel) with its logs.

use super::*;
use weft_conformance::ztunnel::{InpodZtunnel, start_weft_ca, with_trust_domain};

/// A proxy serving node A: a weft process or a ztunnel one.
pub(crate) enum NodeProxy {
    Weft(NodeProcess),
    Ztunnel(NsProcess),
}

impl NodeProxy {
    /// SIGTERM, and how long it took to exit by itself (`None`: it had to be killed after `grace`).
    pub(crate) async fn stop(&mut self, grace: Duration) -> Option<Duration> {
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

    pub(crate) fn log_text(&self) -> String {
        let path = match self {
            NodeProxy::Weft(w) => &w.log_path,
            NodeProxy::Ztunnel(z) => &z.log_path,
        };
        std::fs::read_to_string(path).unwrap_or_default()
    }

    /// Connections it logged as served (access log lines).
    pub(crate) fn served(&self) -> usize {
        match self {
            NodeProxy::Weft(w) => w.access_logs().len(),
            NodeProxy::Ztunnel(_) => self
                .log_text()
                .lines()
                .filter(|l| l.contains("\taccess\tconnection complete"))
                .count(),
        }
    }

    pub(crate) fn log_tail(&self) -> String {
        match self {
            NodeProxy::Weft(w) => w.log_tail(40),
            NodeProxy::Ztunnel(z) => z.log_tail(40),
        }
    }
}

/// The node pair, its pods, the agents, the CA, node B's weft and two ztunnel pod namespaces.
pub(crate) struct Bed {
    // Field order is drop order: processes before namespaces.
    pub(crate) weft_b: NodeProcess,
    pub(crate) _ca: NsProcess,
    /// Two ztunnel pods' namespaces (an old and a new ztunnel), linked, the CA on the first one's link address.
    pub(crate) zt_ns: [Netns; 2],
    pub(crate) ca_addr: SocketAddr,
    pub(crate) agent_a: Agent,
    pub(crate) _agent_b: Agent,
    pub(crate) clients: Vec<PodNs>,
    pub(crate) servers: Vec<SocketAddr>,
    pub(crate) server_pods: Vec<PodNs>,
    pub(crate) nodes: Nodes,
    pub(crate) net: u8,
    pub(crate) dir: tempfile::TempDir,
    pub(crate) ztunnel: std::path::PathBuf,
}

impl Bed {
    pub(crate) async fn new(tag: &str, net: u8, ztunnel: std::path::PathBuf) -> Self {
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
        std::fs::write(d.join("token-node-a"), "ztunnel-a-token").unwrap();
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
        let ca = start_weft_ca(&zt_ns[0].name, ca_addr, d, Some("istio-system/ztunnel"))
            .await
            .unwrap();

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
    pub(crate) async fn start(&self, kind: Kind, slot: usize, log: &str) -> NodeProxy {
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
                let z = InpodZtunnel {
                    bin: &self.ztunnel,
                    netns: &self.zt_ns[slot].name,
                    node: "node-a",
                    pod: &format!("ztunnel-a{slot}"),
                    uds: &self.agent_a.path,
                    dir: self.dir.path(),
                    ca: self.ca_addr,
                    log: "info",
                    log_name: log,
                }
                .start(&[(
                    "CONNECTION_TERMINATION_DEADLINE".to_owned(),
                    "3s".to_owned(),
                )])
                .await
                .unwrap();
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
    pub(crate) fn ztunnel_loss(
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
pub(crate) struct ProxyLogs {
    pub(crate) old: String,
    pub(crate) new: String,
    pub(crate) weft_b: String,
}

/// The TCP listeners in `pod` on the proxies' ports (15001, 15006, 15008): `(local address, process name)`, from
/// `ss -ltnp` run inside the pod's namespace.
pub(crate) fn proxy_listeners(pod: &PodNs) -> Vec<(String, String)> {
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
