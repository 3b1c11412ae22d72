//! Per-connection stream accounting: `StreamCounter` and the `StreamDropGuard` each stream holds.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::time::Instant;

/// Counts the open streams of one connection and remembers when that number last changed.
///
/// Time is tokio's ([`tokio::time::Instant`]), so a paused test clock drives idleness.
///
/// Every stream a [`crate::H2Client`] opens holds a [`StreamDropGuard`] from this counter until
/// both halves of its [`H2Stream`](crate::H2Stream) are dropped; the pool uses it to enforce its per-connection
/// stream limit and to find idle connections.
#[derive(Debug)]
pub struct StreamCounter {
    active: AtomicUsize,
    /// When the counter was made; `last_change_ms` counts from here.
    base: Instant,
    last_change_ms: AtomicU64,
}

impl Default for StreamCounter {
    fn default() -> Self {
        Self::new()
    }
}

impl StreamCounter {
    /// A counter with no open streams, idle from now.
    pub fn new() -> Self {
        Self {
            active: AtomicUsize::new(0),
            base: Instant::now(),
            last_change_ms: AtomicU64::new(0),
        }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.base.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Streams currently counted as open.
    pub fn active(&self) -> usize {
        self.active.load(Ordering::Acquire)
    }

    /// How long the counter has been at zero, or `None` while streams are open.
    pub fn idle_for(&self) -> Option<Duration> {
        if self.active() > 0 {
            return None;
        }
        let since = self.last_change_ms.load(Ordering::Acquire);
        Some(Duration::from_millis(self.now_ms().saturating_sub(since)))
    }

    /// Counts one more stream until the returned guard is dropped.
    pub fn guard(self: &Arc<Self>) -> StreamDropGuard {
        self.active.fetch_add(1, Ordering::AcqRel);
        self.touch();
        StreamDropGuard {
            counter: self.clone(),
        }
    }

    /// Like [`guard`](Self::guard), but only if fewer than `max` streams are open (atomically).
    pub fn try_guard(self: &Arc<Self>, max: usize) -> Option<StreamDropGuard> {
        self.active
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .ok()?;
        self.touch();
        Some(StreamDropGuard {
            counter: self.clone(),
        })
    }

    fn touch(&self) {
        self.last_change_ms.store(self.now_ms(), Ordering::Release);
    }
}

/// Keeps one stream counted in its connection's [`StreamCounter`]; decrements it on drop.
///
/// An [`H2Stream`](crate::H2Stream) owns its guard and shares it between its halves after
/// [`into_split`](crate::H2Stream::into_split), so the stream stops counting only once both halves
/// are gone.
#[derive(Debug)]
pub struct StreamDropGuard {
    counter: Arc<StreamCounter>,
}

impl Drop for StreamDropGuard {
    fn drop(&mut self) {
        self.counter.touch();
        let left = self.counter.active.fetch_sub(1, Ordering::AcqRel) - 1;
        tracing::trace!(left, "hbone stream closed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counter_limits_and_idles() {
        let c = Arc::new(StreamCounter::new());
        let a = c.try_guard(2).expect("room for 1st");
        let b = c.try_guard(2).expect("room for 2nd");
        assert!(c.try_guard(2).is_none());
        assert_eq!(c.active(), 2);
        assert!(c.idle_for().is_none());
        drop(a);
        drop(b);
        assert_eq!(c.active(), 0);
        assert!(c.idle_for().is_some());
    }
}
