//! The telemetry path: the data path queues open/close events (never blocking: a full queue drops and counts),
//! and one worker thread converts them once and hands them to every telemetry plugin in batches.
//!
//! After a batch that did not fill up, the worker pauses for the linger (`HostConfig::telemetry_linger`) before it
//! takes more: under load, events gather while it pauses and one wake-up serves many, instead of every event waking
//! the thread (a futex wake on the data path and a context switch, on every connection's open and close). An event
//! after a quiet spell is delivered at once; one during a pause waits at most the linger.

use std::collections::VecDeque;
use std::sync::mpsc::SyncSender;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use arc_swap::ArcSwap;
use prometheus_client::metrics::counter::Counter;
use weft_hooks::{CloseRecord, ConnectionRecord};

use crate::lifecycle::chain::Chain;
use crate::wit::batch::{Batch, EventBatch};
use crate::wit::bindings::types as wit;

pub(crate) enum Msg {
    /// The data path's own record, shared: queueing an event copies no field of it.
    Opened(Arc<ConnectionRecord>),
    Closed(Arc<ConnectionRecord>, CloseRecord),
    /// Answered once every event queued before it was handed to the plugins.
    Flush(SyncSender<()>),
}

/// What the data path and the worker share: the events queued and not yet taken.
///
/// The worker takes everything queued at once (it swaps its drained buffer in), so a data-path thread's send is
/// one uncontended lock and a push into memory that is reused from batch to batch: no allocation per event, no
/// per-event atomics shared with the worker, and a wake-up only when the worker is waiting for work.
#[derive(Default)]
struct Mailbox {
    state: Mutex<State>,
    ready: Condvar,
}

#[derive(Default)]
struct State {
    queue: VecDeque<Msg>,
    /// Events (not flushes) in `queue`.
    events: usize,
    /// The worker is blocked waiting for a message.
    waiting: bool,
    /// The sending side is gone (set by its drop): the worker ends once it has taken what is left.
    closed: bool,
}

impl Mailbox {
    /// The state, also after a thread panicked holding it (the queue stays consistent: every change is one push or
    /// one swap).
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The sending side, held by the host.
///
/// The bound counts events queued and not yet taken by the worker; the worker holds at most one more taken set
/// while it delivers it. Memory follows what is actually queued (no ring of `capacity` slots allocated up front).
pub(crate) struct TelemetryQueue {
    mailbox: Arc<Mailbox>,
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
                    || {
                        let c = chain.load();
                        c.telemetry
                            .iter()
                            .chain(&c.telemetry_shadows)
                            .all(|p| p.takes_batches())
                    },
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
        let mailbox = Arc::new(Mailbox::default());
        let queue = Self {
            mailbox: mailbox.clone(),
            capacity: capacity.max(1),
            dropped,
        };
        let rx = QueueRx {
            mailbox,
            taken: VecDeque::new(),
        };
        (queue, rx)
    }

    /// Queues an event without blocking; a full queue drops it and counts the drop.
    pub fn send(&self, msg: Msg) {
        let mut state = self.mailbox.lock();
        if state.events >= self.capacity {
            drop(state);
            self.dropped.inc();
            return;
        }
        state.events += 1;
        self.push(state, msg);
    }

    /// Appends `msg` and wakes the worker if it waits for one.
    fn push(&self, mut state: MutexGuard<'_, State>, msg: Msg) {
        state.queue.push_back(msg);
        let wake = std::mem::take(&mut state.waiting);
        drop(state);
        if wake {
            self.mailbox.ready.notify_one();
        }
    }

    /// Blocks until everything queued so far has been delivered.
    pub fn flush(&self) {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        self.push(self.mailbox.lock(), Msg::Flush(tx));
        let _ = rx.recv();
    }

    /// Events queued and not yet taken by the worker.
    #[cfg(test)]
    fn queued(&self) -> usize {
        self.mailbox.lock().events
    }
}

impl Drop for TelemetryQueue {
    /// The worker delivers what is queued, then ends.
    fn drop(&mut self) {
        self.mailbox.lock().closed = true;
        self.mailbox.ready.notify_one();
    }
}

/// The receiving side: takes everything queued at once and hands it out one message at a time.
struct QueueRx {
    mailbox: Arc<Mailbox>,
    /// Taken from the queue, not yet handed out (its room in the bound is free again).
    taken: VecDeque<Msg>,
}

impl QueueRx {
    /// Moves everything queued into `taken` (swapping buffers, so both keep their memory).
    fn take(state: &mut State, taken: &mut VecDeque<Msg>) {
        std::mem::swap(&mut state.queue, taken);
        state.events = 0;
    }

    /// The next message, waiting for one; `None` once the sending side is gone and everything was handed out.
    fn recv(&mut self) -> Option<Msg> {
        if let Some(msg) = self.taken.pop_front() {
            return Some(msg);
        }
        let mut state = self.mailbox.lock();
        while state.queue.is_empty() {
            if state.closed {
                return None;
            }
            state.waiting = true;
            state = self
                .mailbox
                .ready
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
        state.waiting = false;
        Self::take(&mut state, &mut self.taken);
        drop(state);
        self.taken.pop_front()
    }

    /// The next message if one is queued.
    fn try_recv(&mut self) -> Option<Msg> {
        if let Some(msg) = self.taken.pop_front() {
            return Some(msg);
        }
        let mut state = self.mailbox.lock();
        if state.queue.is_empty() {
            return None;
        }
        Self::take(&mut state, &mut self.taken);
        drop(state);
        self.taken.pop_front()
    }
}

/// Takes events in batches of at most `batch`, hands each batch to `deliver`, answers flushes, and calls `linger`
/// after a batch that did not fill up; returns once every sender is gone.
fn worker(
    mut rx: QueueRx,
    batch: usize,
    mut merging: impl FnMut() -> bool,
    mut deliver: impl FnMut(&EventBatch),
    mut linger: impl FnMut(),
) {
    let mut events = EventBatch::with_capacity(batch);
    let mut flushes = Vec::new();
    while let Some(first) = rx.recv() {
        // Merge a connection's open and close only when every plugin takes merged batches (checked per batch:
        // one swapped in meanwhile gets its opens and closes apart anyway, see `Instance::on_batch`).
        events.set_merging(merging());
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
            events.seal();
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
    for plugin in chain.telemetry.iter().chain(&chain.telemetry_shadows) {
        let sel = &plugin.spec.selector;
        if sel.namespaces.is_empty() && sel.workloads.is_empty() {
            plugin.on_batch(&batch.view());
        } else {
            // The batch's workloads and strings go along whole: the picked events' positions stay valid.
            let picked: Vec<wit::BatchEvent> = batch
                .records
                .iter()
                .zip(&batch.events)
                .filter(|(r, _)| plugin.selects(r))
                .map(|(_, e)| e.clone())
                .collect();
            if !picked.is_empty() {
                plugin.on_batch(&Batch {
                    events: &picked,
                    ..batch.view()
                });
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

    /// In merging mode a connection opened and closed within a batch is one `opened-closed` at the place of its
    /// close (its records in step); a close whose open came in an earlier batch, and an open not closed yet, stay
    /// apart. Without merging every open and close is its own event, in order.
    #[test]
    fn opens_and_closes_within_a_batch_merge_only_in_merging_mode() {
        use wit::BatchEvent as E;
        let with_id = |id| Arc::new(ConnectionRecord { id, ..record() });
        let close = CloseRecord {
            bytes_sent: 1,
            bytes_received: 2,
            duration: Duration::from_millis(3),
            verdict: weft_hooks::Verdict::Allow,
            error: None,
            response_flags: "-",
        };
        let kinds = |merging: bool| {
            let (queue, rx) = TelemetryQueue::unstarted(100, Counter::default());
            queue.send(Msg::Opened(with_id(1)));
            queue.send(Msg::Opened(with_id(2)));
            queue.send(Msg::Closed(with_id(1), close.clone()));
            queue.send(Msg::Closed(with_id(3), close.clone()));
            queue.send(Msg::Opened(with_id(4)));
            queue.send(Msg::Closed(with_id(2), close.clone()));
            drop(queue);
            let mut seen = Vec::new();
            worker(
                rx,
                100,
                || merging,
                |batch| {
                    assert_eq!(batch.records.len(), batch.events.len());
                    for (r, e) in batch.records.iter().zip(&batch.events) {
                        let (kind, id) = match e {
                            E::Opened(c) => ("opened", c.id),
                            E::Closed((c, _)) => ("closed", c.id),
                            E::OpenedClosed((c, info)) => {
                                assert_eq!((info.bytes_sent, info.bytes_received), (1, 2));
                                ("opened-closed", c.id)
                            }
                        };
                        assert_eq!(r.id, id);
                        seen.push((kind, id));
                    }
                },
                || {},
            );
            seen
        };
        assert_eq!(
            kinds(true),
            [
                ("opened-closed", 1),
                ("closed", 3),
                ("opened", 4),
                ("opened-closed", 2)
            ]
        );
        assert_eq!(
            kinds(false),
            [
                ("opened", 1),
                ("opened", 2),
                ("closed", 1),
                ("closed", 3),
                ("opened", 4),
                ("closed", 2)
            ]
        );
        // What a plugin without `telemetry-batches` gets from a merged batch: the open, then the close, strings
        // resolved.
        let mut batch = EventBatch::with_capacity(2);
        batch.set_merging(true);
        batch.opened(with_id(7));
        batch.closed(with_id(7), &close);
        batch.seal();
        let plain = crate::wit::batch::plain_events(&batch.view());
        assert!(matches!(
            &plain[..],
            [wit::Event::Opened(a), wit::Event::Closed((b, info))]
                if a.conn.id == 7 && b.conn.id == 7 && info.response_flags == "-"
        ));
    }

    /// An `opened-closed` reaches an SDK plugin through `telemetry-batches` as one open-and-close
    /// (`istio-telemetry` counts exactly what an open then a close would: opened, closed, bytes, the sockets gauge
    /// at 0), and a plugin built without that export as its open, then its close.
    #[test]
    fn a_merged_event_reaches_new_and_legacy_plugins_as_an_open_and_a_close() {
        let close = CloseRecord {
            bytes_sent: 10,
            bytes_received: 20,
            duration: Duration::from_millis(3),
            verdict: weft_hooks::Verdict::Allow,
            error: None,
            response_flags: "-",
        };
        for (dir, takes_batches) in [
            ("plugins/istio-telemetry", true),
            ("plugins/testdata/legacy-telemetry", false),
        ] {
            let wasm = crate::testing::build_plugin(dir).unwrap();
            let h = crate::testing::Harness::telemetry(&wasm, r#"{"accessLog": "off"}"#).unwrap();
            let version = h
                .host()
                .plugins
                .applied
                .lock()
                .unwrap()
                .serving
                .get("plugin")
                .cloned()
                .unwrap();
            assert_eq!(version.takes_batches(), takes_batches, "{dir}");
            let record = Arc::new(crate::testing::conn(
                8080,
                Some("spiffe://cluster.local/ns/shop/sa/frontend"),
            ));
            let mut batch = EventBatch::with_capacity(4);
            batch.set_merging(true);
            batch.opened(record.clone());
            batch.closed(record, &close);
            batch.seal();
            assert!(
                matches!(&batch.events[..], [wit::BatchEvent::OpenedClosed(_)]),
                "{dir}"
            );
            version.on_batch(&batch.view());
            let text = h.metrics_text();
            let value = |name: &str| {
                text.lines()
                    .filter(|l| l.starts_with(name) && !l.starts_with('#'))
                    .map(|l| l.rsplit(' ').next().unwrap().to_string())
                    .collect::<Vec<_>>()
            };
            if takes_batches {
                assert_eq!(
                    value("istio_tcp_connections_opened_total{"),
                    ["1"],
                    "{text}"
                );
                assert_eq!(
                    value("istio_tcp_connections_closed_total{"),
                    ["1"],
                    "{text}"
                );
                assert_eq!(value("istio_tcp_received_bytes_total{"), ["10"], "{text}");
                assert_eq!(value("istio_tcp_sockets_open{"), ["0"], "{text}");
            } else {
                assert_eq!(value("legacy_opened_total"), ["1"], "{text}");
                assert_eq!(value("legacy_closed_total"), ["1"], "{text}");
                // The open came first: no close went unmatched (the series exists only once counted).
                assert!(
                    value("legacy_unmatched_closes_total")
                        .iter()
                        .all(|v| v == "0"),
                    "{text}"
                );
            }
            let errors: u64 = h.host().status()[0].errors.values().sum();
            assert_eq!(errors, 0, "{dir}");
        }
    }

    /// Past its bound the queue drops and counts, and what the worker takes makes room again.
    #[test]
    fn a_full_queue_drops_and_counts_and_frees_room_as_the_worker_reads() {
        let dropped = Counter::default();
        let (queue, mut rx) = TelemetryQueue::unstarted(2, dropped.clone());
        for _ in 0..3 {
            queue.send(Msg::Opened(Arc::new(record())));
        }
        assert_eq!(dropped.get(), 1);
        assert_eq!(queue.queued(), 2);
        // The worker takes all that is queued at once: the room is free again while it hands the events out.
        drop(rx.recv().unwrap());
        assert_eq!(queue.queued(), 0);
        queue.send(Msg::Opened(Arc::new(record())));
        queue.send(Msg::Opened(Arc::new(record())));
        assert_eq!(dropped.get(), 1);
        queue.send(Msg::Opened(Arc::new(record())));
        assert_eq!(dropped.get(), 2);
        // A worker started on the rest drains it, and a flush answers once it has.
        let delivered = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let seen = delivered.clone();
        let worker = std::thread::spawn(move || {
            worker(
                rx,
                16,
                || false,
                |b| {
                    seen.fetch_add(b.len(), std::sync::atomic::Ordering::Relaxed);
                },
                || {},
            )
        });
        queue.flush();
        assert_eq!(queue.queued(), 0);
        // One taken before the worker started (still in its hands) and the two queued after.
        assert_eq!(delivered.load(std::sync::atomic::Ordering::Relaxed), 3);
        drop(queue);
        worker.join().unwrap();
    }

    /// A worker waiting on an empty queue is woken by a send, and ends once the sending side is dropped.
    #[test]
    fn a_waiting_worker_is_woken_and_ends_when_the_queue_is_dropped() {
        let (queue, rx) = TelemetryQueue::unstarted(8, Counter::default());
        let (got_tx, got) = std::sync::mpsc::channel();
        let worker = std::thread::spawn(move || {
            worker(
                rx,
                16,
                || false,
                |b| {
                    let _ = got_tx.send(b.len());
                },
                || {},
            )
        });
        for _ in 0..3 {
            queue.send(Msg::Opened(Arc::new(record())));
            assert_eq!(
                got.recv().unwrap(),
                1,
                "each event, sent while the worker waits, is delivered"
            );
        }
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
            queue.send(Msg::Opened(Arc::new(record())));
        }
        let (flushed_tx, flushed) = std::sync::mpsc::sync_channel(1);
        queue.send(Msg::Flush(flushed_tx));
        drop(queue);
        let steps = std::cell::RefCell::new(Vec::new());
        worker(
            rx,
            2,
            || false,
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
