//! What every connection does once it is established or has failed, whichever listener it came from: tracking,
//! hooks (open/close), metrics and the access log.

use std::future::Future;
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
    ///
    /// `epoch` is the tracker's policy epoch read before the connection was authorized: if a re-check started
    /// since, it may have missed this connection (not registered yet), so it is authorized again here.
    ///
    /// Like [`run_after_early`](Self::run_after_early), this returns the connection's future rather than being an
    /// `async fn`: an `async fn` holds its arguments twice in its state, which lives as long as the connection.
    pub(crate) fn run<'a, SR, SW, DR, DW>(
        self: &'a Arc<Self>,
        record: Arc<ConnectionRecord>,
        epoch: u64,
        transport: Transport,
        via: Via,
        src: Halves<SR, SW>,
        dst: Halves<DR, DW>,
    ) -> impl Future<Output = ()> + Send + 'a
    where
        SR: RelayRead + 'a,
        SW: RelayWrite + 'a,
        DR: RelayRead + 'a,
        DW: RelayWrite + 'a,
    {
        self.run_after_early(record, epoch, 0, transport, via, src, dst)
    }

    /// [`run`](Self::run) for a connection whose first `early_sent` source bytes went upstream before it was
    /// established (early data behind an HBONE `CONNECT`): they count as sent.
    #[allow(clippy::too_many_arguments)] // `run`'s, plus the early bytes
    #[allow(clippy::manual_async_fn)] // an `async fn` would hold its arguments twice (see above)
    pub(crate) fn run_after_early<'a, SR, SW, DR, DW>(
        self: &'a Arc<Self>,
        record: Arc<ConnectionRecord>,
        epoch: u64,
        early_sent: u64,
        transport: Transport,
        via: Via,
        src: Halves<SR, SW>,
        dst: Halves<DR, DW>,
    ) -> impl Future<Output = ()> + Send + 'a
    where
        SR: RelayRead + 'a,
        SW: RelayWrite + 'a,
        DR: RelayRead + 'a,
        DW: RelayWrite + 'a,
    {
        async move {
            let ctl = Arc::new(ConnControl::default());
            // Where an outbound connection actually went: the HBONE address it dialled (inbound: the workload).
            let actual_dst = match record.direction {
                Direction::Outbound => via.hbone_addr,
                Direction::Inbound => None,
            };
            let _guard = self
                .tracker
                .register_to(record.clone(), ctl.clone(), actual_dst);
            if self.tracker.policy_epoch() != epoch
                && let v @ Verdict::Deny { .. } = self.hooks.authorize(&record)
            {
                tracing::info!(conn = record.id, verdict = ?v, "policy changed while connecting: closing connection now denied");
                ctl.deny(v);
            }
            let labels = Self::labels(&record, transport);
            self.metrics.opened.get_or_create(&labels).inc();
            let active = self.metrics.active.get_or_create(&labels).clone();
            active.inc();
            self.hooks.on_open(&record);
            tracing::debug!(conn = record.id, src = %record.src, dst = %record.dst, direction = record.direction.as_str(), transport, "connection established");
            // Held in the connection's future, not allocated beside it: only the relay reads it while it runs.
            let counters = Counters::default();
            counters
                .sent
                .store(early_sent, std::sync::atomic::Ordering::Relaxed);
            let end = relay(
                src.0,
                src.1,
                dst.0,
                dst.1,
                &counters,
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
    }

    /// Ask the policy plugins about an inbound connection; a denial is logged and reported here.
    /// Allowed: the tracker's policy epoch read before asking (for [`Inner::run`]).
    pub(crate) fn authorize_inbound(
        &self,
        record: &Arc<ConnectionRecord>,
        via: Via,
    ) -> Result<u64, ()> {
        let epoch = self.tracker.policy_epoch();
        match self.hooks.authorize(record) {
            Verdict::Allow => Ok(epoch),
            v => {
                tracing::info!(conn = record.id, src = %record.src, dst = %record.dst, peer_identity = record.peer_identity.as_deref().unwrap_or(""), verdict = ?v, "connection denied by policy");
                self.failed(record, via, "denied", v.clone(), format!("{v:?}"), "DENY");
                Err(())
            }
        }
    }

    /// Connect to the local workload an inbound connection is for, at `dst` (from `bind` when given); a failure is
    /// logged and reported here.
    pub(crate) async fn connect_workload(
        &self,
        record: &Arc<ConnectionRecord>,
        via: Via,
        dst: SocketAddr,
        src: crate::socket::Source,
    ) -> Result<tokio::net::TcpStream, ()> {
        let r = tokio::time::timeout(self.cfg.connect_timeout, self.dial(dst, src)).await;
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
        record: &Arc<ConnectionRecord>,
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

/// The connection's access log line, written as ztunnel writes its own (`src/proxy/metrics.rs`, `access_log!` in
/// `ConnectionResult::record_internal`, github.com/istio/ztunnel at 62d826530e5ce85764e309170205b293efcbc80b):
/// target `access`, no parent span, "connection complete"; ztunnel's field names, addresses as text, byte counts
/// as numbers, `duration` as whole milliseconds with the unit (`12ms`); a field weft does not know is left out;
/// identities only for a connection over mutual TLS (as ztunnel filters them); error level when the connection
/// failed, was denied or ended on an error, info otherwise. weft adds `conn` and, inbound, `forwarded_for`.
fn access_log(record: &ConnectionRecord, via: Via, close: &CloseRecord) {
    if !tracing::enabled!(target: "access", tracing::Level::ERROR) {
        return;
    }
    let src = record.src_workload.as_deref();
    let dst = record.dst_workload.as_deref();
    let (src_workload, src_namespace, src_cluster) = workload_fields(src);
    let (dst_workload, dst_namespace, dst_cluster) = workload_fields(dst);
    // Outbound: the source identity is ours; inbound: the verified peer identity. Only over mutual TLS.
    let src_identity = record.peer_identity.as_deref().filter(|_| record.hbone);
    let dst_identity = dst
        .filter(|_| record.hbone)
        .map(|w| tracing::field::display(DstIdentity(w)));
    let direction = match record.direction {
        Direction::Outbound => "outbound",
        Direction::Inbound => "inbound",
    };
    let error = close.error.as_deref();
    // Every field is borrowed or written straight into the line: nothing is allocated for it.
    macro_rules! access {
        ($level:expr) => {
            tracing::event!(
                target: "access",
                parent: None,
                $level,
                conn = record.id,
                src.addr = %record.src,
                src.workload = src_workload,
                src.namespace = src_namespace,
                src.identity = src_identity,
                src.cluster = src_cluster,
                dst.addr = %record.dst,
                dst.hbone_addr = via.hbone_addr.map(tracing::field::display),
                forwarded_for = via.forwarded_for.map(tracing::field::display),
                dst.service = record.dst_service.as_deref(),
                dst.workload = dst_workload,
                dst.namespace = dst_namespace,
                dst.identity = dst_identity,
                dst.cluster = dst_cluster,
                direction,
                bytes_sent = close.bytes_sent,
                bytes_recv = close.bytes_received,
                duration = %Millis(close.duration),
                error,
                "connection complete"
            )
        };
    }
    if error.is_some() {
        access!(tracing::Level::ERROR);
    } else {
        access!(tracing::Level::INFO);
    }
}

/// A known workload's name, namespace and cluster (left out when empty) for the access log.
fn workload_fields(
    w: Option<&weft_hooks::WorkloadMeta>,
) -> (Option<&str>, Option<&str>, Option<&str>) {
    match w {
        Some(w) => (
            Some(w.name.as_str()),
            Some(w.namespace.as_str()),
            Some(w.cluster_id.as_str()).filter(|c| !c.is_empty()),
        ),
        None => (None, None, None),
    }
}

/// The destination workload's SPIFFE identity: the one the state formed, or formed here for metadata built
/// without it.
struct DstIdentity<'a>(&'a weft_hooks::WorkloadMeta);

impl std::fmt::Display for DstIdentity<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let w = self.0;
        if w.identity.is_empty() {
            write!(
                f,
                "spiffe://{}/ns/{}/sa/{}",
                w.trust_domain, w.namespace, w.service_account
            )
        } else {
            f.write_str(&w.identity)
        }
    }
}

/// A duration in whole milliseconds, with its unit (`12ms`), as ztunnel writes `duration`.
struct Millis(std::time::Duration);

impl std::fmt::Display for Millis {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}ms", self.0.as_millis())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test code: a panic fails the test

    use std::time::Duration;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use weft_hooks::ConnectionHooks;

    use super::*;
    use crate::testkit::{self, Recorder};

    /// Run one connection whose policy was asked at `epoch` while the policy now denies everything; returns the
    /// response flag it closed with. The peers close their ends if the connection is still up after a round trip.
    async fn run_one(inner: &Arc<Inner>, hooks: &Recorder, epoch: u64) -> &'static str {
        let (mut client, src) = testkit::tcp_pair().await;
        let (mut server, dst) = testkit::tcp_pair().await;
        let me = inner.clone();
        let task = tokio::spawn(async move {
            let (sr, sw) = src.into_split();
            let (dr, dw) = dst.into_split();
            me.run(
                testkit::record(me.tracker.next_id(), false),
                epoch,
                "plaintext",
                Via::NONE,
                Halves(sr, sw),
                Halves(dr, dw),
            )
            .await;
        });
        // Either the connection is closed at once (nothing comes back), or it relays: then both peers close.
        let _ = client.write_all(b"x").await;
        let mut one = [0u8; 1];
        if server.read_exact(&mut one).await.is_ok() {
            drop(server);
            drop(client);
        }
        tokio::time::timeout(Duration::from_secs(30), task)
            .await
            .expect("the connection did not end")
            .unwrap();
        hooks.closes().pop().unwrap().1.response_flags
    }

    /// A connection authorized before a policy change, and registered only after the re-check took its snapshot,
    /// is authorized again when it registers (the re-check could not see it); one authorized after no re-check is
    /// not asked again.
    #[tokio::test]
    async fn a_connection_the_recheck_could_not_see_is_checked_when_it_registers() {
        let hooks = Arc::new(Recorder::default());
        let inner = testkit::inner(
            testkit::config("node-a", 15008),
            testkit::state("workloads: []\n"),
            testkit::identity(),
            hooks.clone(),
        );
        // Authorized (allowed) at this epoch...
        let epoch = inner.tracker.policy_epoch();
        // ... then the policy changes and the re-check runs before the connection is registered.
        hooks.deny_when(|_| true);
        let as_hooks: Arc<dyn ConnectionHooks> = hooks.clone();
        assert_eq!(inner.tracker.recheck(as_hooks).await, 0);
        assert_eq!(run_one(&inner, &hooks, epoch).await, "DENY");
        // Authorized after the re-check: not asked again (the hooks would deny it, the relay runs).
        let now = inner.tracker.policy_epoch();
        assert_eq!(run_one(&inner, &hooks, now).await, "-");
    }
}
