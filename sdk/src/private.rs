//! Glue called by the code that `export_policy!` and `export_telemetry!` expand to. Not a public API.

use std::cell::RefCell;
use std::thread::LocalKey;

use crate::bindings::weft::plugin::types::{
    BatchClose, BatchConnection, BatchEvent, CloseInfo, Connection, ConnectionScope, Decision,
    Direction, Event, EventConnection, IpAddress, SocketAddress, StateKinds, StateUpdate, Verdict,
    Workload, WorkloadMeta,
};
use crate::{BatchStrings, ConnectionInfo, Telemetry, TransportPolicy, Workloads};

pub use wit_bindgen;

type Slot<T> = LocalKey<RefCell<Option<T>>>;

/// `configure` of the policy world.
pub fn policy_configure<T: TransportPolicy>(
    slot: &'static Slot<T>,
    config: String,
) -> Result<StateKinds, String> {
    let plugin = T::configure(&config)?;
    let kinds = plugin.state_kinds();
    slot.with(|s| *s.borrow_mut() = Some(plugin));
    Ok(kinds)
}

/// `update-state` of the policy world.
pub fn policy_update_state<T: TransportPolicy>(
    slot: &'static Slot<T>,
    update: StateUpdate,
) -> Result<(), String> {
    slot.with(|s| match s.borrow_mut().as_mut() {
        Some(plugin) => match update {
            StateUpdate::AuthorizationPolicies(policies) => plugin.update_policies(policies),
        },
        None => Err("update-state before configure".to_string()),
    })
}

/// `scope` of the policy world's `authorize-scope` export. Not configured → every connection (the host never asks
/// before `configure`).
pub fn policy_scope<T: TransportPolicy>(slot: &'static Slot<T>) -> ConnectionScope {
    slot.with(|s| match s.borrow().as_ref() {
        Some(plugin) => plugin.scope(),
        None => ConnectionScope::All,
    })
}

/// `authorize` of the policy world. Not configured → deny (the host never does that).
pub fn policy_authorize<T: TransportPolicy>(
    slot: &'static Slot<T>,
    conn: Connection,
    source: Option<&Workload>,
    destination: Option<&Workload>,
) -> Decision {
    let workloads = Workloads {
        source,
        destination,
    };
    slot.with(|s| match s.borrow_mut().as_mut() {
        Some(plugin) => plugin.authorize(&conn, &workloads),
        None => Decision::Deny("plugin not configured".to_string()),
    })
}

/// `configure` of the telemetry world.
pub fn telemetry_configure<T: Telemetry>(
    slot: &'static Slot<T>,
    config: String,
) -> Result<(), String> {
    let plugin = T::configure(&config)?;
    slot.with(|s| *s.borrow_mut() = Some(plugin));
    Ok(())
}

/// `on-events` of the telemetry world: each event's workload indices resolved against the batch's workloads (an
/// index out of range, which the host never sends, reads as an unknown workload).
pub fn telemetry_on_events<T: Telemetry>(
    slot: &'static Slot<T>,
    workloads: Vec<WorkloadMeta>,
    events: Vec<Event>,
) {
    let info = |c| resolve(c, &workloads);
    slot.with(|s| {
        if let Some(plugin) = s.borrow_mut().as_mut() {
            for event in &events {
                match event {
                    Event::Opened(c) => plugin.on_open(&info(c)),
                    Event::Closed((c, close)) => plugin.on_close(&info(c), close),
                }
            }
            plugin.on_batch_end();
        }
    });
}

/// `on-batch` of the telemetry world's `telemetry-batches` export: `on-events` with `opened-closed` events (handed
/// to [`Telemetry::on_open_close`]) and strings named by position in `strings`. Each event is handed over as the
/// same [`Connection`] and [`CloseInfo`] values, refilled in place: their string buffers are reused, so an event
/// costs no allocation.
pub fn telemetry_on_batch<T: Telemetry>(
    slot: &'static Slot<T>,
    workloads: Vec<WorkloadMeta>,
    strings: Vec<String>,
    events: Vec<BatchEvent>,
) {
    let mut scratch = Scratch::default();
    slot.with(|s| {
        if let Some(plugin) = s.borrow_mut().as_mut() {
            for event in &events {
                match event {
                    BatchEvent::Opened(c) => {
                        let conn = scratch.connection(c, &strings);
                        plugin.on_open(&info(conn, c, &workloads, &strings));
                    }
                    BatchEvent::Closed((c, x)) => {
                        let (conn, close) = scratch.both(c, x, &strings);
                        plugin.on_close(&info(conn, c, &workloads, &strings), close);
                    }
                    BatchEvent::OpenedClosed((c, x)) => {
                        let (conn, close) = scratch.both(c, x, &strings);
                        plugin.on_open_close(&info(conn, c, &workloads, &strings), close);
                    }
                }
            }
            plugin.on_batch_end();
        }
    });
}

/// The connection and close values a batch's events are refilled into.
struct Scratch {
    conn: Connection,
    close: CloseInfo,
}

impl Default for Scratch {
    fn default() -> Self {
        let nowhere = SocketAddress {
            address: IpAddress::Ipv4(0),
            port: 0,
        };
        Scratch {
            conn: Connection {
                id: 0,
                direction: Direction::Inbound,
                source: nowhere,
                destination: nowhere,
                peer_identity: None,
                destination_service: None,
                hbone: false,
            },
            close: CloseInfo {
                bytes_sent: 0,
                bytes_received: 0,
                duration_ns: 0,
                verdict: Verdict::Allow,
                error: None,
                response_flags: String::new(),
            },
        }
    }
}

/// The string at position `at` of a batch (none past its end: the host never sends such a position).
fn text(strings: &[String], at: Option<u32>) -> Option<&str> {
    at.and_then(|i| strings.get(usize::try_from(i).ok()?))
        .map(String::as_str)
}

/// Sets `slot` to `value`, reusing its buffer.
fn refill(slot: &mut Option<String>, value: Option<&str>) {
    match (slot.as_mut(), value) {
        (Some(buf), Some(v)) => {
            buf.clear();
            buf.push_str(v);
        }
        (None, Some(v)) => *slot = Some(v.to_owned()),
        (_, None) => *slot = None,
    }
}

impl Scratch {
    fn connection(&mut self, c: &BatchConnection, strings: &[String]) -> &Connection {
        let conn = &mut self.conn;
        conn.id = c.id;
        conn.direction = c.direction;
        conn.source = c.source;
        conn.destination = c.destination;
        conn.hbone = c.hbone;
        refill(&mut conn.peer_identity, text(strings, c.peer_identity));
        refill(
            &mut conn.destination_service,
            text(strings, c.destination_service),
        );
        &self.conn
    }

    fn both(
        &mut self,
        c: &BatchConnection,
        x: &BatchClose,
        strings: &[String],
    ) -> (&Connection, &CloseInfo) {
        self.connection(c, strings);
        let close = &mut self.close;
        close.bytes_sent = x.bytes_sent;
        close.bytes_received = x.bytes_received;
        close.duration_ns = x.duration_ns;
        close.verdict.clone_from(&x.verdict);
        refill(&mut close.error, text(strings, x.error));
        close.response_flags.clear();
        close
            .response_flags
            .push_str(text(strings, Some(x.response_flags)).unwrap_or_default());
        (&self.conn, &self.close)
    }
}

fn info<'a>(
    conn: &'a Connection,
    c: &BatchConnection,
    workloads: &'a [WorkloadMeta],
    strings: &[String],
) -> ConnectionInfo<'a> {
    // A position past the strings resolved to none: it names nothing.
    let named = |i: Option<u32>| i.filter(|&i| usize::try_from(i).is_ok_and(|i| i < strings.len()));
    ConnectionInfo {
        conn,
        source_workload: workload_at(workloads, c.source_workload),
        destination_workload: workload_at(workloads, c.destination_workload),
        batch_strings: BatchStrings {
            peer_identity: named(c.peer_identity),
            destination_service: named(c.destination_service),
        },
    }
}

fn resolve<'a>(c: &'a EventConnection, workloads: &'a [WorkloadMeta]) -> ConnectionInfo<'a> {
    ConnectionInfo {
        conn: &c.conn,
        source_workload: workload_at(workloads, c.source_workload),
        destination_workload: workload_at(workloads, c.destination_workload),
        batch_strings: BatchStrings::default(),
    }
}

/// The workload at position `at` of a batch (none past its end: the host never sends such a position).
fn workload_at(workloads: &[WorkloadMeta], at: Option<u32>) -> Option<&WorkloadMeta> {
    at.and_then(|i| workloads.get(usize::try_from(i).ok()?))
}
