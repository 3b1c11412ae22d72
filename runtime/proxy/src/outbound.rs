//! Outbound: a local workload's connection (captured on 15001, or asked for over SOCKS5) is resolved against the
//! state, checked by egress policy, and sent over a pooled HBONE tunnel (mesh destinations) or plain TCP.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpStream;
use weft_hbone::{ConnectRequest, H2Stream};
use weft_hooks::{ConnectionRecord, Direction, Verdict};
use weft_identity::SpiffeId;
use weft_state::{Resolved, TunnelProtocol};

use crate::conn::Halves;
use crate::{Inner, headers, socket};

/// Pool key: one HTTP/2 connection serves one (source identity, destination identity, source IP, destination).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PoolKey {
    /// Source workload identity.
    pub src_id: SpiffeId,
    /// Expected destination identity.
    pub dst_id: SpiffeId,
    /// Source IP the connection is bound to (if any).
    pub src_ip: Option<std::net::IpAddr>,
    /// HBONE address dialled.
    pub dst: SocketAddr,
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
    /// Connecting (TCP, TLS, HTTP/2 or CONNECT) failed.
    #[error("upstream connect failed: {0}")]
    Connect(String),
}

/// The upstream side of an established outbound connection.
pub(crate) enum Upstream {
    Hbone(H2Stream, SocketAddr),
    Tcp(TcpStream),
}

pub(crate) struct Established {
    pub record: Arc<ConnectionRecord>,
    pub upstream: Upstream,
}

impl Inner {
    /// Resolve, authorize and connect; reports failures itself.
    pub(crate) async fn establish_outbound(
        self: &Arc<Self>,
        src: SocketAddr,
        dst: SocketAddr,
    ) -> Result<Established, OutboundError> {
        let state = self.state.current();
        let src_wl = state
            .workload_by_ip(src.ip())
            .filter(|w| w.node == self.cfg.node)
            .cloned();
        let mut record = ConnectionRecord {
            id: self.tracker.next_id(),
            direction: Direction::Outbound,
            src,
            dst,
            peer_identity: src_wl.as_ref().map(|w| w.spiffe_id()),
            src_workload: src_wl.as_ref().map(|w| w.meta.clone()),
            dst_workload: None,
            dst_service: None,
            hbone: false,
        };
        let fail = |record: &ConnectionRecord, reason, flags, e: OutboundError| {
            let verdict = match &e {
                OutboundError::Denied { by, reason } => Verdict::Deny {
                    by: by.clone(),
                    reason: reason.clone(),
                },
                _ => Verdict::Allow,
            };
            tracing::warn!(conn = record.id, %src, %dst, error = %e, "outbound connection failed");
            self.failed(record, None, reason, verdict, e.to_string(), flags);
            e
        };
        if crate::config::RESERVED_PORTS.contains(&dst.port())
            && state.workload_by_ip(dst.ip()).is_some()
        {
            return Err(fail(
                &record,
                "self_call",
                "-",
                OutboundError::Unroutable(format!("{dst} is a weft port")),
            ));
        }
        let resolved: Resolved = match state.resolve(dst) {
            Ok(r) => r,
            Err(e) => {
                return Err(fail(
                    &record,
                    "unknown_destination",
                    "-",
                    OutboundError::Unroutable(e.to_string()),
                ));
            }
        };
        record.dst_workload = resolved.workload.as_ref().map(|w| w.meta.clone());
        record.dst_service = resolved.service.as_ref().map(|s| s.key());
        record.hbone = resolved.is_hbone();
        if let v @ Verdict::Deny { .. } = self.hooks.authorize(&record) {
            let Verdict::Deny { by, reason } = v else {
                unreachable!()
            };
            return Err(fail(
                &record,
                "denied",
                "DENY",
                OutboundError::Denied { by, reason },
            ));
        }
        let record = Arc::new(record);
        let dst_wl = match (&resolved.workload, record.hbone) {
            (Some(w), true) if w.protocol == TunnelProtocol::Hbone => w.clone(),
            _ => {
                // Plain TCP: a TCP workload, or a destination outside the mesh.
                let bind = src_wl
                    .as_ref()
                    .filter(|_| self.cfg.bind_source_ip)
                    .map(|_| src.ip());
                let conn = tokio::time::timeout(
                    self.cfg.connect_timeout,
                    socket::connect(resolved.addr, self.cfg.mark, bind),
                )
                .await
                .map_err(|_| "timed out".to_owned())
                .and_then(|r| r.map_err(|e| e.to_string()));
                return match conn {
                    Ok(s) => Ok(Established {
                        record,
                        upstream: Upstream::Tcp(s),
                    }),
                    Err(e) => Err(fail(
                        &record,
                        "connect",
                        "CONNECT",
                        OutboundError::Connect(format!("{}: {e}", resolved.addr)),
                    )),
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
        let mut expected = vec![dst_id.clone()];
        if let Some(svc) = &resolved.service {
            expected.extend(
                svc.subject_alt_names
                    .iter()
                    .filter_map(|s| s.parse::<SpiffeId>().ok()),
            );
        }
        let hbone_addr = SocketAddr::new(resolved.addr.ip(), self.cfg.hbone_port);
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
        let key = PoolKey {
            src_id,
            dst_id,
            src_ip,
            dst: hbone_addr,
        };
        let req = ConnectRequest {
            authority: resolved.addr.to_string(),
            headers: headers::connect_headers(
                src,
                Some(&src_wl.meta),
                resolved.service.as_ref().map(|s| s.hostname.as_str()),
                &self.cfg.cluster_id,
            ),
        };
        let me = self.clone();
        let connect = || async move {
            let tls_cfg = cert.client_config(expected).map_err(|e| e.to_string())?;
            let work = async {
                let tcp = socket::connect(hbone_addr, me.cfg.mark, src_ip)
                    .await
                    .map_err(|e| format!("tcp connect to {hbone_addr}: {e}"))?;
                let name = rustls::pki_types::ServerName::IpAddress(hbone_addr.ip().into());
                let tls = tokio_rustls::TlsConnector::from(tls_cfg)
                    .connect(name, tcp)
                    .await
                    .map_err(|e| format!("TLS handshake with {hbone_addr}: {e}"))?;
                weft_hbone::handshake(tls, &me.cfg.h2)
                    .await
                    .map_err(|e| format!("HTTP/2 handshake with {hbone_addr}: {e}"))
            };
            match tokio::time::timeout(me.cfg.connect_timeout, work).await {
                Ok(r) => r,
                Err(_) => Err(format!("connecting to {hbone_addr} timed out")),
            }
        };
        match self.pool.connect(key, req, connect).await {
            Ok((stream, _headers)) => Ok(Established {
                record,
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
                    Some(hbone_addr),
                    "denied",
                    v,
                    reason.clone(),
                    "DENY",
                );
                tracing::info!(conn = record.id, %src, %dst, %hbone_addr, "outbound connection denied by the destination's policy");
                Err(OutboundError::Denied { by, reason })
            }
            Err(e) => {
                let msg = error_chain(&e);
                let flags = if msg.contains("TLS") {
                    "TLS_FAILURE"
                } else {
                    "CONNECT"
                };
                self.failed(
                    &record,
                    Some(hbone_addr),
                    "connect",
                    Verdict::Allow,
                    msg.clone(),
                    flags,
                );
                tracing::warn!(conn = record.id, %src, %dst, %hbone_addr, error = %msg, "outbound HBONE connection failed");
                Err(OutboundError::Connect(msg))
            }
        }
    }

    /// Relay an established outbound connection to its end.
    pub(crate) async fn run_outbound(self: &Arc<Self>, client: TcpStream, est: Established) {
        let (cr, cw) = client.into_split();
        match est.upstream {
            Upstream::Hbone(stream, addr) => {
                let (ur, uw) = stream.into_split();
                self.run(
                    est.record,
                    "hbone",
                    Some(addr),
                    Halves(cr, cw),
                    Halves(ur, uw),
                )
                .await;
            }
            Upstream::Tcp(s) => {
                let (ur, uw) = s.into_split();
                self.run(est.record, "tcp", None, Halves(cr, cw), Halves(ur, uw))
                    .await;
            }
        }
    }

    /// A connection captured by iptables REDIRECT on the outbound port.
    pub(crate) async fn handle_captured(self: Arc<Self>, client: TcpStream, src: SocketAddr) {
        let dst = match client
            .local_addr()
            .map(socket::canonical)
            .and_then(|local| Ok((socket::original_dst(&client, local)?, local)))
        {
            Ok((d, local)) if d == local => {
                self.metrics.fail("outbound", "self_call");
                tracing::warn!(%src, dst = %d, "connection addressed to the capture port itself; closing");
                return;
            }
            Ok((d, _)) => d,
            Err(e) => {
                self.metrics.fail("outbound", "no_original_dst");
                tracing::warn!(%src, error = %e, "captured connection has no original destination; closing");
                return;
            }
        };
        if let Ok(est) = self.establish_outbound(src, dst).await {
            self.run_outbound(client, est).await;
        }
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
