//! weft's DNS proxy (port 15053, UDP and TCP): answers A/AAAA for mesh service hostnames, and their short forms
//! through the asking pod's search domains, with the service VIPs (a headless service: its endpoints' addresses),
//! authoritatively with TTL 30, as ztunnel does; forwards every other question to the node's resolvers and caches
//! their answers by TTL. It answers only mesh workloads served by this node ([`Clients`]); anyone else is refused,
//! so it is never an open resolver. It reads the mesh from a [`weft_state::StateStore`] and never writes it.
//!
//! Node mode: one [`DnsServer`] on `--dns` (127.0.0.1:15053), clients identified by source address. In-pod mode:
//! the in-pod code binds a UDP socket and a TCP listener inside each pod's network namespace and hands them over
//! with [`DnsServer::serve`] and [`Clients::Pod`]; upstream sockets come from an [`UpstreamSockets`] it supplies.
//!
//! ```no_run
//! # async fn f(state: std::sync::Arc<weft_state::StateStore>) -> std::io::Result<()> {
//! use std::sync::Arc;
//! use weft_dns::*;
//! let metrics = Arc::new(DnsMetrics::default());
//! let forwarder = Arc::new(Forwarder::new(
//!     ForwarderConfig { upstreams: vec!["10.96.0.10:53".parse().unwrap()], ..Default::default() },
//!     Arc::new(NodeSockets { mark: Some(0x539) }),
//!     Arc::new(SystemClock::default()),
//!     metrics.clone(),
//! ));
//! let server = DnsServer::new(state, forwarder, DnsConfig::default(), metrics);
//! let sockets = DnsSockets::bind("127.0.0.1:15053".parse().unwrap()).await?;
//! let serving = server.serve(sockets, Clients::Node { node: "node-a".into() }, Default::default())?;
//! serving.stop().await;
//! # Ok(()) }
//! ```

mod cache;
mod forward;
mod handler;
mod lookup;
mod message;
mod metrics;
mod names;
pub mod resolv;
mod server;

use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use weft_state::StateStore;

pub use cache::{Answer, Clock, ManualClock, SystemClock};
pub use forward::{
    ForwardError, Forwarder, ForwarderConfig, NodeSockets, TcpConnect, UdpBind, UpstreamSockets,
    bind_udp, connect_tcp, new_tcp_socket, new_udp_socket,
};
pub use handler::{Clients, MESH_TTL};
pub use metrics::{DnsMetrics, RequestLabels};
pub use server::{DnsSockets, ServerLimits, Serving};

/// How the proxy answers.
#[derive(Debug, Clone)]
pub struct DnsConfig {
    /// The cluster's DNS domain (`CLUSTER_DOMAIN`, default `cluster.local`): search domains are `<ns>.svc.<d>`,
    /// `svc.<d>` and `<d>`.
    pub cluster_domain: String,
    /// Listener limits.
    pub limits: ServerLimits,
}

impl Default for DnsConfig {
    fn default() -> Self {
        Self {
            cluster_domain: "cluster.local".into(),
            limits: ServerLimits::default(),
        }
    }
}

/// The DNS proxy: shared by every listener pair it serves.
#[derive(Debug, Clone)]
pub struct DnsServer {
    handler: Arc<handler::Handler>,
    limits: ServerLimits,
}

impl DnsServer {
    /// A proxy over `state`, forwarding with `forwarder`.
    pub fn new(
        state: Arc<StateStore>,
        forwarder: Arc<Forwarder>,
        cfg: DnsConfig,
        metrics: Arc<DnsMetrics>,
    ) -> Self {
        Self {
            handler: Arc::new(handler::Handler {
                state,
                forwarder,
                cluster_domain: cfg
                    .cluster_domain
                    .trim_end_matches('.')
                    .to_ascii_lowercase(),
                metrics,
            }),
            limits: cfg.limits,
        }
    }

    /// Serve one listener pair for `clients` until `stop` is cancelled (or [`Serving::stop`]). Must be called
    /// inside a tokio runtime (the listener tasks are spawned on it).
    pub fn serve(
        &self,
        sockets: DnsSockets,
        clients: Clients,
        stop: CancellationToken,
    ) -> std::io::Result<Serving> {
        server::serve(
            self.handler.clone(),
            self.limits.clone(),
            sockets,
            clients,
            stop,
        )
    }
}
