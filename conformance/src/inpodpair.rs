//! A node pair in Istio ambient's in-pod mode, for the in-pod bench (`benches/inpod.rs`) and the tests that run a
//! proxy in in-pod mode: two node namespaces ([`Nodes`]), a client pod and a server pod on node A and a server pod on
//! node B (istio-cni's rules in each), a CNI node agent per node ([`Agent`]) and one proxy per node serving that
//! node's pods over ZDS: weft in the node's namespace ([`inpod_weft_options`]), or Istio's ztunnel in a namespace of
//! its own, as in its pod in a cluster ([`InpodZtunnel`]), with its certificates from `weft-ca`
//! ([`start_weft_ca`]). Spare pods on node A are declared in the mesh from the start and created and handed to node
//! A's proxy later, one by one ([`InpodPair::spare_pod`]). Needs root.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use weft_devmesh::netns::Netns;
use weft_devmesh::{NodeOptions, NodeProcess};

use crate::cni::Agent;
use crate::podmesh::{Nodes, PodNs, workload_yaml};
use crate::ztunnel::{InpodZtunnel, NsProcess, start_weft_ca, with_trust_domain};

/// How long a proxy may take to come up (an event wait: the floor, not the expected time).
const PATIENCE: Duration = Duration::from_secs(30);
/// Pod numbers on node A ([`Nodes::pod`]): the client, the server; spare pods follow.
const CLIENT_POD: u8 = 1;
const SERVER_POD: u8 = 2;
const FIRST_SPARE: u8 = 3;
/// The most spare pods a pair can declare (pod numbers stay within [`Nodes::pod`]'s 1..=200).
pub const MAX_SPARES: usize = 190;

/// `weft run --mode inpod` for node `name` in namespace `node_ns` against the CNI agent at `uds`: admin on
/// `control_ip`, the mesh file `dir/mesh.yaml`, certificates signed from `dir/ca`, its log in
/// `dir/<log_name>.log`, `more` flags added. Log filter `info` and `--log-linger 0s` (each line on disk at once, for
/// tests that read the log): set [`NodeOptions::log`] and [`NodeOptions::log_linger`] for other values.
pub fn inpod_weft_options(
    name: &str,
    node_ns: &str,
    control_ip: IpAddr,
    dir: &Path,
    uds: &Path,
    log_name: &str,
    more: &[&str],
) -> NodeOptions {
    NodeOptions {
        name: name.into(),
        control_ip,
        config: dir.join("mesh.yaml"),
        ca_dir: dir.join("ca"),
        log_path: dir.join(format!("{log_name}.log")),
        netns: Some(node_ns.into()),
        extra: ["--mode", "inpod", "--inpod-uds"]
            .into_iter()
            .map(String::from)
            .chain([uds.display().to_string()])
            .chain(more.iter().map(|s| s.to_string()))
            .collect(),
        log: "info".into(),
        log_linger: Some("0s".into()),
        env: Vec::new(),
    }
}

/// Which proxy serves a pair's nodes.
#[derive(Debug, Clone)]
pub enum ProxyKind {
    /// weft (the build [`weft_devmesh::weft_binary`] finds).
    Weft,
    /// Istio's ztunnel, this binary.
    Ztunnel(PathBuf),
}

/// How to start a pair.
#[derive(Debug, Clone)]
pub struct PairOptions {
    /// Its proxy.
    pub proxy: ProxyKind,
    /// The proxies' log filter (weft's `--log`, ztunnel's `RUST_LOG`).
    pub log: String,
    /// Appended to the mesh file (e.g. `policies:`).
    pub mesh_extra: String,
    /// Spare pods to declare on node A ([`InpodPair::spare_pod`]), at most [`MAX_SPARES`].
    pub spares: usize,
}

/// One node's proxy.
#[derive(Debug)]
pub enum InpodProxy {
    /// weft, in the node's namespace.
    Weft(NodeProcess),
    /// ztunnel, in a namespace of its own.
    Ztunnel(NsProcess),
}

impl InpodProxy {
    /// Its process id.
    pub fn pid(&self) -> Option<u32> {
        match self {
            InpodProxy::Weft(w) => w.pid(),
            InpodProxy::Ztunnel(z) => z.pid(),
        }
    }

    /// The last `n` lines of its log.
    pub fn log_tail(&self, n: usize) -> String {
        match self {
            InpodProxy::Weft(w) => w.log_tail(n),
            InpodProxy::Ztunnel(z) => z.log_tail(n),
        }
    }

    /// SIGTERM, then SIGKILL after `grace`.
    pub async fn terminate(&mut self, grace: Duration) {
        match self {
            InpodProxy::Weft(w) => {
                w.terminate(grace).await;
            }
            InpodProxy::Ztunnel(z) => z.terminate(grace).await,
        }
    }
}

/// A running pair; everything stops on drop (field order is drop order: processes before pods, namespaces and the
/// directory).
#[derive(Debug)]
pub struct InpodPair {
    /// Node A's proxy.
    pub a: InpodProxy,
    /// Node B's proxy.
    pub b: InpodProxy,
    /// weft-ca (ztunnel pairs).
    pub ca: Option<NsProcess>,
    /// Spare pods created so far ([`InpodPair::spare_pod`]).
    pub spares: Vec<PodNs>,
    /// Node A's CNI agent.
    pub agent_a: Agent,
    /// Node B's CNI agent.
    pub agent_b: Agent,
    /// The client pod, on node A.
    pub client: PodNs,
    /// The server pod on node A.
    pub server_a: PodNs,
    /// The server pod on node B.
    pub server_b: PodNs,
    /// ztunnel's namespaces (ztunnel pairs).
    _proxy_ns: Vec<Netns>,
    /// The nodes.
    pub nodes: Nodes,
    /// Mesh file, CA, sockets, logs.
    pub dir: tempfile::TempDir,
    declared: usize,
}

/// The name of spare pod number `n`.
fn spare_name(n: u8) -> String {
    format!("spare-{n}")
}

impl InpodPair {
    /// Namespaces `tag` (addresses `10.<net>.*`), the pods, the agents and the proxies; waits until both proxies are
    /// ready and each has acked its agent's snapshot (listeners open in every pod of its node).
    pub async fn start(tag: &str, net: u8, o: &PairOptions) -> Result<Self, String> {
        if o.spares > MAX_SPARES {
            return Err(format!(
                "{} spare pods asked for, at most {MAX_SPARES}",
                o.spares
            ));
        }
        let nodes = Nodes::create(tag, net)?;
        let client = nodes.pod(false, CLIENT_POD, "client", "client")?;
        let server_a = nodes.pod(false, SERVER_POD, "echo-a", "echo")?;
        let server_b = nodes.pod(true, 1, "echo-b", "echo")?;
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let d = dir.path();
        weft_devmesh::write_dev_ca(&d.join("ca"), "cluster.local").map_err(|e| e.to_string())?;
        let mut mesh = String::from("workloads:\n");
        for (p, node) in [
            (&client, "node-a"),
            (&server_a, "node-a"),
            (&server_b, "node-b"),
        ] {
            mesh.push_str(&workload_yaml(&p.name, &p.service_account, p.ip, node));
        }
        for i in 0..o.spares {
            let n = FIRST_SPARE + i as u8;
            mesh.push_str(&workload_yaml(
                &spare_name(n),
                "client",
                nodes.pod_ip(false, n),
                "node-a",
            ));
        }
        let mesh = with_trust_domain(&mesh) + &o.mesh_extra;
        std::fs::write(d.join("mesh.yaml"), mesh).map_err(|e| e.to_string())?;
        let agent_a = Agent::start(&d.join("a.sock")).map_err(|e| e.to_string())?;
        let agent_b = Agent::start(&d.join("b.sock")).map_err(|e| e.to_string())?;
        agent_a.know_pod(client.agent_pod());
        agent_a.know_pod(server_a.agent_pod());
        agent_b.know_pod(server_b.agent_pod());
        let (mut proxy_ns, mut ca) = (Vec::new(), None);
        let (a, b) = match &o.proxy {
            ProxyKind::Weft => {
                let mut started = Vec::new();
                for (node, ns, agent) in [
                    ("node-a", &nodes.a, &agent_a),
                    ("node-b", &nodes.b, &agent_b),
                ] {
                    let before = agent.events().snapshots;
                    let mut opts = inpod_weft_options(
                        node,
                        &ns.name,
                        IpAddr::V4(Ipv4Addr::LOCALHOST),
                        d,
                        &agent.path,
                        &format!("weft-{node}"),
                        &[],
                    );
                    opts.log = o.log.clone();
                    // What ships: weft's own log buffering.
                    opts.log_linger = None;
                    let mut w = NodeProcess::spawn(&weft_devmesh::weft_binary()?, &opts)
                        .map_err(|e| e.to_string())?;
                    w.wait_ready(PATIENCE).await?;
                    agent
                        .wait("weft's snapshot", |e| e.snapshots > before)
                        .await;
                    started.push(InpodProxy::Weft(w));
                }
                let b = started.pop().ok_or("no node B")?;
                (started.pop().ok_or("no node A")?, b)
            }
            ProxyKind::Ztunnel(bin) => {
                // Each ztunnel in its own pod's namespace, the two linked, weft-ca on the first one's address.
                let id = std::process::id() % 100_000;
                let zt = [
                    Netns::create(&format!("weft-{tag}z0-{id}"))?,
                    Netns::create(&format!("weft-{tag}z1-{id}"))?,
                ];
                weft_devmesh::netns::link(
                    &zt[0],
                    &format!("wz{tag}0"),
                    &format!("10.{net}.9.1/24"),
                    &zt[1],
                    &format!("wz{tag}1"),
                    &format!("10.{net}.9.2/24"),
                )?;
                let ca_addr = SocketAddr::from(([10, net, 9, 1], 15012));
                let write = |name: &str, text: &str| {
                    std::fs::write(d.join(name), text).map_err(|e| format!("{name}: {e}"))
                };
                write(
                    "tokens.yaml",
                    "tokens:\n\
                     - {token: ztunnel-a-token, node: node-a, identity: spiffe://cluster.local/ns/istio-system/sa/ztunnel}\n\
                     - {token: ztunnel-b-token, node: node-b, identity: spiffe://cluster.local/ns/istio-system/sa/ztunnel}\n",
                )?;
                write("token-node-a", "ztunnel-a-token")?;
                write("token-node-b", "ztunnel-b-token")?;
                ca = Some(
                    start_weft_ca(&zt[0].name, ca_addr, d, Some("istio-system/ztunnel")).await?,
                );
                let mut started = Vec::new();
                for (i, (node, agent)) in [("node-a", &agent_a), ("node-b", &agent_b)]
                    .into_iter()
                    .enumerate()
                {
                    let before = agent.events().snapshots;
                    let z = InpodZtunnel {
                        bin,
                        netns: &zt[i].name,
                        node,
                        pod: &format!("ztunnel-{node}"),
                        uds: &agent.path,
                        dir: d,
                        ca: ca_addr,
                        log: &o.log,
                        log_name: &format!("ztunnel-{node}"),
                    }
                    .start(&[])
                    .await?;
                    agent
                        .wait("ztunnel's snapshot", |e| e.snapshots > before)
                        .await;
                    started.push(InpodProxy::Ztunnel(z));
                }
                proxy_ns.extend(zt);
                let b = started.pop().ok_or("no node B")?;
                (started.pop().ok_or("no node A")?, b)
            }
        };
        Ok(Self {
            a,
            b,
            ca,
            spares: Vec::new(),
            agent_a,
            agent_b,
            client,
            server_a,
            server_b,
            _proxy_ns: proxy_ns,
            nodes,
            dir,
            declared: o.spares,
        })
    }

    /// Creates the next spare pod on node A (declared in the mesh, not yet known to the agent): kept in
    /// [`InpodPair::spares`]; hand it to the proxy with `agent_a.add_pod(pod.agent_pod())`.
    pub fn spare_pod(&mut self) -> Result<&PodNs, String> {
        let i = self.spares.len();
        if i >= self.declared {
            return Err(format!("only {} spare pods were declared", self.declared));
        }
        let n = FIRST_SPARE + i as u8;
        let pod = self.nodes.pod(false, n, &spare_name(n), "client")?;
        self.spares.push(pod);
        self.spares.last().ok_or_else(|| "no pod".to_owned())
    }
}
