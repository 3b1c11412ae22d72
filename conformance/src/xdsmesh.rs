//! A two-node mesh fed over xDS: a real `weft-control` process serves a mesh file (edited live by the test) to two
//! real `weft run` processes that have no config file, over TLS with the dev CA and per-node bearer tokens.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

pub use weft_devmesh::control::{Control, free_port, node_token, plugin_xds_flags, xds_flags};
use weft_devmesh::{NodeOptions, NodeProcess, workload};

use crate::{Addrs, eventually};

/// What else the mesh runs with.
#[derive(Debug, Default, Clone)]
pub struct MeshOptions {
    /// weft-control serves the WeftPlugin files of this directory, and the nodes take their plugins from it.
    pub plugins_dir: Option<PathBuf>,
    /// More `weft run` flags for both nodes.
    pub node_extra: Vec<String>,
}

/// The two-node mesh fed by `weft-control`.
#[derive(Debug)]
pub struct XdsMesh {
    /// Addresses.
    pub addrs: Addrs,
    /// Node A (client side).
    pub a: NodeProcess,
    /// Node B (server side).
    pub b: NodeProcess,
    /// The control plane.
    pub control: Control,
    /// Its status endpoint (`GET /status`).
    pub control_status: SocketAddr,
    /// The mesh file weft-control serves.
    pub mesh_file: PathBuf,
    /// Scratch directory.
    pub dir: tempfile::TempDir,
    echo: Vec<tokio::task::JoinHandle<()>>,
}

impl XdsMesh {
    /// Start weft-control with `yaml` and two nodes fed by it; echo servers listen on `echo_ips` port 8080. Ready
    /// when both nodes are (their readiness waits for the first complete sync).
    pub async fn start(addrs: Addrs, yaml: &str, echo_ips: &[IpAddr]) -> Result<Self, String> {
        Self::start_with(addrs, yaml, echo_ips, MeshOptions::default()).await
    }

    /// [`XdsMesh::start`] with `opts`.
    pub async fn start_with(
        addrs: Addrs,
        yaml: &str,
        echo_ips: &[IpAddr],
        opts: MeshOptions,
    ) -> Result<Self, String> {
        let weft = weft_devmesh::weft_binary()?;
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let ca = dir.path().join("ca");
        weft_devmesh::write_dev_ca(&ca, "cluster.local").map_err(|e| e.to_string())?;
        let mesh_file = dir.path().join("mesh.yaml");
        std::fs::write(&mesh_file, yaml).map_err(|e| e.to_string())?;
        let tokens_file = weft_devmesh::control::write_tokens(dir.path(), &["node-a", "node-b"])
            .map_err(|e| e.to_string())?;
        let mut echo = Vec::new();
        for ip in echo_ips {
            let (_, t) = workload::echo_server(SocketAddr::new(*ip, 8080))
                .await
                .map_err(|e| format!("echo server on {ip}: {e}"))?;
            echo.push(t);
        }
        let control_status = free_port()?;
        let control = Control::spawn(
            &weft_devmesh::control_binary()?,
            free_port()?,
            &ca,
            &tokens_file,
            &mesh_file,
            opts.plugins_dir.as_deref(),
            Some(control_status),
            &dir.path().join("control.log"),
        )?;
        let root = ca.join("root-cert.pem");
        let options = |name: &str, ip: IpAddr| {
            let mut o = NodeOptions::loopback(name, ip, Path::new(""), &ca, dir.path());
            o.extra.extend(xds_flags(
                control.addr,
                &root,
                &dir.path().join(format!("{name}.token")),
                name,
            ));
            if opts.plugins_dir.is_some() {
                o.extra.extend(plugin_xds_flags(
                    control.addr,
                    &root,
                    &dir.path().join(format!("{name}.token")),
                ));
            }
            o.extra.extend(opts.node_extra.iter().cloned());
            o
        };
        let mut a = NodeProcess::spawn(&weft, &options("node-a", addrs.node_a()))
            .map_err(|e| e.to_string())?;
        let mut b = NodeProcess::spawn(&weft, &options("node-b", addrs.node_b()))
            .map_err(|e| e.to_string())?;
        a.wait_ready(Duration::from_secs(30)).await?;
        b.wait_ready(Duration::from_secs(30)).await?;
        Ok(Self {
            addrs,
            a,
            b,
            control,
            control_status,
            mesh_file,
            dir,
            echo,
        })
    }

    /// Replace the mesh file (atomically, as an editor or a ConfigMap update does).
    pub fn write_mesh(&self, yaml: &str) {
        let tmp = self.mesh_file.with_extension("tmp");
        if std::fs::write(&tmp, yaml).is_ok() {
            let _ = std::fs::rename(&tmp, &self.mesh_file);
        }
    }
}

impl Drop for XdsMesh {
    fn drop(&mut self) {
        for t in &self.echo {
            t.abort();
        }
    }
}

/// The `sources.xds[0]` entry of a node's `/config_dump` (the mesh source).
pub async fn mesh_source(node: &NodeProcess) -> Option<serde_json::Value> {
    let d = node.config_dump().await.ok()?;
    d["sources"]["xds"].get(0).cloned()
}

/// Wait until `node`'s state (its `/config_dump`) satisfies `pred`.
pub async fn until_dump(
    node: &NodeProcess,
    what: &str,
    pred: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    eventually(Duration::from_secs(30), what, || async {
        node.config_dump().await.ok().filter(|d| pred(d))
    })
    .await
}

/// Whether `dump` lists a workload with this uid.
pub fn has_workload(dump: &serde_json::Value, uid: &str) -> bool {
    dump["workloads"]
        .as_array()
        .is_some_and(|ws| ws.iter().any(|w| w["uid"] == uid))
}

/// One echo round trip from the client workload through `node` to `dst`.
pub async fn echo_once(node: &NodeProcess, a: crate::Addrs, dst: SocketAddr) -> Result<(), String> {
    let s = weft_devmesh::socks5::connect(node.socks5, Some(IpAddr::V4(a.client())), dst)
        .await
        .map_err(|e| format!("{e:?}"))?;
    let back = weft_devmesh::workload::round_trip(s, b"ping through the mesh")
        .await
        .map_err(|e| e.to_string())?;
    (back == b"ping through the mesh")
        .then_some(())
        .ok_or_else(|| "echo corrupted".to_owned())
}

/// Write to a live echo connection and read the echo back (30 s bound).
pub async fn ping(s: &mut tokio::net::TcpStream) -> std::io::Result<()> {
    s.write_all(b"live").await?;
    let mut b = [0u8; 4];
    tokio::time::timeout(Duration::from_secs(30), s.read_exact(&mut b))
        .await
        .map_err(|_| std::io::Error::other("no echo within 30 s"))??;
    assert_eq!(&b, b"live");
    Ok(())
}

/// Plugin loads so far on `node` by plugin (`weft_plugin_loads_total`, every result summed): a new version or a new
/// configuration is one more; a resource change that leaves the serving version alone is none.
pub async fn plugin_loads(node: &NodeProcess) -> std::collections::BTreeMap<String, u64> {
    let text = node.scrape().await.unwrap_or_default();
    let mut out = std::collections::BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| l.starts_with("weft_plugin_loads_total{"))
    {
        let Some((labels, n)) = line.rsplit_once(' ') else {
            continue;
        };
        let Some(plugin) = labels
            .split("plugin=\"")
            .nth(1)
            .and_then(|r| r.split('"').next())
        else {
            continue;
        };
        *out.entry(plugin.to_owned()).or_default() += n.parse::<f64>().unwrap_or_default() as u64;
    }
    out
}
