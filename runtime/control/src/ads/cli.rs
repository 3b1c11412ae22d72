//! `weft control` (and the `weft-control` binary): flags, logging, runtime, signals.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::auth::Authenticator;
use anyhow::Context as _;
use clap::Parser;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{EnvFilter, reload};
use weft_identity::LocalCa;

use crate::ads::server::ControlConfig;
use crate::ads::status::LogLevel;

/// An address, or `off` (`None`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Listen(pub Option<SocketAddr>);

fn parse_listen(s: &str) -> Result<Listen, String> {
    if s == "off" {
        return Ok(Listen(None));
    }
    s.parse()
        .map(|a| Listen(Some(a)))
        .map_err(|e| format!("{s:?}: {e} (expected ip:port or off)"))
}

/// Serve the mesh and plugins to weft nodes (and ztunnel) over Delta ADS.
#[derive(Debug, Parser)]
#[command(
    version,
    about = "weft-control: a Delta ADS server for weft nodes (and ztunnel): workloads, services and policies from a \
             watched mesh file, plugins from a watched directory of WeftPlugin files; deltas, per-node ACK/NACK \
             records, a status endpoint, TLS and bearer-token authentication.",
    long_about = None
)]
pub struct ControlArgs {
    /// Delta ADS listen address (gRPC over TLS).
    #[arg(long, env = "WEFT_CONTROL_LISTEN", default_value = "0.0.0.0:15012")]
    pub listen: SocketAddr,
    /// Mesh file in ztunnel's local-config format (workloads, services, policies), watched for edits: served as
    /// istio.workload.Address and istio.security.Authorization. A bad edit is refused (file, field and line in
    /// the log and the status) and the last good mesh keeps being served.
    #[arg(long, env = "WEFT_CONTROL_MESH")]
    pub mesh: Option<PathBuf>,
    /// Directory of WeftPlugin YAML files (modelled on Istio's WasmPlugin), watched for edits: served as
    /// TypedExtensionConfig resources. `file://` code is read relative to it and inlined.
    #[arg(long, env = "WEFT_CONTROL_PLUGINS")]
    pub plugins_dir: Option<PathBuf>,
    /// File the staged rollouts of `--plugins-dir` are kept in (JSON, mode 0600; created if missing), so a restart
    /// resumes each rollout at its stage; without it they are kept in memory only.
    #[arg(long, env = "WEFT_CONTROL_ROLLOUT_STATE", requires = "plugins_dir")]
    pub rollout_state: Option<PathBuf>,
    /// How often the mesh file and the plugin directory are checked.
    #[arg(long, default_value = "250ms", value_parser = humantime::parse_duration)]
    pub poll: Duration,
    /// Local CA directory (root-cert.pem + root-key.pem, or ca-cert.pem + ca-key.pem + root-cert.pem) that issues
    /// the serving certificate, for development meshes and tests (`weft ca init`).
    #[arg(long, conflicts_with_all = ["tls_cert", "tls_key"], required_unless_present = "tls_cert")]
    pub ca_dir: Option<PathBuf>,
    /// Names (DNS or IP) in the serving certificate issued by --ca-dir; repeat for several.
    #[arg(long = "tls-san", default_values_t = ["localhost".to_owned(), "127.0.0.1".to_owned()])]
    pub tls_sans: Vec<String>,
    /// Serving certificate chain (PEM, leaf first), e.g. issued by the mesh CA.
    #[arg(long, requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// Its private key (PEM).
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Static token file (`tokens: [{token, node, identity}]`, re-read on every stream) instead of Kubernetes
    /// TokenReview (with --kube-api as well, the API server is then used only by --plugins-from-kube).
    #[arg(long, required_unless_present = "kube_api")]
    pub tokens: Option<PathBuf>,
    /// Kubernetes API server: TokenReview of the nodes' tokens (unless --tokens), and the WeftPlugin resources
    /// with --plugins-from-kube.
    #[arg(long)]
    pub kube_api: Option<String>,
    /// CA bundle of the API server.
    #[arg(long)]
    pub kube_ca_file: Option<PathBuf>,
    /// weft control's own token for the API server (allowed to create TokenReviews, and what the controller's RBAC
    /// grants with --plugins-from-kube); re-read as it rotates.
    #[arg(long)]
    pub kube_token_file: Option<PathBuf>,
    /// Serve the WeftPlugin resources (weftplugins.weft.dev) of --kube-api instead of a directory of files: a
    /// replicated controller that resolves selectors against Pods, reads pull secrets, and writes each resource's
    /// status from the leader replica (a Lease in --namespace).
    #[arg(
        long,
        env = "WEFT_CONTROL_PLUGINS_FROM_KUBE",
        conflicts_with = "plugins_dir",
        requires_all = ["kube_api", "namespace", "replica"]
    )]
    pub plugins_from_kube: bool,
    /// Istio's root namespace: a WeftPlugin here applies mesh-wide (with a selector: to matching pods of every
    /// namespace), as Istio's WasmPlugin.
    #[arg(
        long,
        env = "WEFT_CONTROL_ROOT_NAMESPACE",
        default_value = "istio-system"
    )]
    pub root_namespace: String,
    /// Istio's cluster id: workload uids are `<cluster id>//Pod/<namespace>/<name>`, as istiod names them.
    #[arg(long, env = "CLUSTER_ID", default_value = "Kubernetes")]
    pub cluster_id: String,
    /// weft-control's own namespace: the leader Lease (weft-control-leader) and the replicas' report ConfigMaps
    /// (`weft-control-report-<replica>`) live here.
    #[arg(long, env = "POD_NAMESPACE")]
    pub namespace: Option<String>,
    /// This replica's name (its pod's): the Lease holder identity and its report's name.
    #[arg(long, env = "POD_NAME")]
    pub replica: Option<String>,
    /// How long the leader's Lease holds without a renewal before another replica takes it.
    #[arg(long, default_value = "15s", value_parser = humantime::parse_duration)]
    pub leader_lease_duration: Duration,
    /// How often the Lease is tried or renewed, this replica's report written and (by the leader) status written.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    pub leader_retry_period: Duration,
    /// Audience the nodes' tokens must carry (TokenReview). weft control's own, not istiod's `istio-ca`: a token
    /// a node sends here cannot be replayed to istiod, and one meant for istiod is refused here.
    #[arg(long, env = "WEFT_CONTROL_AUDIENCE", default_value = "weft-control")]
    pub audience: String,
    /// The service accounts node agents run as (`namespace/name`, comma-separated; the chart's DaemonSet account):
    /// any other caller, however authenticated, is refused and audit-logged. Required with --kube-api.
    #[arg(long, env = "WEFT_CONTROL_NODE_ACCOUNTS", value_delimiter = ',')]
    pub node_accounts: Vec<crate::ads::service::NodeAccount>,
    /// Trust domain of the identities derived from service accounts.
    #[arg(long, default_value = "cluster.local")]
    pub trust_domain: String,
    /// Status endpoint (`GET /status`: nodes, the plugin versions they run, NACKs, rollbacks; `/logging`),
    /// loopback only, or `off`.
    #[arg(long, default_value = "127.0.0.1:15014", value_parser = parse_listen)]
    pub status: Listen,
    /// Metrics endpoint (`/metrics`), or `off`.
    #[arg(long, default_value = "127.0.0.1:15015", value_parser = parse_listen)]
    pub metrics: Listen,
    /// Log filter.
    #[arg(long, env = "WEFT_CONTROL_LOG", default_value = "info")]
    pub log: String,
    /// Log as JSON lines.
    #[arg(long)]
    pub log_json: bool,
    /// Runtime worker threads.
    #[arg(long, default_value_t = 2)]
    pub workers: usize,
}

struct Filter(reload::Handle<EnvFilter, tracing_subscriber::Registry>);

impl std::fmt::Debug for Filter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Filter")
    }
}

impl LogLevel for Filter {
    fn current(&self) -> String {
        self.0
            .with_current(|f| f.to_string())
            .unwrap_or_else(|e| format!("unknown ({e})"))
    }

    fn set(&self, filter: &str) -> Result<String, String> {
        let f = EnvFilter::try_new(filter).map_err(|e| format!("bad filter {filter:?}: {e}"))?;
        self.0.reload(f).map_err(|e| e.to_string())?;
        Ok(self.current())
    }
}

fn init_logging(filter: &str, json: bool) -> anyhow::Result<Arc<dyn LogLevel>> {
    let filter = EnvFilter::try_new(filter).with_context(|| format!("--log {filter:?}"))?;
    let (layer, handle) = reload::Layer::new(filter);
    let reg = tracing_subscriber::registry().with(layer);
    if json {
        reg.with(
            tracing_subscriber::fmt::layer()
                .json()
                .flatten_event(true)
                .with_current_span(false)
                .with_writer(std::io::stderr),
        )
        .try_init()?;
    } else {
        reg.with(tracing_subscriber::fmt::layer().with_writer(std::io::stderr))
            .try_init()?;
    }
    Ok(Arc::new(Filter(handle)))
}

/// Build the serving TLS config and the authenticator the flags ask for.
pub fn tls_and_auth(
    args: &ControlArgs,
) -> anyhow::Result<(Arc<rustls::ServerConfig>, Authenticator)> {
    if args.tokens.is_none() && args.kube_api.is_some() && args.node_accounts.is_empty() {
        anyhow::bail!(
            "--kube-api needs --node-accounts (the node agents' service accounts, namespace/name): without it every \
             service account with a token for audience {} could stream the mesh",
            args.audience
        );
    }
    let tls = match (&args.ca_dir, &args.tls_cert, &args.tls_key) {
        (Some(dir), _, _) => {
            let ca = LocalCa::from_dir(dir).context("--ca-dir")?;
            crate::auth::server_tls_from_ca(
                &ca,
                &args.tls_sans,
                Duration::from_secs(365 * 24 * 3600),
            )?
        }
        (None, Some(cert), Some(key)) => {
            let chain = std::fs::read_to_string(cert)
                .with_context(|| format!("--tls-cert {}", cert.display()))?;
            let key = weft_identity::ca::read_private_key(key).context("--tls-key")?;
            crate::auth::server_tls_from_pem(&chain, &key)?
        }
        _ => anyhow::bail!("give --ca-dir, or --tls-cert and --tls-key"),
    };
    let auth = Authenticator::from_flags(
        args.tokens.as_deref(),
        args.kube_api.as_deref(),
        args.kube_ca_file.as_deref(),
        args.kube_token_file.clone(),
        &args.audience,
        &args.trust_domain,
    )?;

    Ok((tls, auth))
}

/// The controller's options, with --plugins-from-kube.
pub fn kube_options(args: &ControlArgs) -> anyhow::Result<Option<crate::kube::KubeOptions>> {
    if !args.plugins_from_kube {
        return Ok(None);
    }
    let need = |v: &Option<String>, flag: &str| {
        v.clone()
            .filter(|s| !s.is_empty())
            .with_context(|| format!("--plugins-from-kube needs {flag}"))
    };
    if args.leader_retry_period.is_zero()
        || args.leader_lease_duration < args.leader_retry_period * 2
    {
        anyhow::bail!(
            "--leader-lease-duration ({:?}) must be at least twice --leader-retry-period ({:?}), which must not be zero",
            args.leader_lease_duration,
            args.leader_retry_period
        );
    }
    Ok(Some(crate::kube::KubeOptions {
        api: need(&args.kube_api, "--kube-api")?,
        ca_file: args.kube_ca_file.clone(),
        token_file: args.kube_token_file.clone(),
        root_namespace: args.root_namespace.clone(),
        cluster_id: args.cluster_id.clone(),
        namespace: need(&args.namespace, "--namespace (POD_NAMESPACE)")?,
        replica: need(&args.replica, "--replica (POD_NAME)")?,
        lease_duration: args.leader_lease_duration,
        retry_period: args.leader_retry_period,
    }))
}

/// Run `weft control` with logging set up here (the `weft-control` binary).
pub fn main(args: ControlArgs) -> anyhow::Result<()> {
    let log = init_logging(&args.log, args.log_json)?;
    run(args, Some(log))
}

/// Run `weft control` until SIGTERM, SIGINT or `POST /quitquitquit`. Logging must already be set up.
pub fn run(args: ControlArgs, log: Option<Arc<dyn LogLevel>>) -> anyhow::Result<()> {
    if args.mesh.is_none() && args.plugins_dir.is_none() && !args.plugins_from_kube {
        tracing::warn!(
            "neither --mesh nor --plugins-dir nor --plugins-from-kube: serving empty resource sets"
        );
    }
    let kube = kube_options(&args)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.workers.max(1))
        .thread_name("weft-control")
        .enable_all()
        .build()?;
    rt.block_on(async move {
        // Signal handlers before anything says it is serving: a SIGTERM right after that must stop weft control
        // cleanly, not kill it by the default action.
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        let mut int = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
        let (tls, auth) = tls_and_auth(&args)?;
        let running = crate::ads::server::start(ControlConfig {
            listen: args.listen,
            tls,
            auth,
            node_accounts: args.node_accounts.clone(),
            mesh: args.mesh.clone(),
            plugins_dir: args.plugins_dir.clone(),
            rollout_state: args.rollout_state.clone(),
            kube,
            poll: args.poll,
            status: args.status.0,
            metrics: args.metrics.0,
            log,
        })
        .await?;
        let stop = running.stop.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
            tracing::info!("weft control stopping");
            stop.cancel();
        });
        running.wait().await;
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory as _;

    use super::*;

    #[test]
    fn the_flags_are_consistent_and_parse() {
        ControlArgs::command().debug_assert();
        let a = ControlArgs::try_parse_from([
            "weft-control",
            "--ca-dir",
            "ca",
            "--tokens",
            "t.yaml",
            "--status",
            "off",
        ])
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(a.status, Listen(None));
        assert_eq!(
            a.metrics.0,
            Some("127.0.0.1:15015".parse().unwrap_or_else(|e| panic!("{e}")))
        );
        assert!(ControlArgs::try_parse_from(["weft-control", "--tokens", "t"]).is_err());
        assert!(ControlArgs::try_parse_from(["weft-control", "--ca-dir", "ca"]).is_err());
    }
}
