//! A `weft-control` process (the mesh's and the plugins' Delta ADS server) and the `weft run` flags of nodes fed
//! by it: shared by `weft-demo` and the xDS end-to-end tests.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// The bearer token of node `name` (in weft-control's token file).
pub fn node_token(name: &str) -> String {
    format!("token-of-{name}")
}

/// Write weft-control's static token file for `nodes` (`dir/tokens.yaml`, every node the weft service account)
/// and each node's own token (`dir/<node>.token`); returns the token file.
pub fn write_tokens(dir: &Path, nodes: &[&str]) -> std::io::Result<PathBuf> {
    let mut tokens = String::from("tokens:\n");
    for n in nodes {
        tokens.push_str(&format!(
            "- {{token: {}, node: {n}, identity: spiffe://cluster.local/ns/weft-system/sa/weft}}\n",
            node_token(n)
        ));
        std::fs::write(dir.join(format!("{n}.token")), node_token(n))?;
    }
    let file = dir.join("tokens.yaml");
    std::fs::write(&file, tokens)?;
    Ok(file)
}

/// A port free right now on 127.0.0.1.
pub fn free_port() -> Result<SocketAddr, String> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| e.to_string())
}

/// A `weft-control` process.
#[derive(Debug)]
pub struct Control {
    child: Option<Child>,
    /// Its Delta ADS address.
    pub addr: SocketAddr,
    /// Its log (JSON lines).
    pub log_path: PathBuf,
    args: Vec<String>,
    binary: PathBuf,
}

impl Control {
    /// Start `weft-control` on `addr` serving `mesh` (and the WeftPlugin files of `plugins_dir`), its certificate
    /// from `ca_dir`, callers from `tokens`, its status endpoint on `status` (none: off).
    #[allow(clippy::too_many_arguments)]
    pub fn spawn(
        control: &Path,
        addr: SocketAddr,
        ca_dir: &Path,
        tokens: &Path,
        mesh: &Path,
        plugins_dir: Option<&Path>,
        status: Option<SocketAddr>,
        log_path: &Path,
    ) -> Result<Self, String> {
        let args = Self::args(addr, ca_dir, tokens, mesh, plugins_dir, status);
        Self::with_args(control, addr, args, log_path)
    }

    /// The flags [`Control::spawn`] starts it with (metrics off, JSON logs, 20 ms polls), for a caller that adds
    /// its own and starts it with [`Control::with_args`].
    pub fn args(
        addr: SocketAddr,
        ca_dir: &Path,
        tokens: &Path,
        mesh: &Path,
        plugins_dir: Option<&Path>,
        status: Option<SocketAddr>,
    ) -> Vec<String> {
        let mut args: Vec<String> = [
            "--listen",
            &addr.to_string(),
            "--ca-dir",
            &ca_dir.display().to_string(),
            "--tokens",
            &tokens.display().to_string(),
            "--mesh",
            &mesh.display().to_string(),
            "--status",
            &status.map_or("off".to_owned(), |a| a.to_string()),
            "--metrics",
            "off",
            "--poll",
            "20ms",
            "--log-json",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        if let Some(d) = plugins_dir {
            args.extend(["--plugins-dir".to_owned(), d.display().to_string()]);
        }
        args
    }

    /// Start `weft-control` with exactly `args` (which must listen on `addr`), logging to `log_path`.
    pub fn with_args(
        control: &Path,
        addr: SocketAddr,
        args: Vec<String>,
        log_path: &Path,
    ) -> Result<Self, String> {
        let mut c = Self {
            child: None,
            addr,
            log_path: log_path.to_path_buf(),
            args,
            binary: control.to_path_buf(),
        };
        c.start()?;
        Ok(c)
    }

    /// Its process id, while it runs (for a bench reading `/proc/<pid>`).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the process is still running.
    pub fn running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    fn start(&mut self) -> Result<(), String> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log_path)
            .map_err(|e| e.to_string())?;
        let child = Command::new(&self.binary)
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("starting {}: {e}", self.binary.display()))?;
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

/// `weft run` flags of a node taking its plugins from the xDS server at `addr` as well.
pub fn plugin_xds_flags(addr: SocketAddr, root: &Path, token: &Path) -> Vec<String> {
    vec![
        "--plugin-xds-address".into(),
        format!("https://localhost:{}", addr.port()),
        "--plugin-xds-root-cert".into(),
        root.display().to_string(),
        "--plugin-xds-token-file".into(),
        token.display().to_string(),
    ]
}
