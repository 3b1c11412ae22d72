//! Starting a node on the caller's runtime, in order: state sources, identity, metrics and admin state, the
//! background loops, the admin servers, the data path.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use weft_admin::{AdminHandler, Server};
use weft_hooks::ConnectionHooks;
use weft_logging::LogControl;

use super::runtimes::{ShardThreads, available_cpus};
use super::{NodeHandle, data_path, identity, sources};
use crate::admin::{Node, Telemetry};
use crate::config::{Mode, NodeConfig};

/// Where the node runs besides the caller's runtime (its control runtime).
pub(crate) struct Threads {
    /// The data path's runtime.
    pub data: tokio::runtime::Handle,
    /// The shards carrying connections, if any.
    pub shards: Option<Arc<weft_proxy::shards::Shards>>,
    /// The log filter `/logging` changes (none: the process's logging is not the node's).
    pub logs: Option<LogControl>,
}

/// Starts a node from `config` on the current tokio runtime (control and data path alike; shards, if the config
/// asks for them, on threads of their own), as a test does in-process. Logging is the caller's.
pub async fn start(config: NodeConfig) -> anyhow::Result<NodeHandle> {
    let shards = ShardThreads::start(config.shard_count(available_cpus()))?;
    let threads = Threads {
        data: tokio::runtime::Handle::current(),
        shards: shards.as_ref().map(|s| s.shards.clone()),
        logs: None,
    };
    match start_on(config, threads).await {
        Ok(mut node) => {
            node.shards = shards;
            Ok(node)
        }
        Err(e) => {
            if let Some(s) = shards {
                tokio::task::spawn_blocking(move || s.stop()).await?;
            }
            Err(e)
        }
    }
}

/// Starts a node from `config`: its control side on the current runtime, its data path on `threads`.
pub(crate) async fn start_on(config: NodeConfig, threads: Threads) -> anyhow::Result<NodeHandle> {
    let cpus = available_cpus();
    let sources = sources::start(&config, cpus)?;
    let identity = identity::start(&config)?;
    let inpod = (config.inpod.mode == Mode::Inpod).then(|| Arc::new(weft_inpod::Status::default()));
    let telemetry = Telemetry::register(
        &sources.state,
        &identity,
        &sources.host,
        &sources.xds,
        inpod.as_ref(),
    );
    let quit = CancellationToken::new();
    let node = Arc::new(Node::new(
        &config,
        &sources,
        &identity,
        inpod.clone(),
        telemetry.registry,
        threads.logs,
        quit,
    ));
    let mut proxy = config.proxy_config();
    proxy.shards = threads.shards;
    tracing::info!(target: "weft::run", node = %config.node, config = ?config.config, xds = ?config.xds.xds_address,
        version = sources.state.version(), worker_threads = config.worker_threads(cpus),
        shards = config.shard_count(cpus), cpus, tls_record_layer = %proxy.tls_record_layer, "weft starting");

    let state = sources.state.clone();
    let mut tasks = Vec::new();
    if let Some(file) = config.config.clone() {
        tasks.push(weft_state::watch_file(
            file,
            state.clone(),
            config.tuning.config_poll,
        ));
    }
    tasks.push(identity.spawn_refresher(Duration::from_secs(1)));
    tasks.push(identity::keep_local(
        &identity,
        &state,
        &config.node,
        inpod.clone(),
        sources.identity_changes,
    ));
    let (host, changes, applied) = (
        sources.host,
        sources.plugin_changes,
        sources.plugins_applied,
    );
    tasks.push(sources::run_plugins(&state, &host, changes, applied, config.default_plugins).await);

    let stop_admin = CancellationToken::new();
    let mut admin_stopped = Vec::new();
    let admin_addr = serve_admin(&config, node.clone(), &stop_admin, &mut admin_stopped).await?;
    let hooks: Arc<dyn ConnectionHooks> = host;
    let inputs = data_path::Inputs {
        proxy,
        state,
        identity,
        hooks,
        metrics: telemetry.proxy,
        dns_metrics: telemetry.dns,
        inpod,
        data: threads.data.clone(),
    };
    let data_path = data_path::start(&config, inputs).await?;
    if let Some(p) = &data_path.proxy {
        let _ = node.proxy.set(p.clone());
    }
    tracing::info!(target: "weft::run", "weft ready to serve");
    Ok(NodeHandle {
        node,
        data_path,
        data: threads.data,
        stop_admin,
        admin_stopped,
        admin_addr,
        tasks,
        shards: None,
    })
}

/// Starts the admin, metrics and readiness servers `config` asks for; returns where the admin server listens.
async fn serve_admin(
    config: &NodeConfig,
    node: Arc<Node>,
    stop: &CancellationToken,
    stopped: &mut Vec<CancellationToken>,
) -> anyhow::Result<Option<std::net::SocketAddr>> {
    let handler: Arc<dyn AdminHandler> = node;
    let mut admin = None;
    for (which, listen) in [
        (Server::Admin, config.admin),
        (Server::Metrics, config.metrics),
        (Server::Readiness, config.readiness),
    ] {
        if let Some(addr) = listen.addr() {
            let serving = weft_admin::serve_with(
                which,
                addr,
                handler.clone(),
                stop.clone(),
                weft_admin::Limits::default(),
            )
            .await?;
            stopped.push(serving.stopped);
            if which == Server::Admin {
                admin = Some(serving.addr);
            }
        }
    }
    Ok(admin)
}
