//! Two nodes as two network namespaces joined by a veth pair, as on a cluster: node A's outbound TCP is captured by
//! iptables REDIRECT to weft's 15001 (weft's own sockets carry a mark and are skipped); node B's inbound plaintext
//! to the workload port is redirected to 15006. Needs root.
//!
//! [`NetMesh::start`] builds the standard layout (10.248.N.1 and .2); [`NetMesh::start_with`] takes a [`Layout`]:
//! other link addresses, extra addresses of any family, the same capture for IPv6, extra `weft run` flags per node
//! and the initial mesh file. [`Topology`] is the same namespaces, link and capture with no proxy, for other
//! proxies on the same layout ([`crate::ztunnel`]).

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
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

/// Addresses and flags of a mesh built by [`NetMesh::start_with`].
#[derive(Debug, Clone)]
pub struct Layout {
    /// Node A's address on the link (the client workload's IP).
    pub client_ip: Ipv4Addr,
    /// Node B's address on the link (the server workload's IP).
    pub server_ip: Ipv4Addr,
    /// Prefix length of both link addresses (they share one subnet).
    pub prefix: u8,
    /// More addresses (`ip/len`, IPv4 or IPv6) on node A's end of the link; IPv6 ones skip duplicate address
    /// detection, so they can be bound at once.
    pub extra_a: Vec<String>,
    /// More addresses on node B's end of the link.
    pub extra_b: Vec<String>,
    /// `weft run` flags for node A after the standard ones (a flag given twice: the last one wins).
    pub flags_a: Vec<String>,
    /// `weft run` flags for node B after the standard ones.
    pub flags_b: Vec<String>,
    /// Also capture IPv6 (ip6tables rules like the IPv4 ones). weft's capture listeners then need IPv6 addresses:
    /// e.g. `--outbound [::]:15001` for node A, `--inbound-plaintext [::]:15006` for node B.
    pub capture_ipv6: bool,
    /// The weft binary both nodes run (none: [`weft_devmesh::weft_binary`]); the bench runs a second build beside
    /// the first with it.
    pub weft_bin: Option<PathBuf>,
    /// Both nodes write each log line as it is logged (`--log-linger 0s`), so a test reads what was logged the
    /// moment it was; false: weft's default (the bench, which measures what ships).
    pub sync_logs: bool,
}

impl Layout {
    /// Client and server on `client_ip/prefix` and `server_ip/prefix`, nothing extra.
    pub fn new(client_ip: Ipv4Addr, server_ip: Ipv4Addr, prefix: u8) -> Self {
        Self {
            client_ip,
            server_ip,
            prefix,
            extra_a: Vec::new(),
            extra_b: Vec::new(),
            flags_a: Vec::new(),
            flags_b: Vec::new(),
            capture_ipv6: false,
            weft_bin: None,
            sync_logs: true,
        }
    }
}

fn add_addr(ns: &Netns, dev: &str, cidr: &str) -> Result<(), String> {
    if cidr.contains(':') {
        ns.exec("ip", &["addr", "add", cidr, "dev", dev, "nodad"])
    } else {
        ns.exec("ip", &["addr", "add", cidr, "dev", dev])
    }
}

/// Two namespaces joined by a veth pair with a node pair's capture and no proxy yet: node A's outbound TCP on the
/// link is redirected to 15001 unless marked [`MARK`] ([`capture_outbound`]), node B's inbound TCP to 8080 goes to
/// 15006 ([`capture_inbound`]). Both namespaces are deleted on drop. [`NetMesh`] runs weft on it;
/// [`crate::ztunnel::ZtunnelMesh`] runs Istio's ztunnel on the same layout.
#[derive(Debug)]
pub struct Topology {
    /// Node A's namespace (client side; capture on).
    pub ns_a: Netns,
    /// Node B's namespace (server side).
    pub ns_b: Netns,
    /// Node A's address on the link (the client workload's IP).
    pub client_ip: Ipv4Addr,
    /// Node B's address on the link (the server workload's IP).
    pub server_ip: Ipv4Addr,
}

impl Topology {
    /// Build the namespaces, the link, the extra addresses and the capture rules of `layout` (its flags are for
    /// weft and unused here); `tag` keeps names unique.
    pub fn create(tag: &str, layout: &Layout) -> Result<Self, String> {
        let id = std::process::id() % 100_000;
        let ns_a = Netns::create(&format!("weft-{tag}a-{id}"))?;
        let ns_b = Netns::create(&format!("weft-{tag}b-{id}"))?;
        let (client_ip, server_ip) = (layout.client_ip, layout.server_ip);
        let (ia, ib) = (format!("wv{tag}a"), format!("wv{tag}b"));
        link(
            &ns_a,
            &ia,
            &format!("{client_ip}/{}", layout.prefix),
            &ns_b,
            &ib,
            &format!("{server_ip}/{}", layout.prefix),
        )?;
        for cidr in &layout.extra_a {
            add_addr(&ns_a, &ia, cidr)?;
        }
        for cidr in &layout.extra_b {
            add_addr(&ns_b, &ib, cidr)?;
        }
        capture_outbound(&ns_a, &ia, layout.capture_ipv6)?;
        capture_inbound(&ns_b, &ib, layout.capture_ipv6)?;
        Ok(Self {
            ns_a,
            ns_b,
            client_ip,
            server_ip,
        })
    }
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
        log_linger: Some("0s".into()),
        env: Vec::new(),
    }
}

impl NetMesh {
    /// Build the namespaces, capture rules and both nodes; `tag` keeps names unique, `subnet` picks `10.248.<subnet>.x`.
    pub async fn start(tag: &str, subnet: u8, log: &str) -> Result<Self, String> {
        let (client_ip, server_ip) = (
            Ipv4Addr::new(10, 248, subnet, 1),
            Ipv4Addr::new(10, 248, subnet, 2),
        );
        let layout = Layout::new(client_ip, server_ip, 24);
        Self::start_with(tag, &layout, &yaml(client_ip, server_ip), log).await
    }

    /// Like [`NetMesh::start`] with the addresses and extra flags of `layout`, and `mesh_yaml` as the mesh file
    /// (both nodes read it: [`NetMesh::config_path`]).
    pub async fn start_with(
        tag: &str,
        layout: &Layout,
        mesh_yaml: &str,
        log: &str,
    ) -> Result<Self, String> {
        let Topology {
            ns_a,
            ns_b,
            client_ip,
            server_ip,
        } = Topology::create(tag, layout)?;
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let (a, b) = start_nodes(
            (&ns_a, &ns_b),
            dir.path(),
            mesh_yaml,
            (&layout.flags_a, &layout.flags_b),
            log,
            layout.weft_bin.as_deref(),
            layout.sync_logs,
        )
        .await?;
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

    /// Starts an echo server on [`NetMesh::server`] in node B's namespace, running until the process ends (its
    /// thread is detached when the handle is dropped).
    pub fn spawn_echo(&self) -> std::thread::JoinHandle<Result<Result<(), String>, String>> {
        let dst = self.server();
        self.ns_b.run(move || async move {
            let (_, serving) = weft_devmesh::workload::echo_server(dst)
                .await
                .map_err(|e| format!("echo server on {dst}: {e}"))?;
            let _ = serving.await;
            Ok(())
        })
    }

    /// The mesh file both nodes watch (rewrite it to change the mesh).
    pub fn config_path(&self) -> PathBuf {
        self.dir.path().join("mesh.yaml")
    }
}

/// iptables (and ip6tables when `ipv6`) in `ns`: outbound TCP leaving through `dev` is redirected to weft's 15001,
/// except weft's own sockets (marked [`MARK`]).
pub fn capture_outbound(ns: &Netns, dev: &str, ipv6: bool) -> Result<(), String> {
    let mark = format!("{MARK:#x}");
    let rule = [
        "-t",
        "nat",
        "-A",
        "OUTPUT",
        "-p",
        "tcp",
        "-o",
        dev,
        "-m",
        "mark",
        "!",
        "--mark",
        &mark,
        "-j",
        "REDIRECT",
        "--to-ports",
        "15001",
    ];
    ns.exec("iptables", &rule)?;
    if ipv6 {
        ns.exec("ip6tables", &rule)?;
    }
    Ok(())
}

/// iptables (and ip6tables when `ipv6`) in `ns`: plaintext arriving on `dev` for the workload port 8080 is
/// redirected to weft's 15006.
pub fn capture_inbound(ns: &Netns, dev: &str, ipv6: bool) -> Result<(), String> {
    let rule = [
        "-t",
        "nat",
        "-A",
        "PREROUTING",
        "-p",
        "tcp",
        "-i",
        dev,
        "--dport",
        "8080",
        "-j",
        "REDIRECT",
        "--to-ports",
        "15006",
    ];
    ns.exec("iptables", &rule)?;
    if ipv6 {
        ns.exec("ip6tables", &rule)?;
    }
    Ok(())
}

/// Write a dev CA and `mesh_yaml` (as `mesh.yaml`) into `dir`, start node A (client side: capture listener, no
/// plaintext inbound) in `ns.0` and node B (server side: no capture listener) in `ns.1`, each with HBONE on
/// `0.0.0.0:15008`, the [`MARK`] and `flags` after the standard ones, and wait until both are ready. Both run
/// `weft` (none: [`weft_devmesh::weft_binary`]).
pub async fn start_nodes(
    ns: (&Netns, &Netns),
    dir: &Path,
    mesh_yaml: &str,
    flags: (&[String], &[String]),
    log: &str,
    weft: Option<&Path>,
    sync_logs: bool,
) -> Result<(NodeProcess, NodeProcess), String> {
    let ca = dir.join("ca");
    weft_devmesh::write_dev_ca(&ca, "cluster.local").map_err(|e| e.to_string())?;
    let config = dir.join("mesh.yaml");
    std::fs::write(&config, mesh_yaml).map_err(|e| e.to_string())?;
    let weft = match weft {
        Some(w) => w.to_path_buf(),
        None => weft_devmesh::weft_binary()?,
    };
    let mark = format!("{MARK:#x}");
    let common = [
        "--mark",
        &mark,
        "--socks5",
        "off",
        "--hbone",
        "0.0.0.0:15008",
    ];
    let flags_a: Vec<&str> = flags.0.iter().map(String::as_str).collect();
    let flags_b: Vec<&str> = flags.1.iter().map(String::as_str).collect();
    let a_extra = [&common[..], &["--inbound-plaintext", "off"], &flags_a].concat();
    let b_extra = [&common[..], &["--outbound", "off"], &flags_b].concat();
    let linger = |mut o: NodeOptions| {
        o.log_linger = sync_logs.then(|| "0s".to_owned());
        o
    };
    let mut a = NodeProcess::spawn(
        &weft,
        &linger(node_opts("node-a", ns.0, &config, &ca, dir, &a_extra, log)),
    )
    .map_err(|e| e.to_string())?;
    let mut b = NodeProcess::spawn(
        &weft,
        &linger(node_opts("node-b", ns.1, &config, &ca, dir, &b_extra, log)),
    )
    .map_err(|e| e.to_string())?;
    a.wait_ready(Duration::from_secs(30)).await?;
    b.wait_ready(Duration::from_secs(30)).await?;
    Ok((a, b))
}

/// Connect from inside node A's namespace; `bypass` marks the socket so capture skips it (a direct connection).
pub async fn connect(dst: SocketAddr, bypass: bool) -> std::io::Result<tokio::net::TcpStream> {
    let sock = socket2::Socket::new(
        socket2::Domain::for_address(dst),
        socket2::Type::STREAM,
        None,
    )?;
    if bypass {
        sock.set_mark(MARK)?;
    }
    sock.set_nonblocking(true)?;
    sock.set_tcp_nodelay(true)?;
    let tcp = tokio::net::TcpSocket::from_std_stream(std::net::TcpStream::from(sock));
    tcp.connect(dst).await
}

/// From inside `ns`, sends `data` to `dst` through capture (a new connection each attempt) and returns what the
/// echo server there sent back, retrying until a whole exchange succeeds (the server may still be starting).
pub async fn echo_through_capture(ns: &Netns, dst: SocketAddr, data: &[u8]) -> Vec<u8> {
    crate::eventually(
        Duration::from_secs(30),
        "a round trip through capture",
        || {
            let sent = data.to_vec();
            let h = ns.run(move || async move {
                weft_devmesh::workload::round_trip(connect(dst, false).await?, &sent).await
            });
            async move {
                tokio::task::spawn_blocking(move || h.join())
                    .await
                    .ok()?
                    .ok()?
                    .ok()?
                    .ok()
            }
        },
    )
    .await
}
