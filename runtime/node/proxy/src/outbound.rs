//! Outbound: a local workload's connection (captured on 15001, or asked for over SOCKS5) is resolved against the
//! state, checked by egress policy, and sent over a pooled HBONE tunnel (mesh destinations) or plain TCP.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use futures_util::future::Either;
use tokio::net::TcpStream;
use weft_hbone::{ConnectRequest, H2Stream, SharedError};
use weft_hooks::{ConnectionRecord, Direction, Verdict};
use weft_identity::SpiffeId;
use weft_state::{Resolved, TunnelProtocol};

use crate::conn::{Halves, Via};
use crate::{Inner, headers, socket};

mod gateway;

pub(crate) use gateway::FORWARDED_NETWORK;

/// Pool key: one HTTP/2 connection serves one (source identity, accepted destination identities, source IP,
/// destination).
///
/// The accepted identities are everything the TLS verifier of the connection accepted (the destination workload's
/// identity plus the service's SANs when a service was targeted): a connection verified against a wider set must
/// never serve a request that accepts fewer, so the whole set is part of the key (as in ztunnel).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PoolKey {
    /// Source workload identity.
    pub src_id: SpiffeId,
    /// Every identity the destination may present, sorted and deduplicated (so equal sets are equal keys).
    pub dst_ids: Arc<[SpiffeId]>,
    /// Source IP the connection is bound to (if any).
    pub src_ip: Option<std::net::IpAddr>,
    /// HBONE address dialled.
    pub dst: SocketAddr,
}

impl PoolKey {
    /// A key for connections from `src_id` (bound to `src_ip`) to `dst` that accept any of `accepted`.
    pub fn new(
        src_id: SpiffeId,
        mut accepted: Vec<SpiffeId>,
        src_ip: Option<std::net::IpAddr>,
        dst: SocketAddr,
    ) -> Self {
        accepted.sort_unstable();
        accepted.dedup();
        Self {
            src_id,
            dst_ids: accepted.into(),
            src_ip,
            dst,
        }
    }
}

/// Why an outbound connection could not be established.
#[derive(Debug, thiserror::Error)]
pub enum OutboundError {
    /// Policy denied it.
    #[error("denied by {by}: {reason}")]
    Denied {
        /// Who denied.
        by: String,
        /// Why.
        reason: String,
    },
    /// The destination cannot be routed.
    #[error("unroutable destination: {0}")]
    Unroutable(String),
    /// No certificate for the source identity.
    #[error("no certificate for {0}")]
    Identity(String),
    /// The client's connection failed (reset) before the tunnel was open.
    #[error("client connection failed before the tunnel opened: {0}")]
    Client(String),
    /// Connecting (TCP, TLS, HTTP/2 or CONNECT) failed.
    #[error("upstream connect failed ({}): {}", kind.as_str(), error_chain(source.as_ref()))]
    Connect {
        /// Which step failed, from the error's type.
        kind: ConnectFailure,
        /// The cause.
        source: SharedError,
    },
}

/// The step at which connecting upstream failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectFailure {
    /// The TCP connection was refused or failed.
    Tcp,
    /// The TLS handshake failed (including a peer identity the verifier does not accept), or no TLS client
    /// configuration could be built.
    Tls,
    /// TLS succeeded but the HTTP/2 handshake did not.
    H2Handshake,
    /// The connect timeout elapsed (TCP, TLS and HTTP/2 together).
    Timeout,
    /// The CONNECT stream on an HTTP/2 connection failed (reset, connection closed, a non-200 status).
    Tunnel,
}

impl ConnectFailure {
    /// Short name (logs).
    pub fn as_str(self) -> &'static str {
        match self {
            ConnectFailure::Tcp => "tcp",
            ConnectFailure::Tls => "tls",
            ConnectFailure::H2Handshake => "http2_handshake",
            ConnectFailure::Timeout => "timeout",
            ConnectFailure::Tunnel => "connect",
        }
    }

    /// Istio-style response flag for the access log and telemetry.
    pub fn response_flag(self) -> &'static str {
        match self {
            ConnectFailure::Tls => "TLS_FAILURE",
            ConnectFailure::H2Handshake => "H2_HANDSHAKE_FAILURE",
            ConnectFailure::Tcp | ConnectFailure::Timeout | ConnectFailure::Tunnel => "CONNECT",
        }
    }
}

/// Why dialling an upstream failed, by step. It is the error of the HBONE pool's connect function, so that the
/// failure is classified from its type ([`DialError::kind`]), not from its text.
#[derive(Debug, thiserror::Error)]
pub enum DialError {
    /// TCP connect.
    #[error("tcp connect to {addr}: {source}")]
    Tcp {
        /// Address dialled.
        addr: SocketAddr,
        /// Cause.
        source: std::io::Error,
    },
    /// Building the TLS client configuration.
    #[error("TLS client configuration for {addr}: {source}")]
    TlsConfig {
        /// Address dialled.
        addr: SocketAddr,
        /// Cause.
        source: weft_identity::Error,
    },
    /// TLS handshake.
    #[error("TLS handshake with {addr}: {source}")]
    Tls {
        /// Address dialled.
        addr: SocketAddr,
        /// Cause.
        source: weft_tls::Error,
    },
    /// HTTP/2 handshake.
    #[error("HTTP/2 handshake with {addr}: {source}")]
    H2 {
        /// Address dialled.
        addr: SocketAddr,
        /// Cause.
        source: weft_hbone::Error,
    },
    /// The connect timeout elapsed.
    #[error("connecting to {addr} timed out after {after:?}")]
    Timeout {
        /// Address dialled.
        addr: SocketAddr,
        /// The timeout.
        after: std::time::Duration,
    },
}

impl DialError {
    /// The step that failed.
    pub fn kind(&self) -> ConnectFailure {
        match self {
            DialError::Tcp { .. } => ConnectFailure::Tcp,
            DialError::TlsConfig { .. } | DialError::Tls { .. } => ConnectFailure::Tls,
            DialError::H2 { .. } => ConnectFailure::H2Handshake,
            DialError::Timeout { .. } => ConnectFailure::Timeout,
        }
    }
}

/// Classify a failed pooled CONNECT: a dial failure keeps its own kind, anything else failed on the tunnel.
fn classify(e: weft_hbone::Error) -> (ConnectFailure, SharedError) {
    match e {
        weft_hbone::Error::ConnectFailed(cause) => {
            let kind = (cause.as_ref() as &(dyn std::error::Error + 'static))
                .downcast_ref::<DialError>()
                .map_or(ConnectFailure::Tunnel, DialError::kind);
            (kind, cause)
        }
        other => (ConnectFailure::Tunnel, Arc::new(other)),
    }
}

/// The upstream side of an established outbound connection.
pub(crate) enum Upstream {
    Hbone(H2Stream, SocketAddr),
    Tcp(TcpStream),
}

pub(crate) struct Established {
    pub record: Arc<ConnectionRecord>,
    /// Bytes of the client's already sent upstream behind the CONNECT (early data).
    pub early_sent: u64,
    /// The tracker's policy epoch read before the connection was authorized.
    pub epoch: u64,
    pub upstream: Upstream,
}

impl Inner {
    /// Resolve, authorize and connect; reports failures itself.
    ///
    /// With `client`, whatever the client sends while the `CONNECT` waits for its response goes right behind it
    /// as early data (direct tunnels to a destination's node only; see [`ClientEarly`]).
    pub(crate) async fn establish_outbound(
        self: &Arc<Self>,
        src: SocketAddr,
        dst: SocketAddr,
        client: Option<&TcpStream>,
    ) -> Result<Established, OutboundError> {
        let state = self.state.current();
        let src_wl = state
            .workload_by_ip(src.ip())
            .filter(|w| self.is_local(w))
            .cloned();
        let mut record = ConnectionRecord {
            id: self.tracker.next_id(),
            direction: Direction::Outbound,
            src,
            dst,
            peer_identity: src_wl.as_ref().map(|w| w.meta.identity.clone()),
            src_workload: src_wl.as_ref().map(|w| w.meta.clone()),
            dst_workload: None,
            dst_service: None,
            hbone: false,
        };
        let fail = |record: &Arc<ConnectionRecord>, reason, flags, e: OutboundError| {
            let verdict = match &e {
                OutboundError::Denied { by, reason } => Verdict::Deny {
                    by: by.clone(),
                    reason: reason.clone(),
                },
                _ => Verdict::Allow,
            };
            tracing::warn!(conn = record.id, %src, %dst, error = %e, "outbound connection failed");
            self.failed(record, Via::NONE, reason, verdict, e.to_string(), flags);
            e
        };
        if crate::config::RESERVED_PORTS.contains(&dst.port())
            && state.workload_by_ip(dst.ip()).is_some()
        {
            return Err(fail(
                &Arc::new(record),
                "self_call",
                "-",
                OutboundError::Unroutable(format!("{dst} is a weft port")),
            ));
        }
        let resolved: Resolved = match state.resolve_from(src_wl.as_deref(), dst) {
            Ok(r) => r,
            Err(e) => {
                return Err(fail(
                    &Arc::new(record),
                    "unknown_destination",
                    "-",
                    OutboundError::Unroutable(e.to_string()),
                ));
            }
        };
        record.dst_workload = resolved.workload.as_ref().map(|w| w.meta.clone());
        record.dst_service = resolved.service.as_ref().map(|s| s.key());
        record.hbone = resolved.is_hbone();
        let epoch = self.tracker.policy_epoch();
        if let v @ Verdict::Deny { .. } = self.hooks.authorize(&record) {
            let Verdict::Deny { by, reason } = v else {
                unreachable!()
            };
            return Err(fail(
                &Arc::new(record),
                "denied",
                "DENY",
                OutboundError::Denied { by, reason },
            ));
        }
        let record = Arc::new(record);
        // Who terminates the (outer) tunnel, where it is, and which extra identities it may present: the network
        // gateway when the destination (or its waypoint) is on another network; else the destination's waypoint
        // when it has one (transport policy above has already run: the waypoint gets only what the client side
        // allowed); else the destination workload itself on its node's HBONE port.
        let (dst_wl, hbone_addr, extra_sans) = match (
            resolved
                .network_gateway
                .as_ref()
                .or(resolved.waypoint.as_ref()),
            &resolved.workload,
        ) {
            (Some(wp), _) => (
                wp.workload.clone(),
                wp.addr,
                wp.service
                    .as_ref()
                    .map(|s| s.subject_alt_names.clone())
                    .unwrap_or_default(),
            ),
            (None, Some(w)) if w.protocol == TunnelProtocol::Hbone => (
                w.clone(),
                SocketAddr::new(resolved.addr.ip(), self.cfg.hbone_port),
                resolved
                    .service
                    .as_ref()
                    .map(|s| s.subject_alt_names.clone())
                    .unwrap_or_default(),
            ),
            _ => {
                // Plain TCP: a TCP workload, or a destination outside the mesh.
                let bind = match src_wl {
                    Some(_) if self.cfg.bind_source_ip => socket::Source::Local(src.ip()),
                    _ => socket::Source::Any,
                };
                let addr = resolved.addr;
                let conn =
                    match tokio::time::timeout(self.cfg.connect_timeout, self.dial(addr, bind))
                        .await
                    {
                        Ok(Ok(s)) => Ok(s),
                        Ok(Err(source)) => Err(DialError::Tcp { addr, source }),
                        Err(_) => Err(DialError::Timeout {
                            addr,
                            after: self.cfg.connect_timeout,
                        }),
                    };
                return match conn {
                    Ok(s) => Ok(Established {
                        record,
                        early_sent: 0,
                        epoch,
                        upstream: Upstream::Tcp(s),
                    }),
                    Err(e) => {
                        let kind = e.kind();
                        Err(fail(
                            &record,
                            "connect",
                            kind.response_flag(),
                            OutboundError::Connect {
                                kind,
                                source: Arc::new(e),
                            },
                        ))
                    }
                };
            }
        };
        let Some(src_wl) = src_wl else {
            return Err(fail(
                &record,
                "identity",
                "IDENTITY_ERROR",
                OutboundError::Identity(format!(
                    "source {src} is not a workload on node {}",
                    self.cfg.node
                )),
            ));
        };
        let src_id = SpiffeId::new(
            &src_wl.trust_domain,
            &src_wl.namespace,
            &src_wl.service_account,
        )
        .map_err(|e| {
            fail(
                &record,
                "identity",
                "IDENTITY_ERROR",
                OutboundError::Identity(e.to_string()),
            )
        })?;
        let dst_id = SpiffeId::new(
            &dst_wl.trust_domain,
            &dst_wl.namespace,
            &dst_wl.service_account,
        )
        .map_err(|e| {
            fail(
                &record,
                "identity",
                "IDENTITY_ERROR",
                OutboundError::Identity(e.to_string()),
            )
        })?;
        // Every identity the verifier will accept; the pool key holds the same set.
        let mut accepted = vec![dst_id];
        accepted.extend(extra_sans.iter().filter_map(|s| s.parse::<SpiffeId>().ok()));
        let cert =
            match tokio::time::timeout(self.cfg.identity_timeout, self.identity.fetch(&src_id))
                .await
            {
                Ok(Ok(c)) => c,
                Ok(Err(e)) => {
                    return Err(fail(
                        &record,
                        "identity",
                        "IDENTITY_ERROR",
                        OutboundError::Identity(format!("{src_id}: {e}")),
                    ));
                }
                Err(_) => {
                    return Err(fail(
                        &record,
                        "identity",
                        "IDENTITY_ERROR",
                        OutboundError::Identity(format!("{src_id}: timed out")),
                    ));
                }
            };
        let src_ip = self.cfg.bind_source_ip.then_some(src.ip());
        let key = PoolKey::new(src_id, accepted, src_ip, hbone_addr);
        let expected = key.dst_ids.to_vec();
        // Through a network gateway both tunnels name the service by hostname and port (the endpoint's address
        // means nothing on this network); the inner one also says which network the client is on: this node's, as
        // ztunnel says it (`src/proxy/outbound.rs`, `origin_network`), else the source workload's.
        let origin_network = match self.cfg.network.as_str() {
            "" => src_wl.network.as_str(),
            n => n,
        };
        let inner = match (&resolved.network_gateway, &resolved.service) {
            (Some(_), Some(svc)) => Some(gateway::InnerTunnel::new(
                svc,
                gateway::inner_identities(
                    svc,
                    resolved.waypoint.as_ref(),
                    resolved.workload.as_deref(),
                ),
                origin_network,
                dst.port(),
                cert.clone(),
            )),
            _ => None,
        };
        // Early data only where the tunnel ends at the destination's node proxy (weft or ztunnel, both checked):
        // not through a waypoint or a network gateway, whose CONNECT handling was not.
        let direct =
            inner.is_none() && resolved.waypoint.is_none() && resolved.network_gateway.is_none();
        let mut early = client.filter(|_| direct).map(ClientEarly::new);
        let req = ConnectRequest {
            early_data: Bytes::new(),
            authority: inner
                .as_ref()
                .map_or_else(|| resolved.addr.to_string(), |i| i.authority.clone()),
            headers: headers::connect_headers(
                src,
                Some(&src_wl.meta),
                resolved.service.as_ref().map(|s| s.hostname.as_str()),
                &self.cfg.cluster_id,
            ),
        };
        let me = self.clone();
        let connect = || async move {
            let addr = hbone_addr;
            let tls_cfg = cert
                .client_config(expected)
                .map_err(|source| DialError::TlsConfig { addr, source })?;
            let work = async {
                let tcp = me
                    .dial(
                        addr,
                        src_ip.map_or(socket::Source::Any, socket::Source::Local),
                    )
                    .await
                    .map_err(|source| DialError::Tcp { addr, source })?;
                let name = rustls::pki_types::ServerName::IpAddress(addr.ip().into());
                let tls = weft_tls::connect_on(me.cfg.tls_record_layer, tls_cfg, name, tcp)
                    .await
                    .map_err(|source| DialError::Tls { addr, source })?;
                weft_hbone::handshake(tls, &me.cfg.h2)
                    .await
                    .map_err(|source| DialError::H2 { addr, source })
            };
            match tokio::time::timeout(me.cfg.connect_timeout, work).await {
                Ok(r) => r,
                Err(_) => Err(DialError::Timeout {
                    addr,
                    after: me.cfg.connect_timeout,
                }),
            }
        };
        let inner_headers = req.headers.clone();
        let tunnel = async {
            let (outer, _headers) = match early.as_mut() {
                Some(e) => self.pool().connect_with_early(key, req, e, connect).await?,
                None => self.pool().connect(key, req, connect).await?,
            };
            match inner {
                None => Ok(outer),
                Some(i) => {
                    let after = self.cfg.connect_timeout;
                    let open = i.open(
                        outer,
                        inner_headers,
                        hbone_addr,
                        &self.cfg.h2,
                        self.cfg.tls_record_layer,
                    );
                    match tokio::time::timeout(after, open).await {
                        Ok(r) => r,
                        Err(_) => Err(weft_hbone::Error::ConnectFailed(Arc::new(
                            DialError::Timeout {
                                addr: hbone_addr,
                                after,
                            },
                        ))),
                    }
                }
            }
        };
        let result = tunnel.await;
        let (early_sent, client_error) = early.map_or((0, None), ClientEarly::finish);
        if let Some(e) = client_error {
            // The stream (if any) is dropped: h2 resets it.
            return Err(fail(
                &record,
                "client",
                "DC",
                OutboundError::Client(e.to_string()),
            ));
        }
        match result {
            Ok(stream) => Ok(Established {
                record,
                early_sent,
                epoch,
                upstream: Upstream::Hbone(stream, hbone_addr),
            }),
            Err(weft_hbone::Error::Status(status)) if status == http::StatusCode::UNAUTHORIZED => {
                let (by, reason) = (
                    "destination".to_owned(),
                    format!("{hbone_addr} answered 401: denied by its policy"),
                );
                let v = Verdict::Deny {
                    by: by.clone(),
                    reason: reason.clone(),
                };
                self.failed(
                    &record,
                    Via::hbone(hbone_addr),
                    "denied",
                    v,
                    reason.clone(),
                    "DENY",
                );
                tracing::info!(conn = record.id, %src, %dst, %hbone_addr, "outbound connection denied by the destination's policy");
                Err(OutboundError::Denied { by, reason })
            }
            Err(e) => {
                let (kind, source) = classify(e);
                let e = OutboundError::Connect { kind, source };
                let msg = e.to_string();
                self.failed(
                    &record,
                    Via::hbone(hbone_addr),
                    "connect",
                    Verdict::Allow,
                    msg.clone(),
                    kind.response_flag(),
                );
                tracing::warn!(conn = record.id, %src, %dst, %hbone_addr, error = %msg, "outbound HBONE connection failed");
                Err(e)
            }
        }
    }

    /// Relay an established outbound connection to its end.
    pub(crate) fn run_outbound(
        self: &Arc<Self>,
        client: TcpStream,
        est: Established,
    ) -> impl Future<Output = ()> + Send + '_ {
        // Built here rather than in an `async fn` (which would hold `client` and `est` beside the connection's
        // future for its whole life): each arm's future owns what it needs, once.
        let (cr, cw) = client.into_split();
        let Established {
            record,
            epoch,
            early_sent,
            upstream,
        } = est;
        match upstream {
            Upstream::Hbone(stream, addr) => {
                let (ur, uw) = stream.into_split();
                Either::Left(self.run_after_early(
                    record,
                    epoch,
                    early_sent,
                    "hbone",
                    Via::hbone(addr),
                    Halves(cr, cw),
                    Halves(ur, uw),
                ))
            }
            Upstream::Tcp(s) => {
                let (ur, uw) = s.into_split();
                Either::Right(self.run(
                    record,
                    epoch,
                    "tcp",
                    Via::NONE,
                    Halves(cr, cw),
                    Halves(ur, uw),
                ))
            }
        }
    }

    /// A connection captured by iptables REDIRECT on the outbound port.
    ///
    /// A plain function around an `async move` block, not an `async fn` (which would hold its arguments twice for
    /// the connection's whole life).
    #[allow(clippy::manual_async_fn)] // an `async fn` would hold its arguments twice (see above)
    pub(crate) fn handle_captured(
        self: Arc<Self>,
        client: TcpStream,
        src: SocketAddr,
    ) -> impl Future<Output = ()> + Send {
        async move {
            let tproxy = self.tproxy_port(self.cfg.outbound_addr);
            let dst = match socket::captured_destination(&client, tproxy) {
                Ok(None) => {
                    self.metrics.fail("outbound", "self_call");
                    tracing::warn!(%src, "connection addressed to the capture port itself; closing");
                    return;
                }
                Ok(Some(d)) => d,
                Err(e) => {
                    self.metrics.fail("outbound", "no_original_dst");
                    tracing::warn!(%src, error = %e, "captured connection has no original destination; closing");
                    return;
                }
            };
            // Boxed: resolving, asking policy and connecting is on the heap only while it runs, so an established
            // connection's task holds the relay's state alone.
            let Ok(est) = Box::pin(self.establish_outbound(src, dst, Some(&client))).await else {
                return;
            };
            self.run_outbound(client, est).await;
        }
    }
}

/// Most bytes sent as early data, and most read at once.
const EARLY_DATA_MAX: usize = 64 * 1024;
const EARLY_READ: usize = 16 * 1024;

/// The captured client's socket as the source of a tunnel's early data: while the `CONNECT` waits for its response,
/// whatever the client sends (up to [`EARLY_DATA_MAX`]) goes behind it at once instead of one round trip later. A
/// client that speaks first (HTTP, TLS) usually has bytes on the way by then. A read error (the client reset) is
/// kept for [`ClientEarly::finish`]: the kernel reports it once, and a later read would find a clean end instead.
struct ClientEarly<'a> {
    client: &'a TcpStream,
    sent: usize,
    error: Option<std::io::Error>,
    done: bool,
}

impl<'a> ClientEarly<'a> {
    fn new(client: &'a TcpStream) -> Self {
        Self {
            client,
            sent: 0,
            error: None,
            done: false,
        }
    }

    /// Bytes sent early, and the client's read error if there was one.
    fn finish(self) -> (u64, Option<std::io::Error>) {
        (self.sent as u64, self.error)
    }
}

impl weft_hbone::EarlyData for ClientEarly<'_> {
    fn poll_early(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<Option<Bytes>> {
        use std::task::Poll;
        while !self.done {
            if let Err(e) = std::task::ready!(self.client.poll_read_ready(cx)) {
                self.error = Some(e);
                break;
            }
            let mut buf = BytesMut::with_capacity(EARLY_READ.min(EARLY_DATA_MAX - self.sent));
            match self.client.try_read_buf(&mut buf) {
                // The client half-closed: the relay will find the same end.
                Ok(0) => break,
                Ok(n) => {
                    self.sent += n;
                    self.done = self.sent >= EARLY_DATA_MAX;
                    return Poll::Ready(Some(buf.freeze()));
                }
                // A stale readiness: wait for the next.
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => {
                    self.error = Some(e);
                    break;
                }
            }
        }
        self.done = true;
        Poll::Ready(None)
    }
}

/// Display an error with its sources.
pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let t = c.to_string();
        if !s.contains(&t) {
            s.push_str(": ");
            s.push_str(&t);
        }
        cur = c.source();
    }
    s
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod waypoint_tests;
