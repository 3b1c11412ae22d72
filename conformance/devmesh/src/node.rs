//! A weft node as a real child process: its command line, its endpoints, its log, readiness and shutdown.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How to start a node.
#[derive(Debug, Clone)]
pub struct NodeOptions {
    /// Node name (workloads with this `node` are its own).
    pub name: String,
    /// Loopback address (e.g. 127.0.1.254) its admin, metrics, readiness, SOCKS5 and DNS servers bind to, on the
    /// standard ports; a distinct one per node lets several nodes share the machine.
    pub control_ip: IpAddr,
    /// Mesh config file; an empty path: none (the mesh comes over xDS, see `extra`).
    pub config: PathBuf,
    /// Local CA directory.
    pub ca_dir: PathBuf,
    /// Where its stderr (JSON logs) goes.
    pub log_path: PathBuf,
    /// Run inside this network namespace (`ip netns exec`).
    pub netns: Option<String>,
    /// Extra `weft run` flags (listener addresses, mark, ...).
    pub extra: Vec<String>,
    /// Log filter.
    pub log: String,
    /// `--log-linger` (none: weft's default). Tests that read the log right after an event give `0s`, so every
    /// line is on disk as soon as it is logged; an older weft build (the bench's baseline) may not know the flag.
    pub log_linger: Option<String>,
    /// Environment variables added to the process's (e.g. `ISTIO_META_*`, which have no flag).
    pub env: Vec<(String, String)>,
}

impl NodeOptions {
    /// A node on 127.0.0.x with per-workload HBONE listeners, SOCKS5 on `control_ip`, no capture listeners.
    pub fn loopback(
        name: &str,
        control_ip: IpAddr,
        config: &Path,
        ca_dir: &Path,
        log_dir: &Path,
    ) -> Self {
        Self {
            name: name.to_owned(),
            control_ip,
            config: config.to_path_buf(),
            ca_dir: ca_dir.to_path_buf(),
            log_path: log_dir.join(format!("{name}.log")),
            netns: None,
            extra: vec![
                "--hbone".into(),
                "workloads".into(),
                "--outbound".into(),
                "off".into(),
                "--inbound-plaintext".into(),
                "off".into(),
                "--bind-source-ip".into(),
            ],
            log: "info".into(),
            log_linger: Some("0s".into()),
            env: Vec::new(),
        }
    }
}

/// A running node; killed on drop if still running.
#[derive(Debug)]
pub struct NodeProcess {
    /// Node name.
    pub name: String,
    child: Option<Child>,
    /// Admin server.
    pub admin: SocketAddr,
    /// Metrics server.
    pub metrics: SocketAddr,
    /// Readiness server.
    pub readiness: SocketAddr,
    /// SOCKS5 listener.
    pub socks5: SocketAddr,
    /// DNS proxy (UDP and TCP), unless `extra` turned it off or moved it.
    pub dns: SocketAddr,
    /// Log file.
    pub log_path: PathBuf,
    netns: Option<String>,
}

impl NodeProcess {
    /// One HTTP request to one of the node's servers, from inside its network namespace when it has one.
    pub async fn http(
        &self,
        addr: SocketAddr,
        method: &str,
        path: &str,
    ) -> std::io::Result<(u16, String)> {
        match &self.netns {
            None => crate::http::request(addr, method, path).await,
            Some(ns) => {
                let ns = crate::netns::Netns::existing(ns);
                let (method, path) = (method.to_owned(), path.to_owned());
                ns.within(move || async move { crate::http::request(addr, &method, &path).await })
                    .await
                    .map_err(std::io::Error::other)?
            }
        }
    }

    /// Start `weft run` with `opts`.
    pub fn spawn(weft: &Path, opts: &NodeOptions) -> std::io::Result<Self> {
        let at = |port| SocketAddr::new(opts.control_ip, port);
        let (admin, metrics, readiness, socks5, dns) =
            (at(15000), at(15020), at(15021), at(15080), at(15053));
        let mut args: Vec<String> = vec![
            "run".into(),
            "--node".into(),
            opts.name.clone(),
            "--ca-dir".into(),
            opts.ca_dir.display().to_string(),
            "--admin".into(),
            admin.to_string(),
            "--metrics".into(),
            metrics.to_string(),
            "--readiness".into(),
            readiness.to_string(),
            "--socks5".into(),
            socks5.to_string(),
            "--dns".into(),
            dns.to_string(),
            "--log-format".into(),
            "json".into(),
            "--log".into(),
            opts.log.clone(),
            "--config-poll".into(),
            "50ms".into(),
        ];
        if let Some(linger) = &opts.log_linger {
            args.extend(["--log-linger".into(), linger.clone()]);
        }
        if !opts.config.as_os_str().is_empty() {
            args.extend(["--config".into(), opts.config.display().to_string()]);
        }
        args.extend(opts.extra.iter().cloned());
        let log = std::fs::File::create(&opts.log_path)?;
        let mut cmd = match &opts.netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(weft);
                c
            }
            None => Command::new(weft),
        };
        cmd.args(&args)
            .envs(opts.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        let child = cmd.spawn()?;
        Ok(Self {
            name: opts.name.clone(),
            child: Some(child),
            admin,
            metrics,
            readiness,
            socks5,
            dns,
            log_path: opts.log_path.clone(),
            netns: opts.netns.clone(),
        })
    }

    /// Wait until `/healthz/ready` answers 200; fails early, with the log's tail, if the process exits.
    pub async fn wait_ready(&mut self, timeout: Duration) -> Result<(), String> {
        let start = Instant::now();
        let mut last = String::new();
        while start.elapsed() < timeout {
            if let Some(c) = self.child.as_mut()
                && let Ok(Some(status)) = c.try_wait()
            {
                return Err(format!(
                    "node {} exited ({status}) before ready:\n{}",
                    self.name,
                    self.log_tail(30)
                ));
            }
            match self.http(self.readiness, "GET", "/healthz/ready").await {
                Ok((200, _)) => return Ok(()),
                Ok((code, body)) => last = format!("{code} {}", body.trim()),
                Err(e) => last = e.to_string(),
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Err(format!(
            "node {} not ready after {timeout:?}: {last}\n{}",
            self.name,
            self.log_tail(30)
        ))
    }

    /// GET from the admin server; returns (status, body).
    pub async fn admin_get(&self, path: &str) -> std::io::Result<(u16, String)> {
        self.http(self.admin, "GET", path).await
    }

    /// The `/config_dump` JSON.
    pub async fn config_dump(&self) -> Result<serde_json::Value, String> {
        let (code, body) = self
            .admin_get("/config_dump")
            .await
            .map_err(|e| e.to_string())?;
        if code != 200 {
            return Err(format!("config_dump: {code} {body}"));
        }
        serde_json::from_str(&body).map_err(|e| e.to_string())
    }

    /// The Prometheus text from `/stats/prometheus`.
    pub async fn scrape(&self) -> Result<String, String> {
        match self.http(self.metrics, "GET", "/stats/prometheus").await {
            Ok((200, body)) => Ok(body),
            Ok((code, body)) => Err(format!("{code} {body}")),
            Err(e) => Err(e.to_string()),
        }
    }

    /// Every JSON log line so far.
    pub fn log_lines(&self) -> Vec<serde_json::Value> {
        std::fs::read_to_string(&self.log_path)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// Access-log lines (target `access`) so far.
    pub fn access_logs(&self) -> Vec<serde_json::Value> {
        self.log_lines()
            .into_iter()
            .filter(|l| l.get("target").and_then(|t| t.as_str()) == Some("access"))
            .collect()
    }

    /// Last `n` lines of the log, as text.
    pub fn log_tail(&self, n: usize) -> String {
        let text = std::fs::read_to_string(&self.log_path).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// Process id.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Send SIGTERM and wait for exit (up to `timeout`, then SIGKILL). Returns whether it exited by itself.
    pub async fn terminate(&mut self, timeout: Duration) -> bool {
        let Some(mut child) = self.child.take() else {
            return true;
        };
        let _ = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
        let start = Instant::now();
        while start.elapsed() < timeout {
            if let Ok(Some(_)) = child.try_wait() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let _ = child.kill();
        let _ = child.wait();
        false
    }
}

impl Drop for NodeProcess {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
