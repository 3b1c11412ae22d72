//! Live connection tracking: every connection is registered with its record and a cancel handle, so a drain can
//! wait for them and a policy change can re-check them and close the ones now denied.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio_util::sync::CancellationToken;
use weft_hooks::{ConnectionHooks, ConnectionRecord, Verdict};

/// Control shared between a connection's task and the tracker.
#[derive(Debug, Default)]
pub struct ConnControl {
    /// Cancelled to close the connection.
    pub cancel: CancellationToken,
    reason: Mutex<Option<Verdict>>,
}

impl ConnControl {
    /// Close the connection because a re-check denied it.
    pub fn deny(&self, verdict: Verdict) {
        *self
            .reason
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(verdict);
        self.cancel.cancel();
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
}

/// All live connections of this node.
#[derive(Default)]
pub struct ConnTracker {
    next_id: AtomicU64,
    live: Mutex<HashMap<u64, Tracked>>,
    changed: tokio::sync::Notify,
}

impl std::fmt::Debug for ConnTracker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnTracker")
            .field("live", &self.len())
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

    /// Register an allowed, established connection.
    pub fn register(
        self: &Arc<Self>,
        record: Arc<ConnectionRecord>,
        ctl: Arc<ConnControl>,
    ) -> TrackGuard {
        let id = record.id;
        self.lock().insert(
            id,
            Tracked {
                record,
                ctl: ctl.clone(),
            },
        );
        TrackGuard {
            tracker: self.clone(),
            id,
            ctl,
        }
    }

    /// Number of live connections.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no connection is live.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Ask every live connection's policy again; close those now denied. Returns how many were closed.
    pub fn recheck(&self, hooks: &dyn ConnectionHooks) -> usize {
        let snapshot: Vec<(Arc<ConnectionRecord>, Arc<ConnControl>)> = self
            .lock()
            .values()
            .map(|t| (t.record.clone(), t.ctl.clone()))
            .collect();
        let mut closed = 0;
        for (record, ctl) in snapshot {
            if let v @ Verdict::Deny { .. } = hooks.authorize(&record) {
                tracing::info!(conn = record.id, src = %record.src, dst = %record.dst, verdict = ?v, "policy changed: closing connection now denied");
                ctl.deny(v);
                closed += 1;
            }
        }
        closed
    }

    /// Close every live connection (end of a drain).
    pub fn close_all(&self) {
        for t in self.lock().values() {
            t.ctl.cancel.cancel();
        }
    }

    /// Wait until no connection is live.
    pub async fn wait_empty(&self) {
        loop {
            let notified = self.changed.notified();
            if self.is_empty() {
                return;
            }
            notified.await;
        }
    }
}
