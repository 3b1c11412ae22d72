//! weft's data path: the outbound capture and SOCKS5 listeners, inbound HBONE (mTLS + HTTP/2 CONNECT) and inbound
//! plaintext listeners, connection tracking, the byte relay, and the calls into the connection hooks (policy and
//! telemetry plugins). It depends on the hook contract, never on the Wasm runtime.

pub mod config;
mod conn;
#[doc(hidden)]
pub mod fuzzing;
pub mod headers;
mod inbound;
pub mod metrics;
pub mod outbound;
mod plaintext;
pub mod proxy_protocol;
pub mod relay;
pub mod shards;
pub mod socket;
mod socks5;
#[cfg(test)]
mod testkit;
pub mod tracker;

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use weft_hooks::ConnectionHooks;
use weft_identity::SecretManager;
use weft_state::{StateStore, TunnelProtocol};

pub use config::{InboundBind, LocalPod, OriginalSource, ProxyConfig};
pub use metrics::ProxyMetrics;
pub use outbound::PoolKey;
pub use socket::SocketFactory;
pub use tracker::{ConnTracker, LiveConnection};
pub use weft_tls::RecordLayer;

/// Errors starting the data path.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    /// A listener could not bind.
    #[error("cannot listen on {addr} ({what}): {source}")]
    Bind {
        /// Which listener.
        what: &'static str,
        /// Address.
        addr: SocketAddr,
        /// Cause.
        source: std::io::Error,
    },
    /// A capture listener could not be made transparent although the original source is required.
    #[error(
        "cannot make the {what} listener on {addr} transparent (IP_TRANSPARENT, needs CAP_NET_ADMIN), and the \
         original source is required (--original-source true): {source}"
    )]
    Transparent {
        /// Which listener.
        what: &'static str,
        /// Address.
        addr: SocketAddr,
        /// Cause.
        source: std::io::Error,
    },
}

/// Shared by every connection task.
pub(crate) struct Inner {
    pub(crate) cfg: ProxyConfig,
    pub(crate) state: Arc<StateStore>,
    pub(crate) identity: Arc<SecretManager>,
    pub(crate) hooks: Arc<dyn ConnectionHooks>,
    /// One HBONE pool per shard (one without shards), so a shard's streams ride connections it drives itself.
    pub(crate) pools: Vec<weft_hbone::Pool<PoolKey>>,
    pub(crate) tracker: Arc<ConnTracker>,
    pub(crate) metrics: Arc<ProxyMetrics>,
    /// Cancelled when the node drains: listeners stop, HBONE servers send GOAWAY.
    pub(crate) drain: CancellationToken,
    /// Where sockets are created (in-pod mode: inside the pod's network namespace); `None`: weft's own namespace.
    pub(crate) sockets: Option<Arc<dyn SocketFactory>>,
    /// Whether the capture listeners are transparent, so inbound connections are dialled from the client's address
    /// (see [`OriginalSource`]); set once they are bound.
    pub(crate) transparent: AtomicBool,
}

impl Inner {
    /// The HBONE pool of the shard this thread drives.
    pub(crate) fn pool(&self) -> &weft_hbone::Pool<PoolKey> {
        &self.pools[shards::current() % self.pools.len()]
    }

    /// Whether `w` is a workload this data path serves: the pod (in-pod mode), or any workload on this node.
    pub(crate) fn is_local(&self, w: &weft_state::Workload) -> bool {
        match &self.cfg.pod {
            Some(pod) => pod.matches(&self.cfg.node, w),
            None => w.node == self.cfg.node,
        }
    }

    /// Connect to `dst` with a socket from this data path's namespace.
    pub(crate) async fn dial(
        &self,
        dst: SocketAddr,
        src: socket::Source,
    ) -> std::io::Result<TcpStream> {
        socket::connect_via(self.sockets.as_deref(), dst, self.cfg.mark, src).await
    }

    /// The source to dial a local application from for a connection from `client`: the client's own address when
    /// the listeners are transparent (unless it is the application's own address, which the kernel would take as
    /// a connection to itself), else whatever the kernel picks.
    pub(crate) fn inbound_source(&self, client: SocketAddr, dst: SocketAddr) -> socket::Source {
        if self.transparent.load(Ordering::Relaxed) && client.ip() != dst.ip() {
            socket::Source::Transparent(client.ip())
        } else {
            socket::Source::Any
        }
    }

    /// The port of the capture listener bound at `addr` when TPROXY may hand it connections (the listeners are
    /// transparent), for [`socket::captured_destination`].
    pub(crate) fn tproxy_port(&self, addr: Option<SocketAddr>) -> Option<u16> {
        addr.filter(|_| self.transparent.load(Ordering::Relaxed))
            .map(|a| a.port())
    }
}

/// Make a capture listener's socket transparent as `policy` asks: `Ok(true)` when it is, `Ok(false)` when it is not
/// (off, or refused under best effort: logged), an error when it is required and refused.
fn make_transparent(
    sock: &socket2::Socket,
    what: &'static str,
    addr: SocketAddr,
    policy: OriginalSource,
) -> Result<bool, ProxyError> {
    if policy == OriginalSource::Off
        || !matches!(what, "outbound" | "inbound_plaintext" | "inbound_hbone")
    {
        return Ok(false);
    }
    match socket::set_transparent(sock) {
        Ok(()) => Ok(true),
        Err(source) if policy == OriginalSource::Required => {
            Err(ProxyError::Transparent { what, addr, source })
        }
        Err(e) => {
            tracing::warn!(listener = what, %addr, error = %e,
                "cannot make the listener transparent (IP_TRANSPARENT needs CAP_NET_ADMIN): applications see \
                 weft's address as the peer instead of the client's, and TPROXY capture rules reach no listener");
            Ok(false)
        }
    }
}

/// The running data path.
pub struct Proxy {
    inner: Arc<Inner>,
    listeners: Mutex<HashMap<(&'static str, SocketAddr), JoinHandle<()>>>,
    bound: Mutex<Vec<(&'static str, SocketAddr)>>,
    ready: AtomicBool,
}

impl std::fmt::Debug for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proxy")
            .field("node", &self.inner.cfg.node)
            .finish_non_exhaustive()
    }
}

impl Proxy {
    /// Bind every listener and start serving. Must run inside the data-path runtime.
    pub async fn start(
        cfg: ProxyConfig,
        state: Arc<StateStore>,
        identity: Arc<SecretManager>,
        hooks: Arc<dyn ConnectionHooks>,
        metrics: Arc<ProxyMetrics>,
    ) -> Result<Arc<Self>, ProxyError> {
        Self::start_with(cfg, state, identity, hooks, metrics, None).await
    }

    /// [`Proxy::start`] with every socket (listeners and outgoing connections) created by `sockets`: a per-pod
    /// data path in in-pod mode. With `sockets`, the inbound HBONE listener must be a fixed address.
    pub async fn start_with(
        cfg: ProxyConfig,
        state: Arc<StateStore>,
        identity: Arc<SecretManager>,
        hooks: Arc<dyn ConnectionHooks>,
        metrics: Arc<ProxyMetrics>,
        sockets: Option<Arc<dyn SocketFactory>>,
    ) -> Result<Arc<Self>, ProxyError> {
        let pools = cfg.shards.as_ref().map_or(1, |s| s.len().max(1));
        let inner = Arc::new(Inner {
            pools: (0..pools)
                .map(|_| weft_hbone::Pool::new(cfg.pool.clone()))
                .collect(),
            cfg,
            state,
            identity,
            hooks,
            tracker: Arc::new(ConnTracker::default()),
            metrics,
            drain: CancellationToken::new(),
            sockets,
            transparent: AtomicBool::new(false),
        });
        let proxy = Arc::new(Self {
            inner: inner.clone(),
            listeners: Mutex::new(HashMap::new()),
            bound: Mutex::new(Vec::new()),
            ready: AtomicBool::new(false),
        });
        let c = &inner.cfg;
        if let Some(f) = inner.sockets.clone() {
            let listeners = [
                ("outbound", c.outbound_addr),
                ("socks5", c.socks5_addr),
                ("inbound_plaintext", c.inbound_plaintext_addr),
                (
                    "inbound_hbone",
                    match c.inbound {
                        InboundBind::Addr(a) => Some(a),
                        _ => None,
                    },
                ),
            ];
            let mut bound = Vec::new();
            let mut transparent = true;
            for (what, addr) in listeners {
                let Some(addr) = addr else { continue };
                let sock = f
                    .tcp_socket(socket2::Domain::for_address(addr))
                    .await
                    .map_err(|source| ProxyError::Bind { what, addr, source })?;
                let made = make_transparent(&sock, what, addr, c.original_source)?;
                if matches!(what, "inbound_plaintext" | "inbound_hbone") {
                    transparent &= made;
                }
                let lis = socket::listen_socket(sock, addr, c.reuse_port, c.mark)
                    .map_err(|source| ProxyError::Bind { what, addr, source })?;
                bound.push((what, addr, lis));
            }
            // Inbound dials keep the client's address only when both inbound listeners are transparent.
            inner.transparent.store(
                transparent && c.original_source != OriginalSource::Off,
                Ordering::Relaxed,
            );
            for (what, addr, lis) in bound {
                match what {
                    "outbound" => proxy.serve(what, addr, lis, Inner::handle_captured),
                    "socks5" => proxy.serve(what, addr, lis, Inner::handle_socks5),
                    "inbound_plaintext" => proxy.serve(what, addr, lis, Inner::handle_plaintext),
                    _ => proxy.serve(what, addr, lis, Inner::handle_hbone_conn),
                }
            }
            proxy.spawn_rechecker();
            proxy.ready.store(true, Ordering::Release);
            return Ok(proxy);
        }
        if let Some(a) = c.outbound_addr {
            proxy.listen("outbound", a, Inner::handle_captured)?;
        }
        if let Some(a) = c.socks5_addr {
            proxy.listen("socks5", a, Inner::handle_socks5)?;
        }
        // Inbound dials keep the client's address only when every inbound listener is transparent (per-workload
        // HBONE listeners are not made so).
        let mut transparent = c.original_source != OriginalSource::Off
            && !matches!(c.inbound, InboundBind::Workloads { .. });
        if let Some(a) = c.inbound_plaintext_addr {
            transparent &= proxy.listen("inbound_plaintext", a, Inner::handle_plaintext)?;
        }
        if let InboundBind::Addr(a) = c.inbound {
            transparent &= proxy.listen("inbound_hbone", a, Inner::handle_hbone_conn)?;
        }
        inner.transparent.store(transparent, Ordering::Relaxed);
        match c.inbound.clone() {
            InboundBind::Addr(_) => {}
            InboundBind::Workloads { port } => {
                proxy.reconcile_workload_listeners(port);
                let p = proxy.clone();
                let mut rx = inner.state.subscribe();
                let drain = inner.drain.clone();
                tokio::spawn(async move {
                    loop {
                        tokio::select! {
                            r = rx.changed() => if r.is_err() { return },
                            () = drain.cancelled() => return,
                        }
                        p.reconcile_workload_listeners(port);
                    }
                });
            }
            InboundBind::Disabled => {}
        }
        proxy.spawn_rechecker();
        proxy.ready.store(true, Ordering::Release);
        Ok(proxy)
    }

    /// Bind `addr` in weft's own namespace (transparent as [`ProxyConfig::original_source`] asks, for the capture
    /// listeners) and serve it; returns whether it is transparent.
    fn listen<F, Fut>(
        self: &Arc<Self>,
        what: &'static str,
        addr: SocketAddr,
        handler: F,
    ) -> Result<bool, ProxyError>
    where
        F: Fn(Arc<Inner>, TcpStream, SocketAddr) -> Fut + Send + Sync + Copy + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let bind_err = |source| ProxyError::Bind { what, addr, source };
        let sock = socket::new_tcp(addr).map_err(bind_err)?;
        let transparent = make_transparent(&sock, what, addr, self.inner.cfg.original_source)?;
        let lis = socket::listen_on(sock, addr).map_err(bind_err)?;
        self.serve(what, addr, lis, handler);
        Ok(transparent)
    }

    /// Accept on a bound listener.
    fn serve<F, Fut>(
        self: &Arc<Self>,
        what: &'static str,
        addr: SocketAddr,
        lis: TcpListener,
        handler: F,
    ) where
        F: Fn(Arc<Inner>, TcpStream, SocketAddr) -> Fut + Send + Sync + Copy + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let actual = lis.local_addr().unwrap_or(addr);
        let inner = self.inner.clone();
        let task = match inner.cfg.shards.clone() {
            None => tokio::spawn(accept_loop(inner, lis, what, handler, Placement::Here)),
            // The listener moves to its shard's own reactor, so its readiness wakes that thread directly.
            Some(shards) => match Self::shard_loop(&shards, inner, lis, what, handler) {
                Ok(task) => task,
                Err(e) => {
                    tracing::error!(listener = what, error = %e, "cannot move a listener to a shard");
                    return;
                }
            },
        };
        tracing::info!(listener = what, addr = %actual, "listening");
        self.lock_listeners().insert((what, addr), task);
        self.bound
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push((what, actual));
    }

    /// The accept loop of a listener served by the shards, on the listener's home shard (homes in turn; see
    /// [`shards`] for where connections go).
    fn shard_loop<F, Fut>(
        shards: &Arc<shards::Shards>,
        inner: Arc<Inner>,
        lis: TcpListener,
        what: &'static str,
        handler: F,
    ) -> std::io::Result<JoinHandle<()>>
    where
        F: Fn(Arc<Inner>, TcpStream, SocketAddr) -> Fut + Send + Sync + Copy + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let std = lis.into_std()?;
        let home = shards.next_index();
        let placement = if what == "inbound_hbone" {
            Placement::InTurn(shards.clone())
        } else {
            Placement::Home {
                shards: shards.clone(),
                home,
            }
        };
        Ok(shards.spawn_on(home, async move {
            match TcpListener::from_std(std) {
                Ok(lis) => accept_loop(inner, lis, what, handler, placement).await,
                Err(e) => {
                    tracing::error!(listener = what, error = %e, "cannot move a listener to its shard")
                }
            }
        }))
    }

    fn lock_listeners(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<(&'static str, SocketAddr), JoinHandle<()>>> {
        self.listeners
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// One HBONE listener per local HBONE workload IP; listeners of departed workloads stop accepting (their open
    /// connections continue).
    fn reconcile_workload_listeners(self: &Arc<Self>, port: u16) {
        if self.inner.drain.is_cancelled() {
            return;
        }
        let state = self.inner.state.current();
        let want: Vec<SocketAddr> = state
            .local_workloads(&self.inner.cfg.node)
            .filter(|w| w.protocol == TunnelProtocol::Hbone)
            .flat_map(|w| w.addresses.iter().map(|ip| SocketAddr::new(*ip, port)))
            .collect();
        let stale: Vec<(&'static str, SocketAddr)> = self
            .lock_listeners()
            .keys()
            .filter(|(what, a)| *what == "inbound_hbone" && !want.contains(a))
            .copied()
            .collect();
        for key in stale {
            if let Some(t) = self.lock_listeners().remove(&key) {
                tracing::info!(addr = %key.1, "workload left: HBONE listener stopped");
                t.abort();
            }
            self.bound
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .retain(|b| *b != key);
        }
        for addr in want {
            if self.lock_listeners().contains_key(&("inbound_hbone", addr)) {
                continue;
            }
            if let Err(e) = self.listen("inbound_hbone", addr, Inner::handle_hbone_conn) {
                self.inner.metrics.fail("inbound", "listen");
                tracing::error!(error = %e, "cannot serve HBONE for a local workload");
            }
        }
    }

    fn spawn_rechecker(self: &Arc<Self>) {
        let inner = self.inner.clone();
        let mut rx = inner.hooks.policy_changes();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    r = rx.changed() => if r.is_err() { return },
                    () = inner.drain.cancelled() => return,
                }
                let n = inner.tracker.recheck(inner.hooks.clone()).await;
                if n > 0 {
                    tracing::info!(closed = n, "policy re-check closed live connections");
                }
            }
        });
    }

    /// Whether every configured listener is bound.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire) && !self.inner.drain.is_cancelled()
    }

    /// The addresses actually bound, by listener name (ephemeral ports resolved).
    pub fn bound_addrs(&self) -> Vec<(&'static str, SocketAddr)> {
        self.bound
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Live connections.
    pub fn tracker(&self) -> &Arc<ConnTracker> {
        &self.inner.tracker
    }

    /// HBONE connections pooled now.
    pub fn pooled_connections(&self) -> usize {
        self.inner.pools.iter().map(|p| p.connections()).sum()
    }

    /// HBONE connections created since start.
    pub fn hbone_connections_created(&self) -> u64 {
        self.inner.pools.iter().map(|p| p.created_total()).sum()
    }

    /// Drain: stop accepting, GOAWAY every HBONE connection, wait up to the deadline for every connection to
    /// finish (established ones and those accepted but still being set up), then close what is left.
    ///
    /// The accept loops are stopped and awaited first: once they have returned, every connection they accepted is
    /// counted by the tracker (its guard is taken before its task is spawned) and no further one is accepted, so
    /// an empty tracker means no connection is left to kill. Connections still waiting in the kernel's accept
    /// queues are not taken: closing the listeners hands them to the other members of the listeners'
    /// `SO_REUSEPORT` groups (`tcp_migrate_req`), i.e. to the new instance of an upgrade.
    pub async fn drain(&self) {
        let deadline = tokio::time::Instant::now() + self.inner.cfg.drain_deadline;
        let tracker = &self.inner.tracker;
        tracing::info!(live = tracker.len(), accepted = tracker.accepted_len(), deadline = ?self.inner.cfg.drain_deadline, "draining");
        self.inner.drain.cancel();
        let loops: Vec<JoinHandle<()>> = self.lock_listeners().drain().map(|(_, t)| t).collect();
        for t in loops {
            // An accept loop returns at its next poll once the drain token is cancelled (it never holds an
            // accepted connection across an await): this does not wait on any peer.
            if let Err(e) = t.await
                && e.is_panic()
            {
                tracing::error!(error = %e, "an accept loop panicked");
            }
        }
        tracing::debug!(
            live = tracker.len(),
            accepted = tracker.accepted_len(),
            "listeners closed: waiting for connections"
        );
        if tokio::time::timeout_at(deadline, tracker.wait_idle())
            .await
            .is_err()
        {
            tracing::warn!(
                live = tracker.len(),
                accepted = tracker.accepted_len(),
                "drain deadline reached: closing remaining connections"
            );
            const GRACE: std::time::Duration = std::time::Duration::from_secs(1);
            // Established connections end their relays and report their close...
            tracker.close_all();
            if !tracker.is_empty() {
                let _ = tokio::time::timeout(GRACE, tracker.wait_idle()).await;
            }
            // ... and whatever is still being set up (or stuck) is dropped.
            if !tracker.is_idle() {
                tracker.abandon();
                let _ = tokio::time::timeout(GRACE, tracker.wait_idle()).await;
            }
        }
        tracing::info!("drained");
    }
}

/// Minimum time between two "connection cap reached" warnings of one listener.
const CAP_WARN_INTERVAL: std::time::Duration = std::time::Duration::from_secs(10);

/// Where an accept loop runs the connections it accepts.
enum Placement {
    /// On the loop's own runtime (no shards).
    Here,
    /// On the shards in turn (inbound HBONE).
    InTurn(Arc<shards::Shards>),
    /// On the loop's own shard `home`, or a less loaded one ([`shards::Shards::place`]).
    Home {
        shards: Arc<shards::Shards>,
        home: usize,
    },
}

/// Accepts on `lis` until the drain, running each connection where `placement` says.
async fn accept_loop<F, Fut>(
    inner: Arc<Inner>,
    lis: TcpListener,
    what: &'static str,
    handler: F,
    placement: Placement,
) where
    F: Fn(Arc<Inner>, TcpStream, SocketAddr) -> Fut + Send + Sync + Copy + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let labels = metrics::ListenerLabels { listener: what };
    let refused = inner
        .metrics
        .listener_refused
        .get_or_create(&labels)
        .clone();
    let open = inner.metrics.listener_open.get_or_create(&labels).clone();
    let cap = inner.cfg.max_connections_per_listener;
    let slots = cap.map(|n| Arc::new(tokio::sync::Semaphore::new(n)));
    // Rate limit of the cap warning: when it was last logged and how many refusals it has not reported yet.
    let mut last_warn: Option<tokio::time::Instant> = None;
    let mut unreported: u64 = 0;
    loop {
        // Drain first: once it has started, no connection is taken from the accept queue (closing the listener
        // hands the queued ones to the rest of its SO_REUSEPORT group).
        let accepted = tokio::select! {
            biased;
            () = inner.drain.cancelled() => return,
            a = lis.accept() => a,
        };
        match accepted {
            Ok((stream, peer)) => {
                // Counted from this instant: a drain that starts while the connection is being set up waits for
                // it. (Created before any await, so the loop never holds an uncounted connection.)
                let tracked = inner.tracker.accepted();
                let peer = socket::canonical(peer);
                let permit = match &slots {
                    None => None,
                    Some(s) => match s.clone().try_acquire_owned() {
                        Ok(p) => Some(p),
                        Err(_) => {
                            // Over the cap: close at once (the peer sees the connection closed before any byte).
                            refused.inc();
                            drop(stream);
                            drop(tracked);
                            unreported += 1;
                            if last_warn.is_none_or(|t| t.elapsed() >= CAP_WARN_INTERVAL) {
                                tracing::warn!(listener = what, %peer, cap = cap.unwrap_or(0), refused = unreported, "listener connection cap reached: refusing new connections");
                                last_warn = Some(tokio::time::Instant::now());
                                unreported = 0;
                            }
                            continue;
                        }
                    },
                };
                // TCP_NODELAY is inherited from the listener (see `socket::listen`).
                let inner = inner.clone();
                let open = OpenGuard::new(open.clone());
                let span = tracing::debug_span!("conn", listener = what, %peer);
                // The slot is held until the connection ends, however it ends (the task may be aborted). No
                // `async` block around the handler: it would store the handler's future twice.
                let (shards, shard) = match &placement {
                    Placement::Here => (None, 0),
                    Placement::InTurn(s) => (Some(s), s.next_index()),
                    Placement::Home { shards, home } => (Some(shards), shards.place(*home)),
                };
                let counted = shards.map(|s| s.count(shard));
                let hold = (permit, open, counted);
                match shards {
                    // Another shard runs it: the socket leaves this shard's reactor for that shard's, so its
                    // readiness wakes the thread that serves it.
                    Some(s) if shard != shards::current() => {
                        let adopted = shards::adopt(stream, move |stream| {
                            tracked.serve_holding(handler(inner, stream, peer), hold)
                        });
                        match adopted {
                            Ok(conn) => {
                                drop(s.spawn_on(shard, tracing::Instrument::instrument(conn, span)))
                            }
                            Err(e) => {
                                tracing::warn!(listener = what, %peer, error = %e, "cannot hand a connection to its shard: closing it");
                            }
                        }
                    }
                    // Kept on the loop's own shard (or runtime): spawned here without waking another thread.
                    _ => {
                        let conn = tracked.serve_holding(handler(inner, stream, peer), hold);
                        drop(tokio::spawn(tracing::Instrument::instrument(conn, span)));
                    }
                }
            }
            Err(e) => {
                // EMFILE and friends: back off briefly instead of spinning.
                tracing::warn!(listener = what, error = %e, "accept failed");
                tokio::select! {
                    () = inner.drain.cancelled() => return,
                    () = tokio::time::sleep(std::time::Duration::from_millis(50)) => {}
                }
            }
        }
    }
}

/// Counts one open connection of a listener while it lives.
struct OpenGuard(prometheus_client::metrics::gauge::Gauge);

impl OpenGuard {
    fn new(g: prometheus_client::metrics::gauge::Gauge) -> Self {
        g.inc();
        Self(g)
    }
}

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}
