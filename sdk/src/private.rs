//! Glue called by the code that `export_policy!` and `export_telemetry!` expand to. Not a public API.

use std::cell::RefCell;
use std::thread::LocalKey;

use crate::bindings::weft::plugin::types::{
    BatchEvent, Connection, ConnectionScope, Decision, Event, EventConnection, StateKinds,
    StateUpdate, Workload, WorkloadMeta,
};
use crate::{ConnectionInfo, Telemetry, TransportPolicy, Workloads};

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

/// `on-batch` of the telemetry world's `telemetry-batches` export: `on-events` with `opened-closed` events,
/// handed to [`Telemetry::on_open_close`].
pub fn telemetry_on_batch<T: Telemetry>(
    slot: &'static Slot<T>,
    workloads: Vec<WorkloadMeta>,
    events: Vec<BatchEvent>,
) {
    let info = |c| resolve(c, &workloads);
    slot.with(|s| {
        if let Some(plugin) = s.borrow_mut().as_mut() {
            for event in &events {
                match event {
                    BatchEvent::Opened(c) => plugin.on_open(&info(c)),
                    BatchEvent::Closed((c, close)) => plugin.on_close(&info(c), close),
                    BatchEvent::OpenedClosed((c, close)) => plugin.on_open_close(&info(c), close),
                }
            }
            plugin.on_batch_end();
        }
    });
}

fn resolve<'a>(c: &'a EventConnection, workloads: &'a [WorkloadMeta]) -> ConnectionInfo<'a> {
    let at = |i: Option<u32>| i.and_then(|i| workloads.get(usize::try_from(i).ok()?));
    ConnectionInfo {
        conn: &c.conn,
        source_workload: at(c.source_workload),
        destination_workload: at(c.destination_workload),
    }
}
