//! Live connection tracking: every connection is counted from the instant it is accepted (an [`AcceptGuard`] held
//! by its task), and registered with its record and a cancel handle once established, so a drain can wait for all
//! of them (established or still being set up) and a policy change can re-check the established ones and close
//! those now denied.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use weft_hooks::{ConnectionHooks, ConnectionRecord, Verdict};

/// Live connections re-checked per batch (see [`ConnTracker::recheck`]).
pub const RECHECK_BATCH: usize = 256;

/// Authorize one batch again (on a blocking thread); close the connections now denied.
fn recheck_batch(
    hooks: &dyn ConnectionHooks,
    batch: Vec<(Arc<ConnectionRecord>, Arc<ConnControl>)>,
) -> usize {
    let mut closed = 0;
    for (record, ctl) in batch {
        if ctl.is_cancelled() {
            continue;
        }
        if let v @ Verdict::Deny { .. } = hooks.authorize(&record) {
            tracing::info!(conn = record.id, src = %record.src, dst = %record.dst, verdict = ?v, "policy changed: closing connection now denied");
            ctl.deny(v);
            closed += 1;
        }
    }
    closed
}

/// Control shared between a connection's task and the tracker.
///
/// A flag and a [`tokio::sync::Notify`] held inline rather than a `CancellationToken`: a token allocates a tree node
/// of its own (about 128 bytes) beside this control, for every connection on both nodes, and a connection's cancel
/// never needs a parent or children.
#[derive(Debug, Default)]
pub struct ConnControl {
    cancelled: AtomicBool,
    wake: tokio::sync::Notify,
    reason: Mutex<Option<Verdict>>,
}

impl ConnControl {
    /// Close the connection: its relay (or setup) ends as cancelled. Idempotent.
    pub fn cancel(&self) {
        self.cancelled.store(true, Ordering::SeqCst);
        self.wake.notify_waiters();
    }

    /// Whether [`cancel`](Self::cancel) was called.
    pub fn is_cancelled(&self) -> bool {
        self.cancelled.load(Ordering::SeqCst)
    }

    /// Completes once the connection is cancelled (at once if it already is).
    pub async fn cancelled(&self) {
        loop {
            // Registered before the flag is read: `notify_waiters` wakes every `Notified` created before it, so a
            // cancel between the check and the await is not lost.
            let notified = self.wake.notified();
            if self.is_cancelled() {
                return;
            }
            notified.await;
        }
    }

    /// Close the connection because a re-check denied it.
    pub fn deny(&self, verdict: Verdict) {
        *self
            .reason
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(verdict);
        self.cancel();
    }

    /// The verdict that closed it, if a re-check did.
    pub fn denied(&self) -> Option<Verdict> {
        self.reason
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

struct Tracked {
    record: Arc<ConnectionRecord>,
    ctl: Arc<ConnControl>,
    /// Where it actually went, when not `record.dst` (see [`LiveConnection::actual_dst`]).
    actual_dst: Option<std::net::SocketAddr>,
}

/// A live connection, as `/config_dump` lists it.
#[derive(Debug, Clone)]
pub struct LiveConnection {
    /// Its record.
    pub record: Arc<ConnectionRecord>,
    /// Where it actually went: the HBONE address dialled (outbound through a tunnel) or the upstream peer (outbound
    /// plain TCP); `None` when that is `record.dst` (inbound: the local workload).
    pub actual_dst: Option<std::net::SocketAddr>,
}

/// All live connections of this node.
#[derive(Default)]
pub struct ConnTracker {
    next_id: AtomicU64,
    /// Bumped when a re-check starts (before its snapshot); see [`ConnTracker::policy_epoch`].
    policy_epoch: AtomicU64,
    live: Mutex<HashMap<u64, Tracked>>,
    /// Accepted connections (and dispatched inbound HBONE streams) whose task has not ended: counted from the
    /// instant `accept()` returned, through setup (policy, hooks, pool, upstream connect), to the end.
    accepted: AtomicUsize,
    /// Cancelled by [`ConnTracker::abandon`]: tasks still running under an [`AcceptGuard`] are dropped.
    abandoned: CancellationToken,
    changed: tokio::sync::Notify,
}

impl std::fmt::Debug for ConnTracker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnTracker")
            .field("live", &self.len())
            .field("accepted", &self.accepted_len())
            .finish()
    }
}

/// Removes the connection from the tracker when dropped.
pub struct TrackGuard {
    tracker: Arc<ConnTracker>,
    id: u64,
    /// The connection's control.
    pub ctl: Arc<ConnControl>,
}

impl Drop for TrackGuard {
    fn drop(&mut self) {
        self.tracker.lock().remove(&self.id);
        self.tracker.changed.notify_waiters();
    }
}

/// Counts one accepted connection (or inbound HBONE stream) from the instant it was accepted until its task ends,
/// however it ends: created in the accept loop before the connection's task is spawned and moved into it, so there
/// is no moment at which a drain could see the connection neither counted nor gone.
pub struct AcceptGuard {
    tracker: Arc<ConnTracker>,
}

impl std::fmt::Debug for AcceptGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AcceptGuard").finish_non_exhaustive()
    }
}

impl AcceptGuard {
    /// Run the connection's whole life (`conn`) while counted. It is dropped (closing its sockets) only when the
    /// tracker abandons what is left at the very end of a drain.
    pub fn serve<F: Future<Output = ()>>(self, conn: F) -> Serve<F, ()> {
        self.serve_holding(conn, ())
    }

    /// [`serve`](Self::serve), also keeping `hold` (a permit, a gauge guard) until the connection ends.
    pub fn serve_holding<F: Future<Output = ()>, H>(self, conn: F, hold: H) -> Serve<F, H> {
        Serve {
            conn,
            abandoned: self.tracker.abandoned.clone().cancelled_owned(),
            _guard: self,
            _hold: hold,
        }
    }
}

pin_project_lite::pin_project! {
    /// A connection's life while counted ([`AcceptGuard::serve`]). A future of its own rather than an `async fn`, so
    /// the connection's future is stored once, in place: an `async` wrapper keeps both the argument it was given
    /// and the moved copy it awaits, and every long-lived connection would pay for its future twice or more.
    pub struct Serve<F, H> {
        #[pin]
        conn: F,
        #[pin]
        abandoned: WaitForCancellationFutureOwned,
        // Dropped after the connection (fields drop in order): it is counted until its sockets are closed.
        _guard: AcceptGuard,
        _hold: H,
    }
}

impl<F: Future<Output = ()>, H> Future for Serve<F, H> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.project();
        // The connection first: a connection that ends as the drain gives up ends as itself.
        if this.conn.poll(cx).is_ready() {
            return Poll::Ready(());
        }
        if this.abandoned.poll(cx).is_ready() {
            tracing::debug!("connection abandoned at the end of the drain");
            return Poll::Ready(());
        }
        Poll::Pending
    }
}

impl Drop for AcceptGuard {
    fn drop(&mut self) {
        self.tracker.accepted.fetch_sub(1, Ordering::SeqCst);
        self.tracker.changed.notify_waiters();
    }
}

impl ConnTracker {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Tracked>> {
        self.live
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A fresh connection id.
    pub fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// The re-check epoch. Read it before authorizing a connection and compare after registering it: if it moved,
    /// a re-check may have taken its snapshot before the connection was registered, and the connection must be
    /// authorized again (see `Inner::run`).
    pub fn policy_epoch(&self) -> u64 {
        self.policy_epoch.load(Ordering::SeqCst)
    }

    /// Register an allowed, established connection.
    pub fn register(
        self: &Arc<Self>,
        record: Arc<ConnectionRecord>,
        ctl: Arc<ConnControl>,
    ) -> TrackGuard {
        self.register_to(record, ctl, None)
    }

    /// [`register`](Self::register), with where the connection actually went (see [`LiveConnection::actual_dst`]).
    pub fn register_to(
        self: &Arc<Self>,
        record: Arc<ConnectionRecord>,
        ctl: Arc<ConnControl>,
        actual_dst: Option<std::net::SocketAddr>,
    ) -> TrackGuard {
        let id = record.id;
        self.lock().insert(
            id,
            Tracked {
                record,
                ctl: ctl.clone(),
                actual_dst,
            },
        );
        TrackGuard {
            tracker: self.clone(),
            id,
            ctl,
        }
    }

    /// Count a connection just accepted; the guard goes with the connection's task (see [`AcceptGuard`]).
    pub fn accepted(self: &Arc<Self>) -> AcceptGuard {
        self.accepted.fetch_add(1, Ordering::SeqCst);
        AcceptGuard {
            tracker: self.clone(),
        }
    }

    /// The live (established, registered) connections, by id.
    pub fn live(&self) -> Vec<LiveConnection> {
        let mut out: Vec<LiveConnection> = self
            .lock()
            .values()
            .map(|t| LiveConnection {
                record: t.record.clone(),
                actual_dst: t.actual_dst,
            })
            .collect();
        out.sort_by_key(|c| c.record.id);
        out
    }

    /// Number of live (established, registered) connections.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Number of accepted connections and inbound HBONE streams whose task has not ended (established or not).
    pub fn accepted_len(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }

    /// Whether no connection is live (established).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether nothing is left at all: no established connection, and no accepted one still being set up.
    pub fn is_idle(&self) -> bool {
        self.accepted_len() == 0 && self.is_empty()
    }

    /// Ask every live connection's policy again; close those now denied. Returns how many were closed.
    ///
    /// Policy calls are synchronous (a plugin runs to completion), so they never run on the calling task: the live
    /// connections are snapshotted and checked in batches of [`RECHECK_BATCH`], each on a blocking-pool thread,
    /// one batch at a time. The data-path workers stay free, and a re-check of many connections competes with
    /// connection tasks for at most one thread. A connection that ended meanwhile is skipped.
    pub async fn recheck(&self, hooks: Arc<dyn ConnectionHooks>) -> usize {
        self.policy_epoch.fetch_add(1, Ordering::SeqCst);
        let snapshot: Vec<(Arc<ConnectionRecord>, Arc<ConnControl>)> = self
            .lock()
            .values()
            .map(|t| (t.record.clone(), t.ctl.clone()))
            .collect();
        let mut closed = 0;
        let mut rest = snapshot.into_iter();
        loop {
            let batch: Vec<_> = rest.by_ref().take(RECHECK_BATCH).collect();
            if batch.is_empty() {
                return closed;
            }
            let hooks = hooks.clone();
            match tokio::task::spawn_blocking(move || recheck_batch(hooks.as_ref(), batch)).await {
                Ok(n) => closed += n,
                Err(e) => {
                    tracing::error!(error = %e, "policy re-check batch failed; its connections keep their verdict");
                }
            }
        }
    }

    /// Close every live connection (end of a drain): each relay ends and reports its close.
    pub fn close_all(&self) {
        for t in self.lock().values() {
            t.ctl.cancel();
        }
    }

    /// Drop every task still running under an [`AcceptGuard`] (the very end of a drain, after
    /// [`ConnTracker::close_all`]): connections stuck in setup past the deadline are closed.
    pub fn abandon(&self) {
        self.abandoned.cancel();
    }

    /// Wait until nothing is left (see [`ConnTracker::is_idle`]).
    pub async fn wait_idle(&self) {
        loop {
            let notified = self.changed.notified();
            if self.is_idle() {
                return;
            }
            notified.await;
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test code: a panic fails the test

    use std::sync::atomic::AtomicUsize;
    use std::time::Duration;

    use weft_hooks::CloseRecord;

    use super::*;

    /// Denies even connection ids; the first call waits (on its thread) until the test lets it go, so the test
    /// can tell whether the re-check left the runtime's thread free meanwhile.
    struct Gate {
        calls: AtomicUsize,
        release: Mutex<Option<std::sync::mpsc::Receiver<()>>>,
        waited_in_vain: std::sync::atomic::AtomicBool,
        on_runtime_thread: std::sync::atomic::AtomicBool,
        runtime_thread: std::thread::ThreadId,
    }

    impl ConnectionHooks for Gate {
        fn authorize(&self, conn: &ConnectionRecord) -> Verdict {
            if std::thread::current().id() == self.runtime_thread {
                self.on_runtime_thread.store(true, Ordering::SeqCst);
            }
            if self.calls.fetch_add(1, Ordering::SeqCst) == 0 {
                let rx = self.release.lock().unwrap().take().unwrap();
                // Only a broken test (the re-check holding the runtime's only thread) waits this long.
                if rx.recv_timeout(Duration::from_secs(20)).is_err() {
                    self.waited_in_vain.store(true, Ordering::SeqCst);
                }
            }
            if conn.id.is_multiple_of(2) {
                Verdict::Deny {
                    by: "test".into(),
                    reason: "even".into(),
                }
            } else {
                Verdict::Allow
            }
        }
        fn on_open(&self, _: &Arc<ConnectionRecord>) {}
        fn on_close(&self, _: &Arc<ConnectionRecord>, _: &CloseRecord) {}
        fn policy_changes(&self) -> tokio::sync::watch::Receiver<u64> {
            tokio::sync::watch::channel(0).1
        }
    }

    /// Many live connections: the re-check closes exactly those now denied, with the verdict, and runs its
    /// policy calls off the calling runtime's thread (a current-thread runtime here: had the re-check been one
    /// synchronous loop, the test task could not have released the gate before the whole loop was done).
    #[tokio::test]
    async fn recheck_closes_denied_connections_off_the_runtime_thread() {
        const N: u64 = 10_000;
        let tracker = Arc::new(ConnTracker::default());
        let guards: Vec<TrackGuard> = (1..=N)
            .map(|id| {
                tracker.register(
                    crate::testkit::record(id, true),
                    Arc::new(ConnControl::default()),
                )
            })
            .collect();
        let (tx, rx) = std::sync::mpsc::channel();
        let gate = Arc::new(Gate {
            calls: AtomicUsize::new(0),
            release: Mutex::new(Some(rx)),
            waited_in_vain: false.into(),
            on_runtime_thread: false.into(),
            runtime_thread: std::thread::current().id(),
        });
        let t = tracker.clone();
        let hooks: Arc<dyn ConnectionHooks> = gate.clone();
        let recheck = tokio::spawn(async move { t.recheck(hooks).await });
        // The re-check has started (its first policy call is waiting) and this task still runs.
        while gate.calls.load(Ordering::SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
        // (Fails only if the gate gave up waiting: the assertion below says so.)
        let _ = tx.send(());
        let closed = recheck.await.unwrap();

        assert!(
            !gate.waited_in_vain.load(Ordering::SeqCst),
            "the re-check held the runtime's thread: the test task could not run until it was done"
        );
        assert!(
            !gate.on_runtime_thread.load(Ordering::SeqCst),
            "a policy call ran on the runtime's thread"
        );
        assert_eq!(closed, usize::try_from(N / 2).unwrap());
        assert_eq!(
            gate.calls.load(Ordering::SeqCst),
            usize::try_from(N).unwrap()
        );
        for g in &guards {
            let denied = g.ctl.denied();
            if g.id.is_multiple_of(2) {
                assert!(g.ctl.is_cancelled());
                assert!(matches!(denied, Some(Verdict::Deny { by, .. }) if by == "test"));
            } else {
                assert!(!g.ctl.is_cancelled());
                assert_eq!(denied, None);
            }
        }
        // A second pass skips the connections already closed.
        let before = gate.calls.load(Ordering::SeqCst);
        let hooks: Arc<dyn ConnectionHooks> = gate.clone();
        assert_eq!(tracker.recheck(hooks).await, 0);
        assert_eq!(
            gate.calls.load(Ordering::SeqCst) - before,
            usize::try_from(N / 2).unwrap()
        );
        drop(guards);
        assert!(tracker.is_empty());
    }

    /// Serving a connection stores its future once: what a long-lived connection's task holds is its own state,
    /// not two or three copies of it (as an `async` wrapper would keep).
    #[test]
    fn serving_stores_the_connection_future_once() {
        let tracker = Arc::new(ConnTracker::default());
        let conn = async {
            let state = [1u8; 4096];
            tokio::task::yield_now().await;
            std::hint::black_box(state);
        };
        let alone = std::mem::size_of_val(&conn);
        let served = tracker.accepted().serve_holding(conn, ());
        let size = std::mem::size_of_val(&served);
        assert!(
            size < alone + 256,
            "serving a {alone}-byte connection future takes {size} bytes"
        );
    }

    /// An accepted connection not established yet keeps `wait_idle` waiting; `abandon` drops its task.
    #[tokio::test]
    async fn accepted_connections_count_until_their_task_ends() {
        let tracker = Arc::new(ConnTracker::default());
        let guard = tracker.accepted();
        assert!(tracker.is_empty() && !tracker.is_idle());
        assert_eq!(tracker.accepted_len(), 1);
        let t = tracker.clone();
        let waiter = tokio::spawn(async move { t.wait_idle().await });
        let (_hold, setup) = tokio::sync::oneshot::channel::<()>();
        let conn = tokio::spawn(guard.serve(async move {
            let _ = setup.await;
        }));
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished() && !conn.is_finished());
        tracker.close_all();
        tokio::task::yield_now().await;
        assert!(
            !conn.is_finished(),
            "close_all ends established connections only"
        );
        tracker.abandon();
        conn.await.unwrap();
        waiter.await.unwrap();
        assert!(tracker.is_idle());
    }

    #[tokio::test]
    async fn wait_idle_returns_when_the_last_connection_ends() {
        let tracker = Arc::new(ConnTracker::default());
        let g1 = tracker.register(
            crate::testkit::record(1, true),
            Arc::new(ConnControl::default()),
        );
        let g2 = tracker.register(
            crate::testkit::record(2, true),
            Arc::new(ConnControl::default()),
        );
        let t = tracker.clone();
        let waiter = tokio::spawn(async move { t.wait_idle().await });
        drop(g1);
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        tracker.close_all();
        assert!(g2.ctl.is_cancelled());
        drop(g2);
        waiter.await.unwrap();
    }

    /// A cancel wakes every task waiting on it, and one that starts waiting afterwards returns at once.
    #[tokio::test]
    async fn cancel_wakes_waiters_and_later_waits_return_at_once() {
        let ctl = Arc::new(ConnControl::default());
        let waiters: Vec<_> = (0..3)
            .map(|_| {
                let ctl = ctl.clone();
                tokio::spawn(async move { ctl.cancelled().await })
            })
            .collect();
        tokio::task::yield_now().await;
        assert!(waiters.iter().all(|w| !w.is_finished()));
        assert!(!ctl.is_cancelled());
        ctl.cancel();
        for w in waiters {
            w.await.unwrap();
        }
        assert!(ctl.is_cancelled());
        ctl.cancelled().await;
        ctl.cancel();
        ctl.cancelled().await;
    }
}
