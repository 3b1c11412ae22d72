//! Starting weft control: load the sources (a bad one fails the start), bind the gRPC listener, the status and
//! metrics servers, and serve until stopped.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::auth::Authenticator;
use tokio_util::sync::CancellationToken;
use weft_proto::envoy::service::discovery::v3::aggregated_discovery_service_server::AggregatedDiscoveryServiceServer;

use crate::ads::metrics::Metrics;
use crate::ads::publish::Publisher;
use crate::ads::registry::Registry;
use crate::ads::service::Ads;
use crate::ads::status::{LogLevel, Status};

/// Why weft control could not start.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The mesh file or the plugin directory does not load.
    #[error("{0}")]
    Source(#[from] weft_state::ConfigError),
    /// The gRPC listener.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// Address.
        addr: SocketAddr,
        /// Cause.
        source: std::io::Error,
    },
    /// The status or metrics server.
    #[error("{0}")]
    Admin(#[from] weft_admin::AdminError),
    /// The WeftPlugin controller.
    #[error("{0}")]
    Kube(#[from] crate::kube::Error),
    /// The rollout state file.
    #[error("{0}")]
    RolloutState(#[from] crate::rollout::store::StoreError),
}

/// What to serve, and how.
#[derive(Debug)]
pub struct ControlConfig {
    /// gRPC (Delta ADS over TLS) listen address.
    pub listen: SocketAddr,
    /// The serving TLS config.
    pub tls: Arc<rustls::ServerConfig>,
    /// Caller authentication.
    pub auth: Authenticator,
    /// The service accounts node agents run as; other callers are refused and audit-logged (empty: any caller
    /// the authenticator accepts, as with a static token file whose every entry is a node).
    pub node_accounts: Vec<crate::ads::service::NodeAccount>,
    /// The mesh file (ztunnel's local-config format); none: no workloads, services or policies.
    pub mesh: Option<PathBuf>,
    /// The directory of WeftPlugin files; none: no plugins (unless `kube`).
    pub plugins_dir: Option<PathBuf>,
    /// WeftPlugin resources from the Kubernetes API instead of files.
    pub kube: Option<crate::kube::KubeOptions>,
    /// The file staged rollouts are kept in (resumed from at start); none: memory only.
    pub rollout_state: Option<PathBuf>,
    /// How often the sources are checked for edits.
    pub poll: Duration,
    /// Status endpoint (loopback only); none: off.
    pub status: Option<SocketAddr>,
    /// Metrics endpoint; none: off.
    pub metrics: Option<SocketAddr>,
    /// The log filter, for `/logging`.
    pub log: Option<Arc<dyn LogLevel>>,
}

/// A running weft control.
#[derive(Debug)]
pub struct Running {
    /// The bound gRPC address.
    pub addr: SocketAddr,
    /// The bound status address.
    pub status_addr: Option<SocketAddr>,
    /// The bound metrics address.
    pub metrics_addr: Option<SocketAddr>,
    /// What is served.
    pub publisher: Arc<Publisher>,
    /// Who is connected.
    pub registry: Arc<Registry>,
    /// Cancel to stop.
    pub stop: CancellationToken,
    /// The WeftPlugin controller, with `kube`.
    pub controller: Option<crate::kube::Controller>,
    server: tokio::task::JoinHandle<()>,
    sources: Vec<tokio::task::JoinHandle<()>>,
}

impl Running {
    /// Wait until stopped (by [`Running::stop`], `POST /quitquitquit`, or the caller's own signal handling).
    pub async fn wait(self) {
        let _ = self.server.await;
        for s in &self.sources {
            s.abort();
        }
        // The server ends when `stop` is cancelled, which the controller's tasks see too: wait for them to
        // release the Lease and delete this replica's report.
        if let Some(c) = self.controller {
            c.wait().await;
        }
    }
}

/// Load the sources, bind, and serve in the background.
pub async fn start(cfg: ControlConfig) -> Result<Running, Error> {
    let plugins_source = match (&cfg.plugins_dir, &cfg.kube) {
        (Some(d), _) => Some(d.display().to_string()),
        (None, Some(k)) => Some(format!("weftplugins.weft.dev at {}", k.api)),
        (None, None) => None,
    };
    let publisher = Arc::new(Publisher::new(
        cfg.mesh.as_ref().map(|p| p.display().to_string()),
        plugins_source,
    ));
    let registry = Arc::new(Registry::new(Arc::new(Metrics::new())));
    let mut sources = Vec::new();
    if let Some(mesh) = &cfg.mesh {
        sources.push(crate::ads::mesh::watch_mesh(
            mesh.clone(),
            publisher.clone(),
            cfg.poll,
        )?);
    }
    let stop = CancellationToken::new();
    if let Some(dir) = &cfg.plugins_dir {
        let store = cfg
            .rollout_state
            .clone()
            .map(crate::rollout::store::FileStore::new);
        if store.is_none() {
            tracing::warn!(
                "no --rollout-state: staged rollouts are kept in memory only, and a restart starts them over"
            );
        }
        let rollouts = Arc::new(crate::rollout::driver::Rollouts::new(
            store,
            registry.clone(),
        )?);
        publisher.set_rollouts(rollouts.clone());
        sources.push(rollouts.spawn(publisher.clone(), stop.clone()));
        sources.push(crate::ads::plugin_dir::watch_dir(
            dir.clone(),
            publisher.clone(),
            cfg.poll,
        )?);
    }
    // The controller's first complete lists are published before the listener is bound: a node must not be
    // served an empty plugin set that would remove what it runs.
    let controller = match cfg.kube.clone() {
        Some(k) => {
            Some(crate::kube::start(k, publisher.clone(), registry.clone(), stop.clone()).await?)
        }
        None => None,
    };
    let view = controller
        .as_ref()
        .map(|c| crate::ads::status::ControllerView {
            resources: c.state.clone(),
            leader: c.leader.clone(),
        });
    let status = Arc::new(Status {
        controller: view,
        publisher: publisher.clone(),
        registry: registry.clone(),
        log: cfg.log.clone(),
        stop: stop.clone(),
    });
    let status_addr = match cfg.status {
        Some(a) => Some(
            weft_admin::serve(weft_admin::Server::Admin, a, status.clone(), stop.clone()).await?,
        ),
        None => None,
    };
    let metrics_addr = match cfg.metrics {
        Some(a) => Some(
            weft_admin::serve(weft_admin::Server::Metrics, a, status.clone(), stop.clone()).await?,
        ),
        None => None,
    };
    let listener = tokio::net::TcpListener::bind(cfg.listen)
        .await
        .map_err(|source| Error::Bind {
            addr: cfg.listen,
            source,
        })?;
    let addr = listener.local_addr().unwrap_or(cfg.listen);
    let ads = Ads {
        publisher: publisher.clone(),
        registry: registry.clone(),
        auth: cfg.auth,
        node_accounts: cfg.node_accounts,
    };
    let grpc = AggregatedDiscoveryServiceServer::new(ads)
        .max_decoding_message_size(16 << 20)
        .max_encoding_message_size(64 << 20);
    let stopped = stop.clone();
    let server = tokio::spawn(crate::auth::serve(listener, cfg.tls, grpc, async move {
        stopped.cancelled().await
    }));
    tracing::info!(
        %addr,
        status = ?status_addr,
        metrics = ?metrics_addr,
        mesh = ?cfg.mesh,
        plugins = ?cfg.plugins_dir,
        "weft control serving Delta ADS"
    );
    Ok(Running {
        addr,
        status_addr,
        metrics_addr,
        publisher,
        registry,
        stop,
        controller,
        server,
        sources,
    })
}
