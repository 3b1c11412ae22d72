//! `weft-ca`: the reference Istio-protocol CA server (see the crate docs). Logs (JSON or text) go to stderr; audit
//! lines use the target `audit`.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use weft_control::ca::{Authenticator, CaService, Fault, NodeAccount, TrustedNodeAccounts};
use weft_identity::LocalCa;
use weft_state::StateStore;

/// A reference Istio-protocol CA that signs only identities of workloads on the requesting node.
#[derive(Debug, Parser)]
#[command(
    version,
    about = "A reference Istio-protocol CA for tests and demos: signs workload certificates and refuses \
             identities that have no workload on the requesting node."
)]
struct Args {
    /// gRPC+TLS listen address.
    #[arg(long, default_value = "127.0.0.1:15012")]
    listen: std::net::SocketAddr,
    /// Signer: root-cert.pem + root-key.pem, or ca-cert.pem + ca-key.pem + root-cert.pem (an intermediate).
    #[arg(long)]
    ca_dir: PathBuf,
    /// The workload source: a mesh config file (weft's local format), watched for edits.
    #[arg(long)]
    mesh_config: PathBuf,
    /// Trust domain of the identities signed.
    #[arg(long, default_value = "cluster.local")]
    trust_domain: String,
    /// Static token file (`tokens: [{token, node, identity}]`), instead of Kubernetes TokenReview.
    #[arg(long, conflicts_with = "kube_api")]
    tokens: Option<PathBuf>,
    /// Kubernetes API server for TokenReview (`https://...`, or `http://` for tests).
    #[arg(long, required_unless_present = "tokens")]
    kube_api: Option<String>,
    /// CA bundle of the API server (https).
    #[arg(long)]
    kube_ca_file: Option<PathBuf>,
    /// The CA's own token for the API server (allowed to create TokenReviews).
    #[arg(long)]
    kube_token_file: Option<PathBuf>,
    /// Service accounts (`namespace/name`, comma-separated or repeated) of the node agents (weft, ztunnel) that
    /// may ask for other identities than their own, and only for identities of workloads on their own node
    /// (istiod's CA_TRUSTED_NODE_ACCOUNTS, e.g. `istio-system/ztunnel`). Without it no caller may: each gets its
    /// own identity only.
    #[arg(long, value_name = "NS/SA,...", value_delimiter = ',')]
    trusted_node_accounts: Vec<NodeAccount>,
    /// Audience the nodes' tokens must carry.
    #[arg(long, default_value = "istio-ca")]
    audience: String,
    /// Names (DNS or IP) in the serving certificate; repeat the flag for several.
    #[arg(long = "tls-san", default_values_t = ["localhost".to_owned(), "127.0.0.1".to_owned()])]
    tls_sans: Vec<String>,
    /// Lifetime when a request names none.
    #[arg(long, default_value = "24h", value_parser = humantime::parse_duration)]
    default_validity: Duration,
    /// Longest lifetime granted.
    #[arg(long, default_value = "24h", value_parser = humantime::parse_duration)]
    max_validity: Duration,
    /// Misbehave on purpose (tests of the clients' checks).
    #[arg(long, value_enum)]
    fault: Option<Fault>,
    /// How often the mesh config is checked for edits.
    #[arg(long, default_value = "100ms", value_parser = humantime::parse_duration)]
    config_poll: Duration,
    /// Log filter.
    #[arg(long, env = "WEFT_CA_LOG", default_value = "info")]
    log: String,
    /// Log as JSON lines.
    #[arg(long)]
    log_json: bool,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let filter = tracing_subscriber::EnvFilter::try_new(&args.log).context("--log")?;
    let fmt = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if args.log_json {
        fmt.json().flatten_event(true).init();
    } else {
        fmt.init();
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(run(args))
}

async fn run(args: Args) -> anyhow::Result<()> {
    let ca = Arc::new(LocalCa::from_dir(&args.ca_dir).context("loading the signer")?);
    let workloads = Arc::new(StateStore::new());
    weft_state::load_into(&args.mesh_config, &workloads).context("loading the mesh config")?;
    let _watch = weft_state::watch_file(
        args.mesh_config.clone(),
        workloads.clone(),
        args.config_poll,
    );
    let auth = Authenticator::from_flags(
        args.tokens.as_deref(),
        args.kube_api.as_deref(),
        args.kube_ca_file.as_deref(),
        args.kube_token_file.clone(),
        &args.audience,
        &args.trust_domain,
    )?;
    let rogue = match args.fault {
        Some(Fault::BadChain) => {
            let (cert, key) =
                weft_identity::ca::generate_root(&args.trust_domain, Duration::from_secs(3600))?;
            Some(Arc::new(LocalCa::from_pem(&cert, &key, vec![])?))
        }
        _ => None,
    };
    let trusted: TrustedNodeAccounts = args.trusted_node_accounts.iter().cloned().collect();
    if trusted.is_empty() {
        tracing::warn!(
            "no --trusted-node-accounts: no caller may impersonate, so each may only obtain its own identity \
             (node agents such as weft or ztunnel need their service account listed)"
        );
    } else {
        tracing::info!(trusted_node_accounts = %trusted, "node agents allowed to ask for identities of workloads on their node");
    }
    let tls = weft_control::ca::server_tls(&ca, &args.tls_sans)?;
    let service = Arc::new(CaService {
        ca,
        trust_domain: args.trust_domain.clone(),
        auth,
        trusted_node_accounts: trusted,
        workloads,
        default_validity: args.default_validity,
        max_validity: args.max_validity,
        fault: args.fault,
        rogue,
        counters: Arc::default(),
    });
    // Signal handlers before the "serving" line: a SIGTERM right after it stops the CA cleanly.
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut int = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    tracing::info!(listen = %listener.local_addr()?, fault = ?args.fault, "weft-ca serving istio.v1.auth.IstioCertificateService");
    let shutdown = async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        tracing::info!("weft-ca stopping");
    };
    weft_control::ca::serve(listener, tls, service, shutdown).await?;
    Ok(())
}
