//! The telemetry path: the data path queues open/close events (never blocking: a full queue drops and counts),
//! and one worker thread converts them once and hands them to every telemetry plugin in batches.

use std::sync::Arc;
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};

use arc_swap::ArcSwap;
use prometheus_client::metrics::counter::Counter;
use weft_hooks::{CloseRecord, ConnectionRecord};

use crate::bindings::types as wit;
use crate::chain::Chain;
use crate::convert;

pub(crate) enum Msg {
    Opened(ConnectionRecord),
    Closed(ConnectionRecord, CloseRecord),
    /// Answered once every event queued before it was handed to the plugins.
    Flush(SyncSender<()>),
}

/// The sending side, held by the host.
pub(crate) struct TelemetryQueue {
    tx: SyncSender<Msg>,
    dropped: Counter,
}

impl TelemetryQueue {
    pub fn start(
        chain: Arc<ArcSwap<Chain>>,
        capacity: usize,
        batch: usize,
        dropped: Counter,
    ) -> std::io::Result<Self> {
        let (tx, rx) = std::sync::mpsc::sync_channel(capacity.max(1));
        std::thread::Builder::new()
            .name("weft-plugin-telemetry".into())
            .spawn(move || worker(rx, chain, batch.max(1)))?;
        Ok(Self { tx, dropped })
    }

    /// Queues an event without blocking.
    pub fn send(&self, msg: Msg) {
        match self.tx.try_send(msg) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                self.dropped.inc();
            }
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

fn worker(rx: Receiver<Msg>, chain: Arc<ArcSwap<Chain>>, batch: usize) {
    let mut records: Vec<ConnectionRecord> = Vec::with_capacity(batch);
    let mut events: Vec<wit::Event> = Vec::with_capacity(batch);
    let mut flushes = Vec::new();
    while let Ok(first) = rx.recv() {
        let mut next = Some(first);
        while let Some(msg) = next.take() {
            match msg {
                Msg::Opened(c) => {
                    events.push(wit::Event::Opened(convert::connection_info(&c)));
                    records.push(c);
                }
                Msg::Closed(c, close) => {
                    events.push(wit::Event::Closed((
                        convert::connection_info(&c),
                        convert::close_info(&close),
                    )));
                    records.push(c);
                }
                Msg::Flush(done) => flushes.push(done),
            }
            if events.len() < batch {
                next = rx.try_recv().ok();
            }
        }
        if !events.is_empty() {
            deliver(&chain.load(), &records, &events);
        }
        records.clear();
        events.clear();
        for done in flushes.drain(..) {
            let _ = done.send(());
        }
    }
}

fn deliver(chain: &Chain, records: &[ConnectionRecord], events: &[wit::Event]) {
    for plugin in &chain.telemetry {
        let sel = &plugin.spec.selector;
        if sel.namespaces.is_empty() && sel.workloads.is_empty() {
            plugin.on_events(events);
        } else {
            let picked: Vec<wit::Event> = records
                .iter()
                .zip(events)
                .filter(|(r, _)| plugin.selects(r))
                .map(|(_, e)| e.clone())
                .collect();
            if !picked.is_empty() {
                plugin.on_events(&picked);
            }
        }
    }
}
