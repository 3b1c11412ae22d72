//! weft's end-to-end suite: helpers that build a two-node mesh of real weft processes on 127.0.N.x (one subnet per
//! test, so tests run in parallel), with echo workloads; the tests live in `tests/`.

pub mod cni;
pub mod dig;
pub mod gatewaymesh;
pub mod inpodpair;
pub mod load;
pub mod netmesh;
pub mod podmesh;
pub mod relay;
pub mod waypoint;
pub mod xdsmesh;
pub mod ztunnel;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use weft_devmesh::{NodeOptions, NodeProcess, workload};

/// Addresses of a two-node mesh on subnet `127.0.N.0/24`... and N+1: node A owns 127.0.N.x, node B 127.0.(N+1).x.
#[derive(Debug, Clone, Copy)]
pub struct Addrs {
    /// Subnet byte of node A (node B uses `n + 1`).
    pub n: u8,
}

impl Addrs {
    /// Client workload on node A.
    pub fn client(&self) -> Ipv4Addr {
        Ipv4Addr::new(127, 0, self.n, 1)
    }
    /// Echo workload (HBONE) on node B.
    pub fn echo(&self) -> Ipv4Addr {
        Ipv4Addr::new(127, 0, self.n + 1, 1)
    }
    /// Plain TCP workload on node B.
    pub fn legacy(&self) -> Ipv4Addr {
        Ipv4Addr::new(127, 0, self.n + 1, 2)
    }
    /// Service VIP of the echo service.
    pub fn vip(&self) -> Ipv4Addr {
        Ipv4Addr::new(127, 10, self.n, 1)
    }
    /// Node A's control address.
    pub fn node_a(&self) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(127, 0, self.n, 254))
    }
    /// Node B's control address.
    pub fn node_b(&self) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(127, 0, self.n + 1, 254))
    }
}

/// The standard two-node mesh config; `echo_sa` is the service account the file gives the echo workload.
pub fn mesh_yaml(a: Addrs, echo_sa: &str) -> String {
    format!(
        r#"workloads:
- uid: Kubernetes//Pod/default/client
  name: client
  namespace: default
  serviceAccount: client
  workloadName: client
  canonicalName: client
  canonicalRevision: v1
  workloadIps: [{client}]
  protocol: HBONE
  node: node-a
  services: {{}}
- uid: Kubernetes//Pod/default/echo
  name: echo
  namespace: default
  serviceAccount: {echo_sa}
  workloadName: echo
  canonicalName: echo
  canonicalRevision: v1
  workloadIps: [{echo}]
  protocol: HBONE
  node: node-b
  services:
    default/echo.default.svc.cluster.local:
      80: 8080
- uid: Kubernetes//Pod/legacy/db
  name: db
  namespace: legacy
  workloadIps: [{legacy}]
  protocol: TCP
  node: node-b
  services: {{}}
services:
- name: echo
  namespace: default
  hostname: echo.default.svc.cluster.local
  vips: ["/{vip}"]
  ports:
    80: 8080
"#,
        client = a.client(),
        echo = a.echo(),
        legacy = a.legacy(),
        vip = a.vip(),
    )
}

/// A running two-node mesh with echo workloads; everything stops on drop.
#[derive(Debug)]
pub struct Mesh {
    /// Addresses.
    pub addrs: Addrs,
    /// Node A (client side).
    pub a: NodeProcess,
    /// Node B (server side).
    pub b: NodeProcess,
    /// Scratch directory (config files, CA, logs).
    pub dir: tempfile::TempDir,
    /// Node A's config file.
    pub config_a: PathBuf,
    /// Node B's config file.
    pub config_b: PathBuf,
    _echo: Vec<tokio::task::JoinHandle<()>>,
}

impl Mesh {
    /// Start the standard mesh; `yaml_a` / `yaml_b` are the two nodes' config files (usually the same text).
    pub async fn start(addrs: Addrs, yaml_a: &str, yaml_b: &str) -> Result<Self, String> {
        Self::start_with(addrs, yaml_a, yaml_b, |_| {}).await
    }

    /// Like [`Mesh::start`], with a hook to adjust each node's options.
    pub async fn start_with(
        addrs: Addrs,
        yaml_a: &str,
        yaml_b: &str,
        adjust: impl Fn(&mut NodeOptions),
    ) -> Result<Self, String> {
        let weft = weft_devmesh::weft_binary()?;
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let ca = dir.path().join("ca");
        weft_devmesh::write_dev_ca(&ca, "cluster.local").map_err(|e| e.to_string())?;
        let config_a = dir.path().join("a.yaml");
        let config_b = dir.path().join("b.yaml");
        std::fs::write(&config_a, yaml_a).map_err(|e| e.to_string())?;
        std::fs::write(&config_b, yaml_b).map_err(|e| e.to_string())?;
        let mut echo = Vec::new();
        for ip in [addrs.echo(), addrs.legacy()] {
            let (_, t) = workload::echo_server(SocketAddr::from((ip, 8080)))
                .await
                .map_err(|e| format!("echo server on {ip}: {e}"))?;
            echo.push(t);
        }
        let mut oa = NodeOptions::loopback("node-a", addrs.node_a(), &config_a, &ca, dir.path());
        let mut ob = NodeOptions::loopback("node-b", addrs.node_b(), &config_b, &ca, dir.path());
        adjust(&mut oa);
        adjust(&mut ob);
        let weft_path: &Path = &weft;
        let mut a = NodeProcess::spawn(weft_path, &oa).map_err(|e| e.to_string())?;
        let mut b = NodeProcess::spawn(weft_path, &ob).map_err(|e| e.to_string())?;
        a.wait_ready(Duration::from_secs(30)).await?;
        b.wait_ready(Duration::from_secs(30)).await?;
        Ok(Self {
            addrs,
            a,
            b,
            dir,
            config_a,
            config_b,
            _echo: echo,
        })
    }

    /// The CA directory.
    pub fn ca_dir(&self) -> PathBuf {
        self.dir.path().join("ca")
    }
}

impl Drop for Mesh {
    fn drop(&mut self) {
        for t in &self._echo {
            t.abort();
        }
    }
}

/// The least time [`eventually`] waits for an event before failing the test.
pub const EVENT_TIMEOUT_FLOOR: Duration = Duration::from_secs(30);

/// Poll `f` until it returns `Some`, or fail after `timeout` (at least [`EVENT_TIMEOUT_FLOOR`]).
pub async fn eventually<T, F, Fut>(timeout: Duration, what: &str, f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    // The wait ends at the event, so a generous bound costs nothing when things work and keeps a loaded machine
    // (a CI run, a parallel build) from turning a slow event into a failure.
    // Every 25 ms: a poll here is usually a request to a node's admin server.
    let every = Duration::from_millis(25);
    match weft_testkit::poll_within(timeout.max(EVENT_TIMEOUT_FLOOR), every, what, f).await {
        Ok(v) => v,
        Err(e) => panic!("{e}"),
    }
}

/// The reference CA binary, `weft-ca`, built next to `weft` (`cargo build -p weft -p weft-control`).
pub fn weft_ca_binary() -> std::path::PathBuf {
    let ca = weft_devmesh::weft_binary()
        .expect("the weft binary")
        .with_file_name("weft-ca");
    assert!(
        ca.is_file(),
        "{} not found: run `cargo build -p weft -p weft-control` first",
        ca.display()
    );
    ca
}

/// A metric's value from Prometheus text (sum over every series whose line starts with `prefix`).
pub fn metric_sum(text: &str, prefix: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()))
        .sum()
}

/// Replace the file at `path` with `contents` the way a ConfigMap update or a careful editor does: write a sibling
/// temporary file, then rename it over the old one, so a watcher never reads a half-written file. (The watcher's
/// own handling of in-place writes is tested in `runtime/node/state`.)
pub fn replace_file(path: &Path, contents: impl AsRef<[u8]>) -> std::io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    std::fs::write(&tmp, contents)?;
    std::fs::rename(&tmp, path)
}

/// Replace `node`'s mesh file at `path` with `text` ([`replace_file`]) and wait until the node has applied it (its
/// `/config_dump` version moved on).
pub async fn edit_mesh_file(node: &NodeProcess, path: &Path, text: &str) {
    let version = || async { node.config_dump().await.ok()?["version"].as_u64() };
    let v0 = version().await.expect("the node's config version");
    replace_file(path, text).expect("replacing the mesh file");
    eventually(
        Duration::from_secs(30),
        "the node applies the edit",
        || async { version().await.filter(|v| *v > v0) },
    )
    .await;
}
