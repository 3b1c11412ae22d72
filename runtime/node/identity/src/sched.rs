//! CA call scheduling: at most `max` calls in flight; the calls waiting for a slot are served by priority (a
//! connection waiting > a prefetch for a new local workload > a background refresh), first come first served
//! within a priority. A waiting call's priority can be raised while it waits (a connection joins a prefetch).

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use serde::Serialize;
use tokio::sync::oneshot;

/// How urgently a certificate is wanted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum Priority {
    /// A renewal before expiry; the current certificate still serves.
    Background = 0,
    /// A new local workload: wanted soon, nobody waits yet.
    Warmup = 1,
    /// A connection is waiting for it.
    RealTime = 2,
}

impl Priority {
    fn from_u8(v: u8) -> Self {
        match v {
            0 => Priority::Background,
            1 => Priority::Warmup,
            _ => Priority::RealTime,
        }
    }
}

/// A priority shared between a waiting call and those who may raise it.
#[derive(Debug)]
pub struct PriorityCell(AtomicU8);

impl PriorityCell {
    /// A cell holding `p`.
    pub fn new(p: Priority) -> Arc<Self> {
        Arc::new(Self(AtomicU8::new(p as u8)))
    }

    /// The priority now.
    pub fn get(&self) -> Priority {
        Priority::from_u8(self.0.load(Ordering::Relaxed))
    }

    /// Raise to `p` (never lowers).
    pub fn raise(&self, p: Priority) {
        self.0.fetch_max(p as u8, Ordering::Relaxed);
    }
}

struct Waiter {
    seq: u64,
    prio: Arc<PriorityCell>,
    tx: oneshot::Sender<()>,
}

#[derive(Default)]
struct Inner {
    in_flight: usize,
    seq: u64,
    waiters: Vec<Waiter>,
}

/// Bounds the CA calls in flight and orders the waiting ones.
pub struct Scheduler {
    max: usize,
    inner: Mutex<Inner>,
}

impl std::fmt::Debug for Scheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (in_flight, queued) = self.stats();
        f.debug_struct("Scheduler")
            .field("max", &self.max)
            .field("in_flight", &in_flight)
            .field("queued", &queued)
            .finish()
    }
}

/// A slot for one CA call; freed (and handed to the best waiter) on drop.
#[derive(Debug)]
pub struct Permit {
    sched: Arc<Scheduler>,
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.sched.release();
    }
}

/// Removes a waiter that gave up; returns a slot handed to it in the meantime.
struct Waiting {
    sched: Arc<Scheduler>,
    rx: Option<oneshot::Receiver<()>>,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        if let Some(mut rx) = self.rx.take() {
            rx.close();
            if rx.try_recv().is_ok() {
                self.sched.release();
            }
        }
    }
}

impl Scheduler {
    /// At most `max` (at least 1) calls in flight.
    pub fn new(max: usize) -> Arc<Self> {
        Arc::new(Self {
            max: max.max(1),
            inner: Mutex::new(Inner::default()),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// (calls in flight, calls waiting).
    pub fn stats(&self) -> (usize, usize) {
        let g = self.lock();
        (
            g.in_flight,
            g.waiters.iter().filter(|w| !w.tx.is_closed()).count(),
        )
    }

    /// Wait for a slot; `prio` is read when slots are handed out, so it may be raised meanwhile.
    pub async fn acquire(self: &Arc<Self>, prio: Arc<PriorityCell>) -> Permit {
        let rx = {
            let mut g = self.lock();
            g.waiters.retain(|w| !w.tx.is_closed());
            if g.in_flight < self.max {
                g.in_flight += 1;
                return Permit {
                    sched: self.clone(),
                };
            }
            let (tx, rx) = oneshot::channel();
            g.seq += 1;
            let seq = g.seq;
            g.waiters.push(Waiter { seq, prio, tx });
            rx
        };
        let mut waiting = Waiting {
            sched: self.clone(),
            rx: Some(rx),
        };
        if let Some(rx) = waiting.rx.as_mut() {
            // The sender lives in `self.inner` until it is used, and `self` is alive: this cannot fail.
            let _ = rx.await;
        }
        waiting.rx = None;
        Permit {
            sched: self.clone(),
        }
    }

    /// Hand the slot to the best live waiter, or free it.
    fn release(&self) {
        let mut g = self.lock();
        loop {
            let best = g
                .waiters
                .iter()
                .enumerate()
                .filter(|(_, w)| !w.tx.is_closed())
                .max_by_key(|(_, w)| (w.prio.get(), std::cmp::Reverse(w.seq)))
                .map(|(i, _)| i);
            let Some(i) = best else {
                g.waiters.clear();
                g.in_flight = g.in_flight.saturating_sub(1);
                return;
            };
            let w = g.waiters.swap_remove(i);
            if w.tx.send(()).is_ok() {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn bounded_and_ordered_by_priority() {
        let s = Scheduler::new(1);
        let first = s.acquire(PriorityCell::new(Priority::Background)).await;
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for (name, p) in [
            ("bg", Priority::Background),
            ("warm", Priority::Warmup),
            ("rt", Priority::RealTime),
            ("bg-raised", Priority::Background),
        ] {
            let (s, order) = (s.clone(), order.clone());
            let cell = PriorityCell::new(p);
            let c2 = cell.clone();
            tasks.push(tokio::spawn(async move {
                let _p = s.acquire(c2).await;
                order.lock().unwrap().push(name);
            }));
            tokio::time::sleep(Duration::from_millis(5)).await;
            if name == "bg-raised" {
                cell.raise(Priority::RealTime);
            }
        }
        assert_eq!(s.stats(), (1, 4));
        drop(first);
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), ["rt", "bg-raised", "warm", "bg"]);
        assert_eq!(s.stats(), (0, 0));
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_that_gives_up_frees_its_slot() {
        let s = Scheduler::new(1);
        let first = s.acquire(PriorityCell::new(Priority::RealTime)).await;
        let waiting = tokio::time::timeout(
            Duration::from_millis(20),
            s.acquire(PriorityCell::new(Priority::RealTime)),
        )
        .await;
        assert!(waiting.is_err());
        drop(first);
        assert_eq!(s.stats(), (0, 0));
        let _again = s.acquire(PriorityCell::new(Priority::Background)).await;
        assert_eq!(s.stats(), (1, 0));
    }
}
