//! Istio ambient's real ztunnel as a node pair on a [`Topology`], for the side-by-side benches (and any interop test
//! that needs the real thing). The binary is built from ztunnel's public source outside this repo and named by
//! `ZTUNNEL_BIN`; without it [`ztunnel_binary`] says why and callers print that and skip (CI has no ztunnel).
//!
//! Each node runs one ztunnel in its namespace in dedicated mode: `PROXY_MODE=dedicated` with the one workload it
//! proxies for in `PROXY_WORKLOAD_INFO` (`namespace/name/service-account`), the mesh from `LOCAL_XDS_PATH` (the
//! local-config file weft reads too, [`crate::netmesh::yaml`]) and no xDS (`XDS_ADDRESS` empty), its own sockets
//! marked [`MARK`] (`PACKET_MARK`) so the capture skips them, and `ENABLE_ORIG_SRC=false` (a namespace here has no
//! transparent-proxy routes). The listeners are ztunnel's standard ones, which the topology's capture expects:
//! outbound 15001, inbound plaintext 15006, HBONE 15008, readiness 15021.
//!
//! A release ztunnel has no fake CA (that needs its `testing` feature), so its certificates come from `weft-ca`,
//! the reference Istio-protocol CA (`runtime/control/src/ca`), over gRPC+TLS on node A's link address: each node
//! authenticates with a static token whose identity is the workload it proxies for, so it only ever asks for its
//! own identity (dedicated mode sends no impersonation). `weft-ca` is found next to the weft binary
//! ([`weft_devmesh::weft_binary`]).

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use weft_devmesh::netns::Netns;
use weft_devmesh::{NodeOptions, NodeProcess};

use crate::netmesh::{Layout, MARK, Topology, yaml};

/// How long a process may take to come up (an event wait: the floor, not the expected time).
const PATIENCE: Duration = Duration::from_secs(30);
/// ztunnel's readiness endpoint, inside its namespace.
const READY: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::LOCALHOST), 15021);
/// weft-ca's gRPC+TLS port, on node A's link address.
const CA_PORT: u16 = 15012;

/// The ztunnel binary named by `ZTUNNEL_BIN`, or the reason there is none (print it and skip).
pub fn ztunnel_binary() -> Result<PathBuf, String> {
    let Some(p) = std::env::var_os("ZTUNNEL_BIN") else {
        return Err(
            "ZTUNNEL_BIN is not set (a ztunnel built from its public source; CI has none)".into(),
        );
    };
    let p = PathBuf::from(p);
    if !p.is_file() {
        return Err(format!("ZTUNNEL_BIN={} is not a file", p.display()));
    }
    Ok(p)
}

/// `mesh_yaml` with `trustDomain: cluster.local` on every workload: ztunnel's local config has no default trust
/// domain (it would ask for `spiffe:///ns/...`), weft's defaults to `cluster.local`; spelled out, both read the same
/// mesh.
pub fn with_trust_domain(mesh_yaml: &str) -> String {
    let mut out = String::with_capacity(mesh_yaml.len() + 128);
    for line in mesh_yaml.lines() {
        out.push_str(line);
        out.push('\n');
        if line.starts_with("  serviceAccount:") {
            out.push_str("  trustDomain: cluster.local\n");
        }
    }
    out
}

/// A child process inside a network namespace, its output in a file; killed on drop.
#[derive(Debug)]
pub struct NsProcess {
    /// What it is (for messages).
    pub name: String,
    child: Option<Child>,
    netns: String,
    /// Its stdout and stderr.
    pub log_path: PathBuf,
}

impl NsProcess {
    /// Start `bin args` in namespace `netns` with `env` added to this process's environment, output to
    /// `log_path`.
    pub fn spawn(
        name: &str,
        netns: &str,
        bin: &Path,
        args: &[String],
        env: &[(String, String)],
        log_path: PathBuf,
    ) -> Result<Self, String> {
        let log =
            std::fs::File::create(&log_path).map_err(|e| format!("{}: {e}", log_path.display()))?;
        let err = log.try_clone().map_err(|e| e.to_string())?;
        let child = Command::new("ip")
            .args(["netns", "exec", netns])
            .arg(bin)
            .args(args)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            .spawn()
            .map_err(|e| format!("{name} ({}): {e}", bin.display()))?;
        Ok(Self {
            name: name.into(),
            child: Some(child),
            netns: netns.into(),
            log_path,
        })
    }

    /// Its process id (`ip netns exec` execs the binary, so this is the program's own, for `/proc`).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The last `n` lines of its output.
    pub fn log_tail(&self, n: usize) -> String {
        let text = std::fs::read_to_string(&self.log_path).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// An error if the process has exited (with its status and the tail of its output).
    fn check_alive(&mut self, what: &str) -> Result<(), String> {
        if let Some(c) = self.child.as_mut()
            && let Ok(Some(status)) = c.try_wait()
        {
            return Err(format!(
                "{} exited ({status}) {what}:\n{}",
                self.name,
                self.log_tail(30)
            ));
        }
        Ok(())
    }

    /// Wait until `GET path` on `addr`, from inside its namespace, answers 200; fails at once, with the tail of its
    /// output, if the process exits first.
    pub async fn wait_http_ok(
        &mut self,
        addr: SocketAddr,
        path: &str,
        timeout: Duration,
    ) -> Result<(), String> {
        let start = Instant::now();
        let mut last = String::from("no answer yet");
        while start.elapsed() < timeout {
            self.check_alive("before it was ready")?;
            let p = path.to_owned();
            let answer = Netns::existing(&self.netns)
                .within(move || async move { weft_devmesh::http::request(addr, "GET", &p).await })
                .await;
            match answer {
                Ok(Ok((200, _))) => return Ok(()),
                Ok(Ok((code, body))) => last = format!("{code} {}", body.trim()),
                Ok(Err(e)) => last = e.to_string(),
                Err(e) => last = e,
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Err(format!(
            "{} not ready after {timeout:?} (GET {addr}{path}: {last}):\n{}",
            self.name,
            self.log_tail(30)
        ))
    }

    /// Wait until its output has a line containing `needle`; fails at once if the process exits first.
    pub async fn wait_log(&mut self, needle: &str, timeout: Duration) -> Result<(), String> {
        let start = Instant::now();
        while start.elapsed() < timeout {
            if std::fs::read_to_string(&self.log_path)
                .unwrap_or_default()
                .contains(needle)
            {
                return Ok(());
            }
            self.check_alive(&format!("before logging `{needle}`"))?;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Err(format!(
            "{}: no `{needle}` after {timeout:?}:\n{}",
            self.name,
            self.log_tail(30)
        ))
    }

    /// SIGTERM, then SIGKILL if it has not exited after `grace`.
    pub async fn terminate(&mut self, grace: Duration) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let _ = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
        let start = Instant::now();
        while start.elapsed() < grace {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

impl Drop for NsProcess {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A ztunnel node pair (the client workload `default/client` on node A, the server workload `default/echo` on node
/// B, as in [`yaml`]) with the CA that signs their certificates.
#[derive(Debug)]
pub struct ZtunnelMesh {
    /// Node A's ztunnel. (Field order is drop order: processes go before the namespaces and the directory.)
    pub a: NsProcess,
    /// Node B's ztunnel.
    pub b: NsProcess,
    /// weft-ca, in node A's namespace.
    pub ca: NsProcess,
    /// Namespaces, link and capture.
    pub topo: Topology,
    /// Scratch directory (mesh file, CA, tokens, logs).
    pub dir: tempfile::TempDir,
}

impl ZtunnelMesh {
    /// Namespaces `tag`, link 10.248.`subnet`.1 and .2, ztunnel `bin` on both nodes with `RUST_LOG=log` and
    /// `extra_env` added (e.g. a tuning knob under test); waits until the CA serves and both nodes are ready.
    pub async fn start(
        tag: &str,
        subnet: u8,
        bin: &Path,
        log: &str,
        extra_env: &[(String, String)],
    ) -> Result<Self, String> {
        let s = Setup::new(tag, subnet).await?;
        let mut a = s.ztunnel("a", bin, log, extra_env)?;
        let mut b = s.ztunnel("b", bin, log, extra_env)?;
        a.wait_http_ok(READY, "/healthz/ready", PATIENCE).await?;
        b.wait_http_ok(READY, "/healthz/ready", PATIENCE).await?;
        Ok(Self {
            a,
            b,
            ca: s.ca,
            topo: s.topo,
            dir: s.dir,
        })
    }

    /// The server workload's address (port 8080).
    pub fn server(&self) -> SocketAddr {
        SocketAddr::from((self.topo.server_ip, 8080))
    }

    /// Stop both nodes, then the CA.
    pub async fn stop(&mut self) {
        let grace = Duration::from_secs(5);
        self.a.terminate(grace).await;
        self.b.terminate(grace).await;
        self.ca.terminate(grace).await;
    }
}

/// A control plane serving the mesh over Delta ADS (TLS), for nodes started by a [`Setup`] with
/// [`Setup::xds`] set: they then read no mesh file.
#[derive(Debug, Clone)]
pub struct XdsSource {
    /// `https://ip:port`, reachable from both nodes' namespaces.
    pub address: String,
    /// The PEM root its certificate chains to.
    pub root: PathBuf,
}

/// The common part of a pair: namespaces with capture, the mesh file (with its trust domain spelled out), the dev
/// CA's files and `weft-ca` serving them to ztunnel. Nodes read the mesh file, or take it over xDS from
/// [`Setup::xds`] when that is set.
#[derive(Debug)]
pub struct Setup {
    /// weft-ca, in node A's namespace. (Field order is drop order: the CA goes before the namespaces.)
    pub ca: NsProcess,
    /// Namespaces, link and capture.
    pub topo: Topology,
    /// Scratch directory.
    pub dir: tempfile::TempDir,
    ca_addr: SocketAddr,
    ca_dir: PathBuf,
    /// Where nodes started from now on take the mesh: none, the mesh file.
    pub xds: Option<XdsSource>,
}

impl Setup {
    /// Namespaces `tag` (link 10.248.`subnet`.1 and .2, capture), the mesh file and weft-ca in node A's namespace.
    pub async fn new(tag: &str, subnet: u8) -> Result<Self, String> {
        let client_ip = Ipv4Addr::new(10, 248, subnet, 1);
        let server_ip = Ipv4Addr::new(10, 248, subnet, 2);
        let topo = Topology::create(tag, &Layout::new(client_ip, server_ip, 24))?;
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let d = dir.path();
        let write = |name: &str, text: &str| {
            std::fs::write(d.join(name), text).map_err(|e| format!("{name}: {e}"))
        };
        let ca_dir = d.join("ca");
        weft_devmesh::write_dev_ca(&ca_dir, "cluster.local").map_err(|e| e.to_string())?;
        write("mesh.yaml", &with_trust_domain(&yaml(client_ip, server_ip)))?;
        write(
            "tokens.yaml",
            "tokens:\n\
             - {token: node-a-token, node: node-a, identity: spiffe://cluster.local/ns/default/sa/client}\n\
             - {token: node-b-token, node: node-b, identity: spiffe://cluster.local/ns/default/sa/echo}\n",
        )?;
        write("token-a", "node-a-token")?;
        write("token-b", "node-b-token")?;
        let ca_addr = SocketAddr::from((client_ip, CA_PORT));
        let ca = start_weft_ca(&topo.ns_a.name, ca_addr, d, None).await?;
        Ok(Self {
            topo,
            dir,
            ca,
            ca_addr,
            ca_dir,
            xds: None,
        })
    }

    fn path(&self, name: &str) -> String {
        self.dir.path().join(name).display().to_string()
    }

    /// Node `n` ("a": the client's, "b": the server's) as a ztunnel proxying for that node's workload.
    pub fn ztunnel(
        &self,
        n: &str,
        bin: &Path,
        log: &str,
        extra_env: &[(String, String)],
    ) -> Result<NsProcess, String> {
        let (ns, workload) = match n {
            "a" => (&self.topo.ns_a.name, "default/client/client"),
            _ => (&self.topo.ns_b.name, "default/echo/echo"),
        };
        let (xds_address, mesh_file, xds_root) = match &self.xds {
            Some(x) => (
                x.address.clone(),
                String::new(),
                x.root.display().to_string(),
            ),
            None => (String::new(), self.path("mesh.yaml"), String::new()),
        };
        let mut env: Vec<(String, String)> = [
            ("XDS_ADDRESS", xds_address),
            ("LOCAL_XDS_PATH", mesh_file),
            ("XDS_ROOT_CA", xds_root),
            ("CA_ADDRESS", format!("https://{}", self.ca_addr)),
            (
                "CA_ROOT_CA",
                self.ca_dir.join("root-cert.pem").display().to_string(),
            ),
            ("AUTH_TOKEN", self.path(&format!("token-{n}"))),
            ("PROXY_MODE", "dedicated".into()),
            ("PROXY_WORKLOAD_INFO", workload.into()),
            ("NODE_NAME", format!("node-{n}")),
            ("POD_NAME", format!("ztunnel-{n}")),
            ("POD_NAMESPACE", "istio-system".into()),
            ("ENABLE_ORIG_SRC", "false".into()),
            ("PACKET_MARK", MARK.to_string()),
            ("RUST_LOG", log.into()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        env.retain(|(_, v)| !v.is_empty() || self.xds.is_none());
        env.extend(extra_env.iter().cloned());
        NsProcess::spawn(
            &format!("ztunnel node-{n}"),
            ns,
            bin,
            &[],
            &env,
            self.dir.path().join(format!("ztunnel-{n}.log")),
        )
    }

    /// Node `n` as weft, with the same mesh (file or xDS) and its certificates from the same CA's files
    /// (`--ca-dir`).
    pub fn weft(&self, n: &str, log: &str) -> Result<NodeProcess, String> {
        let (ns, role) = match n {
            "a" => (&self.topo.ns_a, ["--inbound-plaintext", "off"]),
            _ => (&self.topo.ns_b, ["--outbound", "off"]),
        };
        let mark = format!("{MARK:#x}");
        let extra = [
            "--mark",
            &mark,
            "--socks5",
            "off",
            "--hbone",
            "0.0.0.0:15008",
            role[0],
            role[1],
        ];
        let mut extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        let config = match &self.xds {
            Some(x) => {
                extra.extend([
                    "--xds-address".into(),
                    x.address.clone(),
                    "--xds-root-cert".into(),
                    x.root.display().to_string(),
                    "--xds-token-file".into(),
                    self.path(&format!("token-{n}")),
                ]);
                PathBuf::new()
            }
            None => self.dir.path().join("mesh.yaml"),
        };
        let opts = NodeOptions {
            name: format!("node-{n}"),
            control_ip: Ipv4Addr::LOCALHOST.into(),
            config,
            ca_dir: self.ca_dir.clone(),
            log_path: self.dir.path().join(format!("weft-{n}.log")),
            netns: Some(ns.name.clone()),
            extra,
            log: log.into(),
            log_linger: Some("0s".into()),
            env: Vec::new(),
        };
        NodeProcess::spawn(&weft_devmesh::weft_binary()?, &opts).map_err(|e| e.to_string())
    }
}

/// Starts `weft-ca` (found next to the weft binary) in namespace `netns`, serving on `listen` (also its
/// certificate's address) the CA in `dir/ca` to the holders of the tokens in `dir/tokens.yaml`, for the workloads of
/// `dir/mesh.yaml`; `trusted_node_accounts` (`namespace/account`) may ask for the identities of their node's
/// workloads, as ztunnel in shared (in-pod) mode does. Waits until it serves; its output goes to `dir/weft-ca.log`.
pub async fn start_weft_ca(
    netns: &str,
    listen: SocketAddr,
    dir: &Path,
    trusted_node_accounts: Option<&str>,
) -> Result<NsProcess, String> {
    let weft_ca = weft_devmesh::weft_binary()?.with_file_name("weft-ca");
    if !weft_ca.is_file() {
        return Err(format!(
            "{} not found (ztunnel's certificates come from it): build it with `cargo build --workspace --bins`",
            weft_ca.display()
        ));
    }
    let path = |name: &str| dir.join(name).display().to_string();
    let mut args: Vec<String> = [
        "--listen",
        &listen.to_string(),
        "--ca-dir",
        &path("ca"),
        "--mesh-config",
        &path("mesh.yaml"),
        "--tokens",
        &path("tokens.yaml"),
        "--tls-san",
        &listen.ip().to_string(),
        "--log",
        "warn,weft_ca=info",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    if let Some(accounts) = trusted_node_accounts {
        args.extend(["--trusted-node-accounts".into(), accounts.into()]);
    }
    let mut ca = NsProcess::spawn(
        "weft-ca",
        netns,
        &weft_ca,
        &args,
        &[],
        dir.join("weft-ca.log"),
    )?;
    ca.wait_log("weft-ca serving", PATIENCE).await?;
    Ok(ca)
}

/// Istio's ztunnel serving one node in in-pod mode (`PROXY_MODE=shared`), as in a cluster: in a network namespace
/// of its own (its pod's), the node's pods handed to it by the CNI agent at `uds` (`INPOD_UDS`), the mesh from
/// `dir/mesh.yaml`, its certificates from the `weft-ca` at `ca` (trusting `dir/ca/root-cert.pem`, authenticating
/// with the token in `dir/token-<node>` as `istio-system/ztunnel`).
#[derive(Debug, Clone, Copy)]
pub struct InpodZtunnel<'a> {
    /// The ztunnel binary.
    pub bin: &'a Path,
    /// Its namespace.
    pub netns: &'a str,
    /// The node it serves (`NODE_NAME`).
    pub node: &'a str,
    /// Its pod's name (`POD_NAME`).
    pub pod: &'a str,
    /// The CNI agent's socket.
    pub uds: &'a Path,
    /// The directory of the mesh file, the CA's root and the token; its log goes there too.
    pub dir: &'a Path,
    /// weft-ca's address, reachable from `netns`.
    pub ca: SocketAddr,
    /// `RUST_LOG`.
    pub log: &'a str,
    /// Its log file's name in `dir`, without `.log`.
    pub log_name: &'a str,
}

impl InpodZtunnel<'_> {
    /// Starts it with `extra_env` added (a setting under test) and waits until it is ready (`/healthz/ready` in its
    /// namespace: it has taken the agent's snapshot). The agent counts the snapshot acked a moment later.
    pub async fn start(&self, extra_env: &[(String, String)]) -> Result<NsProcess, String> {
        let path = |n: &str| self.dir.join(n).display().to_string();
        let mut env: Vec<(String, String)> = [
            ("PROXY_MODE", "shared".to_owned()),
            ("INPOD_UDS", self.uds.display().to_string()),
            ("XDS_ADDRESS", String::new()),
            ("LOCAL_XDS_PATH", path("mesh.yaml")),
            ("CA_ADDRESS", format!("https://{}", self.ca)),
            ("CA_ROOT_CA", path("ca/root-cert.pem")),
            ("AUTH_TOKEN", path(&format!("token-{}", self.node))),
            ("NODE_NAME", self.node.into()),
            ("POD_NAME", self.pod.into()),
            ("POD_NAMESPACE", "istio-system".into()),
            ("SERVICE_ACCOUNT", "ztunnel".into()),
            ("RUST_LOG", self.log.into()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        env.extend(extra_env.iter().cloned());
        let mut z = NsProcess::spawn(
            &format!("ztunnel {}", self.node),
            self.netns,
            self.bin,
            &[],
            &env,
            self.dir.join(format!("{}.log", self.log_name)),
        )?;
        z.wait_http_ok(READY, "/healthz/ready", PATIENCE).await?;
        Ok(z)
    }
}

/// One weft node and one ztunnel node on the same layout, for interop: weft on node A (the client's) and ztunnel
/// on node B, or the other way round. Both get their certificates from the same CA.
#[derive(Debug)]
pub struct MixedMesh {
    /// The weft node. (Field order is drop order: processes go before the namespaces and the directory.)
    pub weft: NodeProcess,
    /// The ztunnel node.
    pub ztunnel: NsProcess,
    /// weft-ca, in node A's namespace.
    pub ca: NsProcess,
    /// Namespaces, link and capture.
    pub topo: Topology,
    /// Scratch directory (mesh file, CA, tokens, logs).
    pub dir: tempfile::TempDir,
}

impl MixedMesh {
    /// Like [`ZtunnelMesh::start`], with weft on node A when `weft_on_a`, else on node B, and ztunnel `bin` on the
    /// other; waits until both are ready.
    pub async fn start(
        tag: &str,
        subnet: u8,
        bin: &Path,
        log: &str,
        weft_on_a: bool,
    ) -> Result<Self, String> {
        let s = Setup::new(tag, subnet).await?;
        let (w, z) = if weft_on_a { ("a", "b") } else { ("b", "a") };
        let mut ztunnel = s.ztunnel(z, bin, "info", &[])?;
        let mut weft = s.weft(w, log)?;
        ztunnel
            .wait_http_ok(READY, "/healthz/ready", PATIENCE)
            .await?;
        weft.wait_ready(PATIENCE).await?;
        Ok(Self {
            weft,
            ztunnel,
            ca: s.ca,
            topo: s.topo,
            dir: s.dir,
        })
    }

    /// The server workload's address (port 8080).
    pub fn server(&self) -> SocketAddr {
        SocketAddr::from((self.topo.server_ip, 8080))
    }
}
