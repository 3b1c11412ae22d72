//! The SDK's side of `telemetry-batches`: each event's strings, named by position in the batch's `strings`, reach
//! the plugin as the values they name (none for an absent one, even right after an event that had one) with their
//! positions (none for a position past the strings), and each kind of event reaches the right `Telemetry` method
//! with its workloads.
#![allow(clippy::unwrap_used)] // test code: a panic fails the test

use std::cell::RefCell;

use weft_plugin_sdk::bindings::weft::plugin::types::{
    BatchClose, BatchConnection, BatchEvent, CloseInfo, Direction, IpAddress, SocketAddress,
    Verdict, WorkloadMeta,
};
use weft_plugin_sdk::{ConnectionInfo, Telemetry};

/// Writes down what it sees.
#[derive(Default)]
struct Recorder(Vec<String>);

impl Recorder {
    fn note(&mut self, kind: &str, c: &ConnectionInfo<'_>, close: Option<&CloseInfo>) {
        self.0.push(format!(
            "{kind} {} peer={:?}@{:?} svc={:?}@{:?} dst={:?} close={:?}",
            c.conn.id,
            c.conn.peer_identity,
            c.batch_strings.peer_identity,
            c.conn.destination_service,
            c.batch_strings.destination_service,
            c.destination_workload.map(|w| w.name.as_str()),
            close.map(|x| (x.bytes_sent, x.response_flags.as_str(), x.error.as_deref())),
        ));
    }
}

impl Telemetry for Recorder {
    fn configure(_config: &str) -> Result<Self, String> {
        Ok(Recorder::default())
    }
    fn on_open(&mut self, c: &ConnectionInfo<'_>) {
        self.note("open", c, None);
    }
    fn on_close(&mut self, c: &ConnectionInfo<'_>, close: &CloseInfo) {
        self.note("close", c, Some(close));
    }
    fn on_open_close(&mut self, c: &ConnectionInfo<'_>, close: &CloseInfo) {
        self.note("open-close", c, Some(close));
    }
}

thread_local! {
    static SLOT: RefCell<Option<Recorder>> = const { RefCell::new(None) };
}

fn conn(id: u64, peer: Option<u32>, svc: Option<u32>, dst: Option<u32>) -> BatchConnection {
    let at = SocketAddress {
        address: IpAddress::Ipv4(0x0a00_0001),
        port: 80,
    };
    BatchConnection {
        id,
        direction: Direction::Inbound,
        source: at,
        destination: at,
        peer_identity: peer,
        destination_service: svc,
        hbone: true,
        source_workload: None,
        destination_workload: dst,
    }
}

fn close(bytes: u64, flags: u32, error: Option<u32>) -> BatchClose {
    BatchClose {
        bytes_sent: bytes,
        bytes_received: 0,
        duration_ns: 1,
        verdict: Verdict::Allow,
        error,
        response_flags: flags,
    }
}

#[test]
fn strings_and_workloads_are_resolved_per_event() {
    SLOT.with(|s| *s.borrow_mut() = Some(Recorder::default()));
    let strings: Vec<String> = ["alice", "shop/cart", "-", "CONNECT", "refused"]
        .map(String::from)
        .to_vec();
    let text = |s: &str| s.to_string();
    let server = WorkloadMeta {
        uid: text("Kubernetes//Pod/shop/server"),
        name: text("server"),
        namespace: text("shop"),
        service_account: text("backend"),
        trust_domain: text("cluster.local"),
        node: text("node-b"),
        workload_name: text("server"),
        canonical_name: text("server"),
        canonical_revision: text("v1"),
        cluster_id: text("Kubernetes"),
        region: String::new(),
        zone: String::new(),
        labels: Vec::new(),
        authorization_policies: Vec::new(),
    };
    let events = vec![
        BatchEvent::Opened(conn(1, Some(0), Some(1), Some(0))),
        BatchEvent::OpenedClosed((conn(2, None, None, None), close(5, 2, None))),
        BatchEvent::Closed((conn(1, Some(0), Some(1), Some(0)), close(7, 3, Some(4)))),
        // A position past the strings (the host never sends one) reads as absent.
        BatchEvent::Opened(conn(3, Some(99), None, Some(7))),
    ];
    weft_plugin_sdk::__private::telemetry_on_batch::<Recorder>(
        &SLOT,
        vec![server],
        strings,
        events,
    );
    let seen = SLOT.with(|s| s.borrow_mut().take().unwrap().0);
    assert_eq!(
        seen,
        [
            r#"open 1 peer=Some("alice")@Some(0) svc=Some("shop/cart")@Some(1) dst=Some("server") close=None"#,
            r#"open-close 2 peer=None@None svc=None@None dst=None close=Some((5, "-", None))"#,
            r#"close 1 peer=Some("alice")@Some(0) svc=Some("shop/cart")@Some(1) dst=Some("server") close=Some((7, "CONNECT", Some("refused")))"#,
            r#"open 3 peer=None@None svc=None@None dst=None close=None"#,
        ]
    );
}
