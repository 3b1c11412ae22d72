//! Two nodes as two network namespaces joined by a veth pair, as on a cluster: node A's outbound TCP is captured by
//! iptables REDIRECT to weft's 15001 (weft's own sockets carry a mark and are skipped); node B's inbound plaintext
//! to the workload port is redirected to 15006. Needs root.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use weft_devmesh::netns::{Netns, link};
use weft_devmesh::{NodeOptions, NodeProcess};

/// The mark weft puts on its own sockets here.
pub const MARK: u32 = 0x539;

/// The mesh file: a client workload on node A, a server workload on node B (port 8080).
pub fn yaml(client: Ipv4Addr, server: Ipv4Addr) -> String {
    format!(
        r#"workloads:
- uid: Kubernetes//Pod/default/client
  name: client
  namespace: default
  serviceAccount: client
  workloadIps: [{client}]
  protocol: HBONE
  node: node-a
  services: {{}}
- uid: Kubernetes//Pod/default/echo
  name: echo
  namespace: default
  serviceAccount: echo
  workloadIps: [{server}]
  protocol: HBONE
  node: node-b
  services: {{}}
"#
    )
}

/// A running two-namespace mesh; nodes are killed and namespaces deleted on drop.
#[derive(Debug)]
pub struct NetMesh {
    /// Node A's namespace (client side; capture on).
    pub ns_a: Netns,
    /// Node B's namespace (server side).
    pub ns_b: Netns,
    /// Client workload IP (node A).
    pub client_ip: Ipv4Addr,
    /// Server workload IP (node B).
    pub server_ip: Ipv4Addr,
    /// Node A.
    pub a: NodeProcess,
    /// Node B.
    pub b: NodeProcess,
    /// Scratch directory (config, CA, logs).
    pub dir: tempfile::TempDir,
}

fn node_opts(
    name: &str,
    ns: &Netns,
    config: &Path,
    ca: &Path,
    dir: &Path,
    extra: &[&str],
    log: &str,
) -> NodeOptions {
    NodeOptions {
        name: name.into(),
        control_ip: "127.0.0.1".parse().expect("literal"),
        config: config.into(),
        ca_dir: ca.into(),
        log_path: dir.join(format!("{name}.log")),
        netns: Some(ns.name.clone()),
        extra: extra.iter().map(|s| s.to_string()).collect(),
        log: log.into(),
    }
}

impl NetMesh {
    /// Build the namespaces, capture rules and both nodes; `tag` keeps names unique, `subnet` picks 10.248.<subnet>.x.
    pub async fn start(tag: &str, subnet: u8, log: &str) -> Result<Self, String> {
        let id = std::process::id() % 100_000;
        let ns_a = Netns::create(&format!("weft-{tag}a-{id}"))?;
        let ns_b = Netns::create(&format!("weft-{tag}b-{id}"))?;
        let (client_ip, server_ip) = (
            Ipv4Addr::new(10, 248, subnet, 1),
            Ipv4Addr::new(10, 248, subnet, 2),
        );
        let (ia, ib) = (format!("wv{tag}a"), format!("wv{tag}b"));
        link(
            &ns_a,
            &ia,
            &format!("{client_ip}/24"),
            &ns_b,
            &ib,
            &format!("{server_ip}/24"),
        )?;
        let mark = format!("{MARK:#x}");
        ns_a.exec(
            "iptables",
            &[
                "-t",
                "nat",
                "-A",
                "OUTPUT",
                "-p",
                "tcp",
                "-o",
                &ia,
                "-m",
                "mark",
                "!",
                "--mark",
                &mark,
                "-j",
                "REDIRECT",
                "--to-ports",
                "15001",
            ],
        )?;
        ns_b.exec(
            "iptables",
            &[
                "-t",
                "nat",
                "-A",
                "PREROUTING",
                "-p",
                "tcp",
                "-i",
                &ib,
                "--dport",
                "8080",
                "-j",
                "REDIRECT",
                "--to-ports",
                "15006",
            ],
        )?;
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let ca = dir.path().join("ca");
        weft_devmesh::write_dev_ca(&ca, "cluster.local").map_err(|e| e.to_string())?;
        let config = dir.path().join("mesh.yaml");
        std::fs::write(&config, yaml(client_ip, server_ip)).map_err(|e| e.to_string())?;
        let weft = weft_devmesh::weft_binary()?;
        let common = [
            "--mark",
            &mark,
            "--socks5",
            "off",
            "--hbone",
            "0.0.0.0:15008",
        ];
        let a_extra = [&common[..], &["--inbound-plaintext", "off"]].concat();
        let b_extra = [&common[..], &["--outbound", "off"]].concat();
        let mut a = NodeProcess::spawn(
            &weft,
            &node_opts("node-a", &ns_a, &config, &ca, dir.path(), &a_extra, log),
        )
        .map_err(|e| e.to_string())?;
        let mut b = NodeProcess::spawn(
            &weft,
            &node_opts("node-b", &ns_b, &config, &ca, dir.path(), &b_extra, log),
        )
        .map_err(|e| e.to_string())?;
        a.wait_ready(Duration::from_secs(30)).await?;
        b.wait_ready(Duration::from_secs(30)).await?;
        Ok(Self {
            ns_a,
            ns_b,
            client_ip,
            server_ip,
            a,
            b,
            dir,
        })
    }

    /// The server workload's address (port 8080).
    pub fn server(&self) -> SocketAddr {
        SocketAddr::from((self.server_ip, 8080))
    }
}

/// Connect from inside node A's namespace; `bypass` marks the socket so capture skips it (a direct connection).
pub async fn connect(dst: SocketAddr, bypass: bool) -> std::io::Result<tokio::net::TcpStream> {
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
    if bypass {
        sock.set_mark(MARK)?;
    }
    sock.set_nonblocking(true)?;
    sock.set_tcp_nodelay(true)?;
    let tcp = tokio::net::TcpSocket::from_std_stream(std::net::TcpStream::from(sock));
    tcp.connect(dst).await
}
