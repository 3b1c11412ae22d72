//! What every connection does once it is established or has failed, whichever listener it came from: tracking,
//! hooks (open/close), metrics and the access log.

use std::net::SocketAddr;
use std::sync::Arc;

use weft_hooks::{CloseRecord, ConnectionRecord, Direction, Verdict};

use crate::Inner;
use crate::metrics::DirLabels;
use crate::relay::{Counters, RelayEnd, RelayRead, RelayWrite, relay};
use crate::tracker::ConnControl;

/// How the connection travels: `hbone`, `tcp` (plain to a non-mesh destination) or `plaintext` (inbound, no mTLS).
pub(crate) type Transport = &'static str;

/// Read and write halves of one side.
pub(crate) struct Halves<R, W>(pub R, pub W);

/// How a connection travelled, beyond its record, for the access log.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Via {
    /// The HBONE address: dialled (outbound) or accepted on (inbound).
    pub hbone_addr: Option<SocketAddr>,
    /// Inbound HBONE: the `for=` address of the peer's `forwarded` header, as the peer wrote it. Logged only;
    /// never used for policy or to look up the source workload (see `Inner::handle_hbone_stream`).
    pub forwarded_for: Option<SocketAddr>,
}

impl Via {
    /// No HBONE hop.
    pub const NONE: Via = Via {
        hbone_addr: None,
        forwarded_for: None,
    };

    /// An HBONE hop at `addr`.
    pub fn hbone(addr: SocketAddr) -> Via {
        Via {
            hbone_addr: Some(addr),
            forwarded_for: None,
        }
    }
}

impl Inner {
    fn labels(record: &ConnectionRecord, transport: Transport) -> DirLabels {
        DirLabels {
            direction: record.direction.as_str(),
            transport,
        }
    }

    /// Run an allowed, established connection to its end and report it.
    pub(crate) async fn run<SR, SW, DR, DW>(
        self: &Arc<Self>,
        record: Arc<ConnectionRecord>,
        transport: Transport,
        via: Via,
        src: Halves<SR, SW>,
        dst: Halves<DR, DW>,
    ) where
        SR: RelayRead,
        SW: RelayWrite,
        DR: RelayRead,
        DW: RelayWrite,
    {
        let ctl = Arc::new(ConnControl::default());
        let _guard = self.tracker.register(record.clone(), ctl.clone());
        let labels = Self::labels(&record, transport);
        self.metrics.opened.get_or_create(&labels).inc();
        let active = self.metrics.active.get_or_create(&labels).clone();
        active.inc();
        self.hooks.on_open(&record);
        tracing::debug!(conn = record.id, src = %record.src, dst = %record.dst, direction = record.direction.as_str(), transport, "connection established");
        let counters = Arc::new(Counters::default());
        let end = relay(
            src.0,
            src.1,
            dst.0,
            dst.1,
            counters.clone(),
            &ctl,
            self.cfg.idle_timeout,
        )
        .await;
        active.dec();
        let sent = counters.sent.load(std::sync::atomic::Ordering::Relaxed);
        let received = counters.received.load(std::sync::atomic::Ordering::Relaxed);
        self.metrics.closed.get_or_create(&labels).inc();
        self.metrics.sent_bytes.get_or_create(&labels).inc_by(sent);
        self.metrics
            .received_bytes
            .get_or_create(&labels)
            .inc_by(received);
        let (verdict, error, flags) = match (end, ctl.denied()) {
            (_, Some(v)) => {
                self.metrics.rechecks_closed.inc();
                let reason = match &v {
                    Verdict::Deny { by, reason } => {
                        format!("closed by policy re-check: {by}: {reason}")
                    }
                    Verdict::Allow => "closed by policy re-check".to_owned(),
                };
                (v, Some(reason), "DENY")
            }
            (RelayEnd::Done, None) => (Verdict::Allow, None, "-"),
            (RelayEnd::Error(e), None) => (Verdict::Allow, Some(e), "-"),
            (RelayEnd::Idle, None) => (Verdict::Allow, Some("idle timeout".to_owned()), "-"),
            (RelayEnd::Cancelled, None) => {
                (Verdict::Allow, Some("closed by drain".to_owned()), "-")
            }
        };
        let close = CloseRecord {
            bytes_sent: sent,
            bytes_received: received,
            duration: counters.elapsed(),
            verdict,
            error,
            response_flags: flags,
        };
        self.hooks.on_close(&record, &close);
        access_log(&record, via, &close);
    }

    /// Ask the policy plugins about an inbound connection; a denial is logged and reported here.
    pub(crate) fn authorize_inbound(&self, record: &ConnectionRecord, via: Via) -> Result<(), ()> {
        match self.hooks.authorize(record) {
            Verdict::Allow => Ok(()),
            v => {
                tracing::info!(conn = record.id, src = %record.src, dst = %record.dst, peer_identity = record.peer_identity.as_deref().unwrap_or(""), verdict = ?v, "connection denied by policy");
                self.failed(record, via, "denied", v.clone(), format!("{v:?}"), "DENY");
                Err(())
            }
        }
    }

    /// Connect to the local workload an inbound connection is for; a failure is logged and reported here.
    pub(crate) async fn connect_workload(
        &self,
        record: &ConnectionRecord,
        via: Via,
    ) -> Result<tokio::net::TcpStream, ()> {
        let dst = record.dst;
        let r = tokio::time::timeout(
            self.cfg.connect_timeout,
            crate::socket::connect(dst, self.cfg.mark, None),
        )
        .await;
        let error = match r {
            Ok(Ok(s)) => return Ok(s),
            Ok(Err(e)) => format!("connect to {dst}: {e}"),
            Err(_) => format!("connect to {dst}: timed out"),
        };
        tracing::warn!(conn = record.id, %dst, %error, "local workload did not accept the connection");
        self.failed(record, via, "connect", Verdict::Allow, error, "CONNECT");
        Err(())
    }

    /// Report a connection that never got established (denied, unroutable, upstream refused...).
    pub(crate) fn failed(
        &self,
        record: &ConnectionRecord,
        via: Via,
        reason: &'static str,
        verdict: Verdict,
        error: String,
        flags: &'static str,
    ) {
        self.metrics.fail(record.direction.as_str(), reason);
        let close = CloseRecord {
            bytes_sent: 0,
            bytes_received: 0,
            duration: std::time::Duration::ZERO,
            verdict,
            error: Some(error),
            response_flags: flags,
        };
        self.hooks.on_close(record, &close);
        access_log(record, via, &close);
    }
}

fn access_log(record: &ConnectionRecord, via: Via, close: &CloseRecord) {
    // The fields below allocate (identities, addresses): build them only when the line is written.
    if !tracing::enabled!(target: "access", tracing::Level::INFO) {
        return;
    }
    let (sw, sn) = record
        .src_workload
        .as_ref()
        .map(|w| (w.name.as_str(), w.namespace.as_str()))
        .unwrap_or(("", ""));
    let (dw, dn, di) = record
        .dst_workload
        .as_ref()
        .map(|w| (w.name.as_str(), w.namespace.as_str(), w.spiffe_id()))
        .unwrap_or(("", "", String::new()));
    // Outbound: the source identity is ours; inbound: the verified peer identity.
    let src_identity = record.peer_identity.as_deref().unwrap_or("");
    let direction = match record.direction {
        Direction::Outbound => "outbound",
        Direction::Inbound => "inbound",
    };
    tracing::info!(
        target: "access",
        conn = record.id,
        src.addr = %record.src,
        src.workload = sw,
        src.namespace = sn,
        src.identity = src_identity,
        dst.addr = %record.dst,
        dst.hbone_addr = via.hbone_addr.map(|a| a.to_string()).unwrap_or_default(),
        forwarded_for = via.forwarded_for.map(|a| a.to_string()).unwrap_or_default(),
        dst.service = record.dst_service.as_deref().unwrap_or(""),
        dst.workload = dw,
        dst.namespace = dn,
        dst.identity = di,
        direction,
        bytes_sent = close.bytes_sent,
        bytes_recv = close.bytes_received,
        duration = format!("{}ms", close.duration.as_millis()),
        error = close.error.as_deref().unwrap_or(""),
        "connection complete"
    );
}
