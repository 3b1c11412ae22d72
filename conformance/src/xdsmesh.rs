//! A two-node mesh fed over xDS: a real `weft control` process serves a mesh file (edited live by the test) to two
//! real `weft run` processes that have no config file, over TLS with the dev CA and per-node bearer tokens.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use weft_devmesh::{NodeOptions, NodeProcess, workload};

use crate::{Addrs, eventually};

/// The bearer token of node `name` (in weft control's token file).
pub fn node_token(name: &str) -> String {
    format!("token-of-{name}")
}

/// A port free right now on 127.0.0.1.
pub fn free_port() -> Result<SocketAddr, String> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| e.to_string())
}

/// A `weft control` process.
#[derive(Debug)]
pub struct Control {
    child: Option<Child>,
    /// Its Delta ADS address.
    pub addr: SocketAddr,
    /// Its log (JSON lines).
    pub log_path: PathBuf,
    args: Vec<String>,
    weft: PathBuf,
}

impl Control {
    /// Start `weft control` on `addr` serving `mesh`, its certificate from `ca_dir`, callers from `tokens`.
    pub fn spawn(
        weft: &Path,
        addr: SocketAddr,
        ca_dir: &Path,
        tokens: &Path,
        mesh: &Path,
        log_path: &Path,
    ) -> Result<Self, String> {
        let args: Vec<String> = [
            "control",
            "--listen",
            &addr.to_string(),
            "--ca-dir",
            &ca_dir.display().to_string(),
            "--tokens",
            &tokens.display().to_string(),
            "--mesh",
            &mesh.display().to_string(),
            "--status",
            "off",
            "--metrics",
            "off",
            "--poll",
            "20ms",
            "--log-json",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        let mut c = Self {
            child: None,
            addr,
            log_path: log_path.to_path_buf(),
            args,
            weft: weft.to_path_buf(),
        };
        c.start()?;
        Ok(c)
    }

    fn start(&mut self) -> Result<(), String> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log_path)
            .map_err(|e| e.to_string())?;
        let child = Command::new(&self.weft)
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("starting weft control: {e}"))?;
        self.child = Some(child);
        Ok(())
    }

    /// Kill it (SIGKILL: no goodbye to the streams, as when its pod dies) and wait for it to be gone.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Start it again with the same flags, on the same port.
    pub fn restart(&mut self) -> Result<(), String> {
        self.kill();
        self.start()
    }

    /// Its JSON log lines so far.
    pub fn log_lines(&self) -> Vec<serde_json::Value> {
        std::fs::read_to_string(&self.log_path)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }
}

impl Drop for Control {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `weft run` flags of a node fed by the xDS server at `addr` (trusting `root`, sending `token`).
pub fn xds_flags(addr: SocketAddr, root: &Path, token: &Path, node: &str) -> Vec<String> {
    vec![
        "--xds-address".into(),
        format!("https://localhost:{}", addr.port()),
        "--xds-root-cert".into(),
        root.display().to_string(),
        "--xds-token-file".into(),
        token.display().to_string(),
        "--pod-name".into(),
        format!("weft-{node}"),
        "--pod-namespace".into(),
        "weft-system".into(),
    ]
}

/// The two-node mesh fed by `weft control`.
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
    /// The mesh file weft control serves.
    pub mesh_file: PathBuf,
    /// Scratch directory.
    pub dir: tempfile::TempDir,
    echo: Vec<tokio::task::JoinHandle<()>>,
}

impl XdsMesh {
    /// Start weft control with `yaml` and two nodes fed by it; echo servers listen on `echo_ips` port 8080. Ready
    /// when both nodes are (their readiness waits for the first complete sync).
    pub async fn start(addrs: Addrs, yaml: &str, echo_ips: &[IpAddr]) -> Result<Self, String> {
        let weft = weft_devmesh::weft_binary()?;
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let ca = dir.path().join("ca");
        weft_devmesh::write_dev_ca(&ca, "cluster.local").map_err(|e| e.to_string())?;
        let mesh_file = dir.path().join("mesh.yaml");
        std::fs::write(&mesh_file, yaml).map_err(|e| e.to_string())?;
        let mut tokens = String::from("tokens:\n");
        for n in ["node-a", "node-b"] {
            tokens.push_str(&format!(
                "- {{token: {}, node: {n}, identity: spiffe://cluster.local/ns/weft-system/sa/weft}}\n",
                node_token(n)
            ));
            std::fs::write(dir.path().join(format!("{n}.token")), node_token(n))
                .map_err(|e| e.to_string())?;
        }
        let tokens_file = dir.path().join("tokens.yaml");
        std::fs::write(&tokens_file, tokens).map_err(|e| e.to_string())?;
        let mut echo = Vec::new();
        for ip in echo_ips {
            let (_, t) = workload::echo_server(SocketAddr::new(*ip, 8080))
                .await
                .map_err(|e| format!("echo server on {ip}: {e}"))?;
            echo.push(t);
        }
        let control = Control::spawn(
            &weft,
            free_port()?,
            &ca,
            &tokens_file,
            &mesh_file,
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
