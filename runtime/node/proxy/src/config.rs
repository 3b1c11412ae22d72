//! Data-path settings: where each listener binds, how peers are dialled, timeouts and drain.

use std::net::SocketAddr;
use std::time::Duration;

use weft_hbone::{H2Config, PoolConfig};
pub use weft_state::LocalPod;

/// Ports weft itself uses; a connection addressed to one of them on a workload is refused (self-call protection).
pub const RESERVED_PORTS: [u16; 4] = [15001, 15006, 15008, 15080];

/// Default cap of open connections per listener.
///
/// ztunnel and Envoy set none by default. weft caps each listener so that a flood on one of them (15008 and 15006
/// listen on every address) cannot take every file descriptor and starve the other listeners, the admin servers
/// and the node's established connections. A relayed connection holds about two descriptors, so four listeners at
/// 65,536 each stay within the 1,048,576 descriptors container runtimes give a process by default, while the cap
/// is far above what a node's workloads hold through one listener in normal operation. Lower it where the
/// descriptor limit is lower.
pub const DEFAULT_MAX_CONNECTIONS_PER_LISTENER: usize = 65_536;

/// Where the inbound HBONE listener binds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InboundBind {
    /// One fixed address (e.g. `0.0.0.0:15008` inside a pod or node network namespace).
    Addr(SocketAddr),
    /// One listener per local HBONE workload IP on this port, following the state as workloads come and go
    /// (the in-pod model; also what lets several nodes share one machine on 127.0.0.x).
    Workloads {
        /// Port (15008).
        port: u16,
    },
    /// No inbound HBONE.
    Disabled,
}

/// Whether inbound connections keep the client's address as their source towards the application.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OriginalSource {
    /// Dial the application from weft's own address (the pod's, in-pod).
    Off,
    /// Make the capture listeners transparent when the kernel allows it (`CAP_NET_ADMIN`), and then dial from the
    /// client's address; otherwise say so once and dial as with `Off` (ztunnel's default when `ENABLE_ORIG_SRC` is
    /// unset).
    BestEffort,
    /// As `BestEffort`, but a listener that cannot be made transparent is an error.
    Required,
}

/// Data-path configuration.
#[derive(Debug, Clone)]
pub struct ProxyConfig {
    /// This node's name; workloads whose `node` equals it are local.
    pub node: String,
    /// Cluster id (baggage `k8s.cluster.name`).
    pub cluster_id: String,
    /// This node's network (ztunnel's `NETWORK`): an inbound tunnel whose `x-forwarded-network` names another came
    /// through that network's gateway; an outbound tunnel through a network gateway says it comes from here.
    /// Empty: the local workload's own network stands in for it.
    pub network: String,
    /// Outbound capture listener (iptables REDIRECT target), `None` to disable.
    pub outbound_addr: Option<SocketAddr>,
    /// SOCKS5 listener, `None` to disable.
    pub socks5_addr: Option<SocketAddr>,
    /// Inbound plaintext capture listener, `None` to disable.
    pub inbound_plaintext_addr: Option<SocketAddr>,
    /// Inbound HBONE listeners.
    pub inbound: InboundBind,
    /// Port dialled on peers for HBONE.
    pub hbone_port: u16,
    /// `SO_MARK` for every socket weft opens, so capture rules can exclude weft's own traffic.
    pub mark: Option<u32>,
    /// Bind outbound connections to the source workload's IP (needed when several workloads share a host,
    /// e.g. 127.0.0.x meshes; requires the IP to be local).
    pub bind_source_ip: bool,
    /// Limit for TCP connect + TLS + HTTP/2 handshake to a peer, and for TCP connect to a local workload.
    pub connect_timeout: Duration,
    /// Limit for getting a workload certificate before an outbound connection gives up.
    pub identity_timeout: Duration,
    /// A connection with no byte either way for this long is closed.
    pub idle_timeout: Duration,
    /// How long a drain waits for open connections before closing them.
    pub drain_deadline: Duration,
    /// Open connections each listener holds at most (a TCP connection counts from accept to close, so an HBONE
    /// connection counts once however many streams it carries); `None` = unlimited. A connection over the cap is
    /// closed at once, logged (rate-limited) and counted in `weft_listener_connections_refused_total`.
    pub max_connections_per_listener: Option<usize>,
    /// In-pod mode: the one pod this data path serves (its listeners live in the pod's network namespace). `None`:
    /// shared-node mode, every workload whose `node` is this node is local.
    pub pod: Option<LocalPod>,
    /// Listeners set `SO_REUSEPORT`, so a second weft can serve the same addresses during an upgrade.
    pub reuse_port: bool,
    /// Dial a workload's PROXY application tunnel on loopback (127.0.0.1 / ::1) instead of the workload's address:
    /// for in-pod mode, where weft runs inside the pod's network namespace and the application may listen on
    /// loopback only (ztunnel's `LOCALHOST_APP_TUNNEL`, on by default there). Node mode: off.
    pub app_tunnel_loopback: bool,
    /// Whether the application sees the original client's address as its peer (ztunnel's `ENABLE_ORIG_SRC`): the
    /// capture listeners are made transparent (so TPROXY rules can hand them connections too) and inbound
    /// connections to the application are dialled from the client's address.
    pub original_source: OriginalSource,
    /// Send `baggage` describing the destination workload with an inbound CONNECT's 200, as ztunnel does by default
    /// (its `ENABLE_RESPONSE_BAGGAGE`).
    pub response_baggage: bool,
    /// Who seals and opens HBONE's TLS records after the handshake: weft's record layer or rustls's
    /// (`--tls-record-layer`).
    pub tls_record_layer: weft_tls::RecordLayer,
    /// HTTP/2 settings.
    pub h2: H2Config,
    /// HBONE connection pool settings.
    pub pool: PoolConfig,
    /// Where accepted connections run: `None`, on the runtime that accepted them; `Some`, on the shards (each
    /// listener's home shard, or a less loaded one; see [`crate::shards`]).
    pub shards: Option<std::sync::Arc<crate::shards::Shards>>,
}

impl ProxyConfig {
    /// Defaults for a node named `node` (ztunnel's ports on all interfaces, SOCKS5 on localhost).
    pub fn new(node: impl Into<String>) -> Self {
        Self {
            node: node.into(),
            cluster_id: "Kubernetes".into(),
            network: String::new(),
            outbound_addr: Some(SocketAddr::from(([0, 0, 0, 0], 15001))),
            socks5_addr: Some(SocketAddr::from(([127, 0, 0, 1], 15080))),
            inbound_plaintext_addr: Some(SocketAddr::from(([0, 0, 0, 0], 15006))),
            inbound: InboundBind::Addr(SocketAddr::from(([0, 0, 0, 0], 15008))),
            hbone_port: 15008,
            mark: None,
            bind_source_ip: false,
            connect_timeout: Duration::from_secs(10),
            identity_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(3600),
            drain_deadline: Duration::from_secs(5),
            max_connections_per_listener: Some(DEFAULT_MAX_CONNECTIONS_PER_LISTENER),
            pod: None,
            reuse_port: false,
            app_tunnel_loopback: false,
            original_source: OriginalSource::Off,
            response_baggage: true,
            tls_record_layer: weft_tls::RecordLayer::default(),
            h2: H2Config::default(),
            pool: PoolConfig::default(),
            shards: None,
        }
    }
}
