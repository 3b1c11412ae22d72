//! Test support: build plugin crates for `wasm32-wasip2` and drive them in the real host.
//!
//! ```no_run
//! use weft_plugin_host::testing::{Harness, build_plugin, conn};
//! let wasm = build_plugin("plugins/port-allowlist").unwrap();
//! let h = Harness::policy(&wasm, r#"{"ports": [80]}"#).unwrap();
//! assert!(h.authorize(&conn(80, Some("spiffe://cluster.local/ns/a/sa/b"))).is_allow());
//! ```

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use weft_hooks::{ConnectionHooks, ConnectionRecord, Direction, Verdict, WorkloadMeta};
use weft_state::{
    FailurePolicy, PluginDirections, PluginKind, PluginSource, PluginSpec, Policy, WorkloadSelector,
};

use crate::{ApplyReport, HostConfig, Outcome, PluginHost};

pub use weft_plugin_build::{BuildError, plugins_dir, repo_root, wasm_target_dir};

fn cache() -> &'static Mutex<HashMap<PathBuf, PathBuf>> {
    static BUILT: OnceLock<Mutex<HashMap<PathBuf, PathBuf>>> = OnceLock::new();
    BUILT.get_or_init(Default::default)
}

/// Builds the plugin crate at `crate_dir` (relative paths: from the weft repository root) for `wasm32-wasip2`
/// ([`weft_plugin_build::build_crate`]) and returns the `.wasm` component. Built once per process per crate.
pub fn build_plugin(crate_dir: impl AsRef<Path>) -> Result<PathBuf, BuildError> {
    let dir = crate_dir.as_ref();
    let dir = if dir.is_relative() {
        repo_root().join(dir)
    } else {
        dir.to_path_buf()
    };
    let dir = dir.canonicalize()?;
    let mut built = match cache().lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    };
    if let Some(p) = built.get(&dir) {
        return Ok(p.clone());
    }
    let wasm = weft_plugin_build::build_crate(&dir)?
        .into_iter()
        .next()
        .ok_or_else(|| BuildError::NoArtifact(dir.display().to_string()))?;
    built.insert(dir, wasm.clone());
    Ok(wasm)
}

/// Builds every crate of the `plugins/` workspace for `wasm32-wasip2` (what CI runs) and returns the components.
pub fn build_plugins_workspace() -> Result<Vec<PathBuf>, BuildError> {
    weft_plugin_build::build_workspace()
}

/// A plugin's code read under the wasm build lock into an inline source. Another test (or test binary) may
/// rebuild the plugins meanwhile: a spec naming the file could be re-read in the middle of a rewrite and look like
/// new (or broken) code.
pub fn pinned_code(wasm: &Path) -> Result<PluginSource, std::io::Error> {
    let lock = weft_plugin_build::lock()?;
    let bytes = std::fs::read(wasm)?;
    drop(lock);
    Ok(PluginSource::Inline(Arc::new(bytes)))
}

/// A spec for tests: the given kind and code, default everything else (fail-closed, priority 0, inbound, all
/// workloads, recheck on).
pub fn spec(name: &str, kind: PluginKind, wasm: &Path, config: &str) -> PluginSpec {
    PluginSpec {
        name: name.to_string(),
        kind,
        source: PluginSource::Path(wasm.to_path_buf()),
        sha256: None,
        config: config.to_string(),
        failure_policy: FailurePolicy::FailClosed,
        priority: 0,
        selector: WorkloadSelector::default(),
        directions: PluginDirections::default(),
        recheck: true,
        rollout: None,
        shadow: None,
    }
}

/// A workload for tests (`name` in namespace `ns`, service account `sa`).
pub fn workload(name: &str, ns: &str, sa: &str) -> Arc<WorkloadMeta> {
    Arc::new(WorkloadMeta {
        uid: format!("Kubernetes//Pod/{ns}/{name}"),
        name: name.to_string(),
        namespace: ns.to_string(),
        service_account: sa.to_string(),
        trust_domain: "cluster.local".to_string(),
        node: "node-a".to_string(),
        workload_name: name.to_string(),
        canonical_name: name.to_string(),
        canonical_revision: "v1".to_string(),
        cluster_id: "Kubernetes".to_string(),
        labels: vec![("app".to_string(), name.to_string())],
        ..WorkloadMeta::default()
    })
}

/// An inbound HBONE connection to `10.0.0.2:<port>` from `10.0.0.1:40000` with `peer` as the verified identity,
/// with a source and a destination workload.
pub fn conn(port: u16, peer: Option<&str>) -> ConnectionRecord {
    static ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    ConnectionRecord {
        id: ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        direction: Direction::Inbound,
        src: SocketAddr::from(([10, 0, 0, 1], 40000)),
        dst: SocketAddr::from(([10, 0, 0, 2], port)),
        peer_identity: peer.map(Arc::from),
        src_workload: Some(workload("client", "shop", "frontend")),
        dst_workload: Some(workload("server", "shop", "backend")),
        dst_service: Some("shop/server.shop.svc.cluster.local".to_string()),
        hbone: true,
    }
}

/// One plugin loaded in a real [`PluginHost`] (test config: short deadlines are the production ones).
#[derive(Debug)]
pub struct Harness {
    host: PluginHost,
    spec: Arc<PluginSpec>,
}

impl Harness {
    /// Loads a policy plugin with `config`; `Err` carries the rejection reason.
    pub fn policy(wasm: &Path, config: &str) -> Result<Self, String> {
        Self::with_spec(
            spec("plugin", PluginKind::Policy, wasm, config),
            HostConfig::default(),
        )
    }

    /// Loads a telemetry plugin with `config`.
    pub fn telemetry(wasm: &Path, config: &str) -> Result<Self, String> {
        Self::with_spec(
            spec("plugin", PluginKind::Telemetry, wasm, config),
            HostConfig::default(),
        )
    }

    /// Loads any spec in a host with `config`.
    pub fn with_spec(spec: PluginSpec, config: HostConfig) -> Result<Self, String> {
        let host = PluginHost::new(config).map_err(|e| e.to_string())?;
        let spec = Arc::new(spec);
        let report = host.apply(std::slice::from_ref(&spec), &[]);
        match report.get(&spec.name) {
            Some(Outcome::Loaded { .. }) => Ok(Self { host, spec }),
            Some(Outcome::Rejected { reason, .. }) => Err(reason.clone()),
            other => Err(format!("unexpected outcome {other:?}")),
        }
    }

    /// Hands authorization policies to the plugin (re-configures it if it wants them).
    pub fn set_policies(&self, policies: &[Arc<Policy>]) -> ApplyReport {
        self.host.apply(std::slice::from_ref(&self.spec), policies)
    }

    /// Runs the policy chain on a connection.
    pub fn authorize(&self, conn: &ConnectionRecord) -> Verdict {
        self.host.authorize(conn)
    }

    /// Runs the plugin on a brand-new instance (what instance reuse saves).
    pub fn authorize_fresh(&self, conn: &ConnectionRecord) -> Verdict {
        self.host
            .authorize_fresh_instance(&self.spec.name, conn)
            .unwrap_or(Verdict::Allow)
    }

    /// Sends a connection's open and close events through telemetry and waits until they were delivered.
    pub fn open_close(&self, conn: &ConnectionRecord, close: &weft_hooks::CloseRecord) {
        let conn = Arc::new(conn.clone());
        self.host.on_open(&conn);
        self.host.on_close(&conn, close);
        self.host.flush_telemetry();
    }

    /// The host's metrics (host and plugin-defined) as Prometheus text.
    pub fn metrics_text(&self) -> String {
        self.host.metrics_text()
    }

    /// The host itself.
    pub fn host(&self) -> &PluginHost {
        &self.host
    }
}
