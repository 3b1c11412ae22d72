//! A batch of telemetry events as the telemetry worker builds it, in the compact form of `telemetry-batches`
//! (workloads and strings sent once per batch, events naming them by position), and its conversion for plugins
//! that take only `telemetry.on-events`.

use std::collections::HashMap;
use std::sync::Arc;

use weft_hooks::{CloseRecord, ConnectionRecord, WorkloadMeta};

use crate::wit::bindings::types as wit;
use crate::wit::convert::{batch_close, batch_connection, workload_meta};

/// What a telemetry plugin is handed: a batch's workloads, strings and events, borrowed.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Batch<'a> {
    pub workloads: &'a [wit::WorkloadMeta],
    pub strings: &'a [String],
    pub events: &'a [wit::BatchEvent],
}

/// A batch of telemetry events in their WIT form, with the records they came from. Each workload's metadata is
/// converted (and later lowered into every plugin) once per batch, however many of the batch's events name it;
/// events refer to it by its index in `workloads`. Workloads are told apart by their `Arc`: the batch holds every
/// record it converted, so no address is freed and reused while the index is alive. Strings (peer identities,
/// destination services, response flags, errors) are kept once per batch in `strings`, told apart by content.
///
/// In merging mode (every serving plugin takes `telemetry-batches`), a connection whose open and close both fall
/// in the batch becomes one `opened-closed` event at the place of its close; its open's slot is dropped by
/// [`EventBatch::seal`]. Otherwise every open and close is its own event, in order.
pub(crate) struct EventBatch {
    /// The record of each event (for plugins with a workload selector), in step with `events`.
    pub records: Vec<Arc<ConnectionRecord>>,
    pub workloads: Vec<wit::WorkloadMeta>,
    pub strings: Vec<String>,
    pub events: Vec<wit::BatchEvent>,
    index: HashMap<*const WorkloadMeta, u32>,
    string_index: HashMap<String, u32>,
    merge: bool,
    /// Opens of this batch not closed yet (merging mode): connection id → slot.
    open: HashMap<u64, usize>,
    /// Slots of opens merged into a later `opened-closed`, dropped by [`EventBatch::seal`].
    merged: Vec<usize>,
}

impl EventBatch {
    pub fn with_capacity(n: usize) -> Self {
        Self {
            records: Vec::with_capacity(n),
            workloads: Vec::new(),
            strings: Vec::new(),
            events: Vec::with_capacity(n),
            index: HashMap::new(),
            string_index: HashMap::new(),
            merge: false,
            open: HashMap::new(),
            merged: Vec::new(),
        }
    }

    /// The batch as plugins are handed it.
    pub fn view(&self) -> Batch<'_> {
        Batch {
            workloads: &self.workloads,
            strings: &self.strings,
            events: &self.events,
        }
    }

    /// Whether the next events merge opens and closes (set on an empty batch).
    pub fn set_merging(&mut self, merge: bool) {
        debug_assert!(self.events.is_empty());
        self.merge = merge;
    }

    pub fn opened(&mut self, c: Arc<ConnectionRecord>) {
        let conn = self.connection(&c);
        if self.merge {
            self.open.insert(c.id, self.events.len());
        }
        self.events.push(wit::BatchEvent::Opened(conn));
        self.records.push(c);
    }

    pub fn closed(&mut self, c: Arc<ConnectionRecord>, close: &CloseRecord) {
        let info = self.close(close);
        let event = match self.open.remove(&c.id) {
            Some(at) => {
                self.merged.push(at);
                // The open's converted connection moves over; its slot keeps a placeholder until `seal`.
                match std::mem::replace(&mut self.events[at], placeholder()) {
                    wit::BatchEvent::Opened(conn) => wit::BatchEvent::OpenedClosed((conn, info)),
                    other => {
                        // Never: `open` only names slots holding an open. Put it back and report the close alone.
                        self.events[at] = other;
                        self.merged.pop();
                        wit::BatchEvent::Closed((self.connection(&c), info))
                    }
                }
            }
            None => wit::BatchEvent::Closed((self.connection(&c), info)),
        };
        self.events.push(event);
        self.records.push(c);
    }

    /// Drops the slots of merged opens; call before delivering.
    pub fn seal(&mut self) {
        if self.merged.is_empty() {
            return;
        }
        let mut dead = vec![false; self.events.len()];
        for &at in &self.merged {
            dead[at] = true;
        }
        let mut i = 0;
        self.events.retain(|_| {
            i += 1;
            !dead[i - 1]
        });
        let mut i = 0;
        self.records.retain(|_| {
            i += 1;
            !dead[i - 1]
        });
        self.merged.clear();
    }

    /// Events taken into the batch so far (a merged open counts until `seal`: the batch bound counts what the
    /// worker took).
    pub fn len(&self) -> usize {
        self.events.len()
    }

    pub fn clear(&mut self) {
        self.index.clear();
        self.string_index.clear();
        self.events.clear();
        self.workloads.clear();
        self.strings.clear();
        self.records.clear();
        self.open.clear();
        self.merged.clear();
    }

    fn connection(&mut self, c: &ConnectionRecord) -> wit::BatchConnection {
        let conn = batch_connection(c);
        wit::BatchConnection {
            peer_identity: c.peer_identity.as_deref().map(|s| self.string(s)),
            destination_service: c.dst_service.as_deref().map(|s| self.string(s)),
            source_workload: c.src_workload.as_ref().map(|w| self.workload(w)),
            destination_workload: c.dst_workload.as_ref().map(|w| self.workload(w)),
            ..conn
        }
    }

    fn close(&mut self, close: &CloseRecord) -> wit::BatchClose {
        let info = batch_close(close);
        wit::BatchClose {
            error: close.error.as_deref().map(|e| self.string(e)),
            response_flags: self.string(close.response_flags),
            ..info
        }
    }

    fn workload(&mut self, w: &Arc<WorkloadMeta>) -> u32 {
        let next = u32::try_from(self.workloads.len()).unwrap_or(u32::MAX);
        *self.index.entry(Arc::as_ptr(w)).or_insert_with(|| {
            self.workloads.push(workload_meta(w));
            next
        })
    }

    /// `s`'s position in `strings`, added on first use.
    fn string(&mut self, s: &str) -> u32 {
        if let Some(&at) = self.string_index.get(s) {
            return at;
        }
        let at = u32::try_from(self.strings.len()).unwrap_or(u32::MAX);
        self.strings.push(s.to_owned());
        self.string_index.insert(s.to_owned(), at);
        at
    }
}

/// What a merged open's slot holds until [`EventBatch::seal`] drops it (nothing allocated).
fn placeholder() -> wit::BatchEvent {
    let nowhere = wit::SocketAddress {
        address: wit::IpAddress::Ipv4(0),
        port: 0,
    };
    wit::BatchEvent::Opened(wit::BatchConnection {
        id: 0,
        direction: wit::Direction::Inbound,
        source: nowhere,
        destination: nowhere,
        peer_identity: None,
        destination_service: None,
        hbone: false,
        source_workload: None,
        destination_workload: None,
    })
}

/// A batch as `telemetry.on-events` takes it (plugins without `telemetry-batches`): strings resolved, an
/// `opened-closed` as its open and its close. A position past the batch's strings (the host never sends one)
/// reads as none, or as an empty response flag.
pub(crate) fn plain_events(batch: &Batch<'_>) -> Vec<wit::Event> {
    let text = |at: Option<u32>| {
        at.and_then(|i| batch.strings.get(usize::try_from(i).ok()?))
            .cloned()
    };
    let conn = |c: &wit::BatchConnection| wit::EventConnection {
        conn: wit::Connection {
            id: c.id,
            direction: c.direction,
            source: c.source,
            destination: c.destination,
            peer_identity: text(c.peer_identity),
            destination_service: text(c.destination_service),
            hbone: c.hbone,
        },
        source_workload: c.source_workload,
        destination_workload: c.destination_workload,
    };
    let close = |x: &wit::BatchClose| wit::CloseInfo {
        bytes_sent: x.bytes_sent,
        bytes_received: x.bytes_received,
        duration_ns: x.duration_ns,
        verdict: x.verdict.clone(),
        error: text(x.error),
        response_flags: text(Some(x.response_flags)).unwrap_or_default(),
    };
    let mut out = Vec::with_capacity(batch.events.len());
    for e in batch.events {
        match e {
            wit::BatchEvent::Opened(c) => out.push(wit::Event::Opened(conn(c))),
            wit::BatchEvent::Closed((c, x)) => out.push(wit::Event::Closed((conn(c), close(x)))),
            wit::BatchEvent::OpenedClosed((c, x)) => {
                let c = conn(c);
                out.push(wit::Event::Opened(c.clone()));
                out.push(wit::Event::Closed((c, close(x))));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test code: a panic fails the test

    use std::time::Duration;

    use super::*;
    use crate::testing::conn;

    fn close(flags: &'static str, error: Option<&str>) -> CloseRecord {
        CloseRecord {
            bytes_sent: 1,
            bytes_received: 2,
            duration: Duration::from_millis(3),
            verdict: weft_hooks::Verdict::Allow,
            error: error.map(str::to_owned),
            response_flags: flags,
        }
    }

    /// Every string the batch's events carry is sent once, and each event names the right one; resolved for
    /// `on-events`, the events carry exactly the strings of their records.
    #[test]
    fn each_string_travels_once_and_events_name_it_by_position() {
        let alice = "spiffe://cluster.local/ns/shop/sa/alice";
        let bob = "spiffe://cluster.local/ns/shop/sa/bob";
        let with = |peer: &str, service: Option<&str>| {
            let mut c = conn(8080, Some(peer));
            c.dst_service = service.map(str::to_owned);
            Arc::new(c)
        };
        let records = [
            with(alice, Some("shop/cart.shop.svc.cluster.local")),
            with(bob, None),
            with(alice, Some("shop/cart.shop.svc.cluster.local")),
        ];
        let mut batch = EventBatch::with_capacity(8);
        for r in &records {
            batch.opened(r.clone());
        }
        batch.closed(records[0].clone(), &close("-", None));
        batch.closed(
            records[1].clone(),
            &close("CONNECT", Some("connection refused")),
        );
        batch.closed(records[2].clone(), &close("-", None));
        batch.seal();

        let mut sorted = batch.strings.clone();
        sorted.sort();
        assert_eq!(
            sorted,
            [
                "-",
                "CONNECT",
                "connection refused",
                "shop/cart.shop.svc.cluster.local",
                alice,
                bob,
            ]
        );
        let text = |at: Option<u32>| at.map(|i| batch.strings[i as usize].as_str());
        for (e, r) in batch.events.iter().zip(&batch.records) {
            let c = match e {
                wit::BatchEvent::Opened(c) | wit::BatchEvent::Closed((c, _)) => c,
                wit::BatchEvent::OpenedClosed(_) => unreachable!("not merging"),
            };
            assert_eq!(text(c.peer_identity), r.peer_identity.as_deref());
            assert_eq!(text(c.destination_service), r.dst_service.as_deref());
        }
        let plain = plain_events(&batch.view());
        assert_eq!(plain.len(), 6);
        let closes: Vec<(Option<String>, String, Option<String>)> = plain
            .iter()
            .filter_map(|e| match e {
                wit::Event::Closed((c, x)) => Some((
                    c.conn.peer_identity.clone(),
                    x.response_flags.clone(),
                    x.error.clone(),
                )),
                wit::Event::Opened(_) => None,
            })
            .collect();
        assert_eq!(
            closes,
            [
                (Some(alice.to_string()), "-".to_string(), None),
                (
                    Some(bob.to_string()),
                    "CONNECT".to_string(),
                    Some("connection refused".to_string())
                ),
                (Some(alice.to_string()), "-".to_string(), None),
            ]
        );
        // A new batch starts its strings afresh.
        batch.clear();
        batch.opened(records[1].clone());
        assert_eq!(batch.strings, [bob]);
    }
}
