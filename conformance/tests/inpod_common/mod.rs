//! What the in-pod tests share: weft started in a node namespace against a test CNI agent, pods with echo and
//! whoami servers, a two-node mesh of pods, and waits on listeners and the dump.
#![allow(dead_code, unused_imports)] // each test file uses some of them
#![allow(clippy::unwrap_used)] // a test panics to fail

pub use std::net::SocketAddr;
pub use std::path::Path;
pub use std::time::Duration;

pub use weft_conformance::cni::Agent;
pub use weft_conformance::eventually;
pub use weft_conformance::podmesh::{Nodes, PodNs, PodRules, mesh_yaml};
pub use weft_devmesh::{NodeOptions, NodeProcess, workload};

pub const WAIT: Duration = Duration::from_secs(30);

/// Start `weft run --mode inpod` in `node_ns` against the agent at `uds`.
pub fn spawn_weft(
    name: &str,
    node_ns: &str,
    control_ip: &str,
    dir: &Path,
    uds: &Path,
    log_name: &str,
    more: &[&str],
) -> NodeProcess {
    let opts = weft_conformance::inpodpair::inpod_weft_options(
        name,
        node_ns,
        control_ip.parse().unwrap(),
        dir,
        uds,
        log_name,
        more,
    );
    NodeProcess::spawn(&weft_devmesh::weft_binary().unwrap(), &opts).unwrap()
}

/// A server on `pod`'s address, port 8081, that answers each connection with the address it sees as the peer (as
/// an application logging or authorizing by peer address would) and closes.
pub fn whoami_in(pod: &PodNs) -> SocketAddr {
    use tokio::io::AsyncWriteExt;
    let addr = SocketAddr::from((pod.ip, 8081));
    let (tx, rx) = std::sync::mpsc::channel();
    let _ = pod.ns.run(move || async move {
        let l = tokio::net::TcpListener::bind(addr).await.unwrap();
        tx.send(()).unwrap();
        while let Ok((mut s, peer)) = l.accept().await {
            let _ = s.write_all(peer.ip().to_string().as_bytes()).await;
        }
    });
    rx.recv_timeout(WAIT).unwrap();
    addr
}

/// From inside `pod`, the peer address the whoami server at `dst` saw.
pub async fn peer_seen_from(pod: &PodNs, dst: SocketAddr) -> String {
    use tokio::io::AsyncReadExt;
    let h = pod.ns.run(move || async move {
        let mut s = tokio::net::TcpStream::connect(dst).await?;
        let mut seen = String::new();
        s.read_to_string(&mut seen).await?;
        Ok::<String, std::io::Error>(seen)
    });
    tokio::task::spawn_blocking(move || h.join())
        .await
        .unwrap()
        .unwrap()
        .unwrap()
        .unwrap()
}

/// One round trip from inside `pod` to `dst` with an unmodified client (capture applies).
pub async fn round_trip_from(
    pod: &PodNs,
    dst: SocketAddr,
    payload: Vec<u8>,
) -> std::io::Result<Vec<u8>> {
    let h = pod.ns.run(move || async move {
        let s = tokio::net::TcpStream::connect(dst).await?;
        workload::round_trip(s, &payload).await
    });
    tokio::task::spawn_blocking(move || h.join())
        .await
        .unwrap()
        .unwrap()
        .unwrap()
}

pub struct Mesh {
    pub nodes: Nodes,
    pub client: PodNs,
    pub server: PodNs,
    pub dir: tempfile::TempDir,
    pub agent_a: Agent,
    pub agent_b: Agent,
}

/// Two nodes, a client pod on A and a server pod on B, both agents knowing their node's pod (today's rules).
pub fn mesh(tag: &str, net: u8) -> Mesh {
    mesh_with(tag, net, PodRules::Redirect)
}

/// [`mesh`] with the pods under istio-cni's rule set `rules`.
pub fn mesh_with(tag: &str, net: u8, rules: PodRules) -> Mesh {
    let nodes = Nodes::create(tag, net).expect("network namespaces (needs root)");
    let client = nodes.pod_with(false, 1, "client", "client", rules).unwrap();
    let server = nodes.pod_with(true, 1, "echo", "echo", rules).unwrap();
    let dir = tempfile::tempdir().unwrap();
    weft_devmesh::write_dev_ca(&dir.path().join("ca"), "cluster.local").unwrap();
    std::fs::write(
        dir.path().join("mesh.yaml"),
        mesh_yaml(&[(&client, "node-a"), (&server, "node-b")]),
    )
    .unwrap();
    let agent_a = Agent::start(&dir.path().join("a.sock")).unwrap();
    let agent_b = Agent::start(&dir.path().join("b.sock")).unwrap();
    agent_a.know_pod(client.agent_pod());
    agent_b.know_pod(server.agent_pod());
    Mesh {
        nodes,
        client,
        server,
        dir,
        agent_a,
        agent_b,
    }
}

impl Mesh {
    pub async fn start_node(&self, b: bool, control_ip: &str, log: &str) -> NodeProcess {
        self.start_node_with(b, control_ip, log, &[]).await
    }

    pub async fn start_node_with(
        &self,
        b: bool,
        control_ip: &str,
        log: &str,
        more: &[&str],
    ) -> NodeProcess {
        let (name, ns, agent) = if b {
            ("node-b", &self.nodes.b, &self.agent_b)
        } else {
            ("node-a", &self.nodes.a, &self.agent_a)
        };
        let before = agent.events().snapshots;
        let mut n = spawn_weft(
            name,
            &ns.name,
            control_ip,
            self.dir.path(),
            &agent.path,
            log,
            more,
        );
        n.wait_ready(WAIT).await.unwrap();
        // weft is ready once it has acked the agent's snapshot, and the agent takes the connection as the one to
        // send new pods to only after it has read that ack: a test that adds a pod right away waits for that.
        agent
            .wait("weft's connection to take the snapshot", |e| {
                e.snapshots > before
            })
            .await;
        n
    }
}

pub fn pods_in_dump(dump: &serde_json::Value) -> Vec<(String, String)> {
    dump["inpod"]["pods"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|p| {
                    (
                        p["name"].as_str().unwrap_or("").to_owned(),
                        p["state"].as_str().unwrap_or("").to_owned(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Whether a TCP connection to `addr` from inside `ns` is accepted (a listener is there). Under TPROXY rules a SYN
/// for a port nobody listens on transparently is dropped rather than refused, so no answer within 5 s (a SYN-ACK
/// over a local veth takes microseconds) counts as not listening, not as the kernel's minutes of SYN retries.
pub async fn listening(ns: &weft_devmesh::netns::Netns, addr: SocketAddr) -> bool {
    let h = ns.run(move || async move {
        let sock =
            socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        // Marked, so the pod's own capture rules (when `ns` is a pod) do not redirect the probe.
        sock.set_mark(weft_conformance::podmesh::INPOD_MARK)
            .unwrap();
        sock.set_nonblocking(true).unwrap();
        let tcp = tokio::net::TcpSocket::from_std_stream(std::net::TcpStream::from(sock));
        matches!(
            tokio::time::timeout(std::time::Duration::from_secs(5), tcp.connect(addr)).await,
            Ok(Ok(_))
        )
    });
    tokio::task::spawn_blocking(move || h.join())
        .await
        .unwrap()
        .unwrap()
        .unwrap()
}
