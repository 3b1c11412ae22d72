//! `legacy-telemetry`: a telemetry plugin exporting only `weft:plugin/telemetry`, as every telemetry plugin did
//! before the optional `telemetry-batches` export existed (the SDK's `export_telemetry!` now exports both). The
//! host must keep loading it and hand it every open and every close, in order. It counts them
//! (`legacy_opened_total`, `legacy_closed_total`) and counts a close whose open it never saw in
//! `legacy_unmatched_closes_total`.

#![allow(unsafe_code, missing_docs)] // the generated export glue

use std::cell::RefCell;
use std::collections::HashSet;

use weft_plugin_sdk::bindings::weft::plugin::types::{Event, WorkloadMeta};
use weft_plugin_sdk::metrics::Counter;

weft_plugin_sdk::__private::wit_bindgen::generate!({
    path: "../../../sdk/wit",
    world: "telemetry-sink-core",
    runtime_path: "::weft_plugin_sdk::__private::wit_bindgen::rt",
    with: {
        "weft:plugin/types@0.1.0": ::weft_plugin_sdk::bindings::weft::plugin::types,
        "weft:plugin/log@0.1.0": ::weft_plugin_sdk::bindings::weft::plugin::log,
        "weft:plugin/metrics@0.1.0": ::weft_plugin_sdk::bindings::weft::plugin::metrics,
        "weft:plugin/clock@0.1.0": ::weft_plugin_sdk::bindings::weft::plugin::clock,
    },
});

struct Counters {
    opened: Counter,
    closed: Counter,
    unmatched: Counter,
    open: HashSet<u64>,
}

thread_local! {
    static STATE: RefCell<Option<Counters>> = const { RefCell::new(None) };
}

struct Legacy;

impl exports::weft::plugin::telemetry::Guest for Legacy {
    fn configure(_config: String) -> Result<(), String> {
        let counters = Counters {
            opened: Counter::define("legacy_opened", "Opens seen.", &[])?,
            closed: Counter::define("legacy_closed", "Closes seen.", &[])?,
            unmatched: Counter::define(
                "legacy_unmatched_closes",
                "Closes whose open was not seen before.",
                &[],
            )?,
            open: HashSet::new(),
        };
        STATE.with(|s| *s.borrow_mut() = Some(counters));
        Ok(())
    }

    fn on_events(_workloads: Vec<WorkloadMeta>, events: Vec<Event>) {
        STATE.with(|s| {
            let mut s = s.borrow_mut();
            let Some(c) = s.as_mut() else { return };
            for event in &events {
                match event {
                    Event::Opened(e) => {
                        c.open.insert(e.conn.id);
                        c.opened.inc(&[]);
                    }
                    Event::Closed((e, _)) => {
                        if !c.open.remove(&e.conn.id) {
                            c.unmatched.inc(&[]);
                        }
                        c.closed.inc(&[]);
                    }
                }
            }
        });
    }
}

export!(Legacy);
