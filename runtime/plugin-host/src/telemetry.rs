//! The telemetry path: the data path queues open/close events (never blocking: a full queue drops and counts),
//! and one worker thread converts them once and hands them to every telemetry plugin in batches.
//!
//! After a batch that did not fill up, the worker pauses for the linger (`HostConfig::telemetry_linger`) before it
//! takes more: under load, events gather while it pauses and one wake-up serves many, instead of every event waking
//! the thread (a futex wake on the data path and a context switch, on every connection's open and close). An event
//! after a quiet spell is delivered at once; one during a pause waits at most the linger.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, Sender, SyncSender};
use std::time::Duration;

use arc_swap::ArcSwap;
use prometheus_client::metrics::counter::Counter;
use weft_hooks::{CloseRecord, ConnectionRecord};

use crate::bindings::types as wit;
use crate::chain::Chain;
use crate::convert::EventBatch;

pub(crate) enum Msg {
    Opened(ConnectionRecord),
    Closed(ConnectionRecord, CloseRecord),
    /// Answered once every event queued before it was handed to the plugins.
    Flush(SyncSender<()>),
}

/// The sending side, held by the host.
///
/// The bound is a count, not a preallocated ring: a bounded channel would allocate (and touch) every one of its
/// `capacity` slots up front, megabytes of resident memory for an idle node; this channel's memory follows what is
/// actually queued.
pub(crate) struct TelemetryQueue {
    tx: Sender<Msg>,
    queued: Arc<AtomicUsize>,
    capacity: usize,
    dropped: Counter,
}

impl TelemetryQueue {
    pub fn start(
        chain: Arc<ArcSwap<Chain>>,
        capacity: usize,
        batch: usize,
        linger: Duration,
        dropped: Counter,
    ) -> std::io::Result<Self> {
        let (queue, rx) = Self::unstarted(capacity, dropped);
        std::thread::Builder::new()
            .name("weft-plugin-telemetry".into())
            .spawn(move || {
                worker(
                    rx,
                    batch.max(1),
                    |batch| deliver(&chain.load(), batch),
                    || {
                        if !linger.is_zero() {
                            std::thread::sleep(linger);
                        }
                    },
                )
            })?;
        Ok(queue)
    }

    /// The queue and the receiving end its worker reads.
    fn unstarted(capacity: usize, dropped: Counter) -> (Self, QueueRx) {
        let (tx, rx) = std::sync::mpsc::channel();
        let queued = Arc::new(AtomicUsize::new(0));
        let queue = Self {
            tx,
            queued: queued.clone(),
            capacity: capacity.max(1),
            dropped,
        };
        (queue, QueueRx { rx, queued })
    }

    /// Queues an event without blocking; a full queue drops it and counts the drop.
    pub fn send(&self, msg: Msg) {
        if self.queued.fetch_add(1, Ordering::Relaxed) >= self.capacity {
            self.queued.fetch_sub(1, Ordering::Relaxed);
            self.dropped.inc();
            return;
        }
        if self.tx.send(msg).is_err() {
            self.queued.fetch_sub(1, Ordering::Relaxed);
            self.dropped.inc();
        }
    }

    /// Blocks until everything queued so far has been delivered.
    pub fn flush(&self) {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        if self.tx.send(Msg::Flush(tx)).is_ok() {
            let _ = rx.recv();
        }
    }
}

/// The receiving side: every event taken frees its room in the bound.
struct QueueRx {
    rx: Receiver<Msg>,
    queued: Arc<AtomicUsize>,
}

impl QueueRx {
    fn taken(&self, msg: Msg) -> Msg {
        if !matches!(msg, Msg::Flush(_)) {
            self.queued.fetch_sub(1, Ordering::Relaxed);
        }
        msg
    }

    /// The next message, waiting for one; `None` once every sender is gone.
    fn recv(&self) -> Option<Msg> {
        self.rx.recv().ok().map(|m| self.taken(m))
    }

    /// The next message if one is queued.
    fn try_recv(&self) -> Option<Msg> {
        self.rx.try_recv().ok().map(|m| self.taken(m))
    }
}

/// Takes events in batches of at most `batch`, hands each batch to `deliver`, answers flushes, and calls `linger`
/// after a batch that did not fill up; returns once every sender is gone.
fn worker(
    rx: QueueRx,
    batch: usize,
    mut deliver: impl FnMut(&EventBatch),
    mut linger: impl FnMut(),
) {
    let mut events = EventBatch::with_capacity(batch);
    let mut flushes = Vec::new();
    while let Some(first) = rx.recv() {
        let mut next = Some(first);
        while let Some(msg) = next.take() {
            match msg {
                Msg::Opened(c) => events.opened(c),
                Msg::Closed(c, close) => events.closed(c, &close),
                Msg::Flush(done) => flushes.push(done),
            }
            if events.len() < batch {
                next = rx.try_recv();
            }
        }
        let taken = events.len();
        if taken > 0 {
            deliver(&events);
        }
        events.clear();
        for done in flushes.drain(..) {
            let _ = done.send(());
        }
        if taken > 0 && taken < batch {
            linger();
        }
    }
}

fn deliver(chain: &Chain, batch: &EventBatch) {
    for plugin in &chain.telemetry {
        let sel = &plugin.spec.selector;
        if sel.namespaces.is_empty() && sel.workloads.is_empty() {
            plugin.on_events(&batch.workloads, &batch.events);
        } else {
            // The batch's workloads go along whole: the picked events' indices stay valid.
            let picked: Vec<wit::Event> = batch
                .records
                .iter()
                .zip(&batch.events)
                .filter(|(r, _)| plugin.selects(r))
                .map(|(_, e)| e.clone())
                .collect();
            if !picked.is_empty() {
                plugin.on_events(&batch.workloads, &picked);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test code: a panic fails the test

    use std::net::SocketAddr;

    use weft_hooks::Direction;

    use super::*;

    fn record() -> ConnectionRecord {
        let a = SocketAddr::from(([10, 0, 0, 1], 1000));
        ConnectionRecord {
            id: 1,
            direction: Direction::Outbound,
            src: a,
            dst: a,
            peer_identity: None,
            src_workload: None,
            dst_workload: None,
            dst_service: None,
            hbone: true,
        }
    }

    /// Past its bound the queue drops and counts, and what the worker takes makes room again.
    #[test]
    fn a_full_queue_drops_and_counts_and_frees_room_as_the_worker_reads() {
        let dropped = Counter::default();
        let (queue, rx) = TelemetryQueue::unstarted(2, dropped.clone());
        for _ in 0..3 {
            queue.send(Msg::Opened(record()));
        }
        assert_eq!(dropped.get(), 1);
        assert_eq!(queue.queued.load(Ordering::Relaxed), 2);
        // One message taken is one slot free.
        drop(rx.recv().unwrap());
        queue.send(Msg::Opened(record()));
        assert_eq!(dropped.get(), 1);
        // A worker started on the rest drains it, and a flush answers once it has.
        let worker = std::thread::spawn(move || worker(rx, 16, |_| {}, || {}));
        queue.flush();
        assert_eq!(queue.queued.load(Ordering::Relaxed), 0);
        drop(queue);
        worker.join().unwrap();
    }

    /// A batch that fills up is followed at once by the next; one that does not is followed by the linger, after
    /// its flushes are answered; a flush alone does not linger.
    #[test]
    fn the_worker_lingers_only_after_a_batch_that_did_not_fill_up() {
        #[derive(Debug, PartialEq)]
        enum Step {
            Delivered(usize),
            Lingered,
        }
        let (queue, rx) = TelemetryQueue::unstarted(100, Counter::default());
        for _ in 0..5 {
            queue.send(Msg::Opened(record()));
        }
        let (flushed_tx, flushed) = std::sync::mpsc::sync_channel(1);
        queue.send(Msg::Flush(flushed_tx));
        drop(queue);
        let steps = std::cell::RefCell::new(Vec::new());
        worker(
            rx,
            2,
            |batch| {
                assert_eq!(batch.records.len(), batch.events.len());
                steps.borrow_mut().push(Step::Delivered(batch.len()));
            },
            || {
                assert!(flushed.try_recv().is_ok(), "the flush is answered first");
                steps.borrow_mut().push(Step::Lingered);
            },
        );
        assert_eq!(
            steps.into_inner(),
            [
                Step::Delivered(2),
                Step::Delivered(2),
                Step::Delivered(1),
                Step::Lingered
            ]
        );
    }
}
