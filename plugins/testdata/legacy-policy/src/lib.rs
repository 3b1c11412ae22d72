//! `legacy-policy`: a transport-policy plugin exporting only `weft:plugin/policy`, as every policy plugin did
//! before the optional `authorize-scope` export existed (the SDK's `export_policy!` now exports both). The host
//! must keep loading such plugins and ask them about every connection they select. It denies destination port 666
//! and allows everything else; it wants no state.

#![allow(unsafe_code, missing_docs)] // the generated export glue

weft_plugin_sdk::__private::wit_bindgen::generate!({
    path: "../../../sdk/wit",
    world: "transport-policy-core",
    runtime_path: "::weft_plugin_sdk::__private::wit_bindgen::rt",
    with: {
        "weft:plugin/types@0.1.0": ::weft_plugin_sdk::bindings::weft::plugin::types,
        "weft:plugin/log@0.1.0": ::weft_plugin_sdk::bindings::weft::plugin::log,
        "weft:plugin/metrics@0.1.0": ::weft_plugin_sdk::bindings::weft::plugin::metrics,
        "weft:plugin/clock@0.1.0": ::weft_plugin_sdk::bindings::weft::plugin::clock,
    },
});

use weft_plugin_sdk::bindings::weft::plugin::types::{
    Connection, Decision, StateKinds, StateUpdate, Workload,
};

struct Legacy;

impl exports::weft::plugin::policy::Guest for Legacy {
    fn configure(_config: String) -> Result<StateKinds, String> {
        Ok(StateKinds::empty())
    }

    fn update_state(_update: StateUpdate) -> Result<(), String> {
        Ok(())
    }

    fn authorize(
        conn: Connection,
        _source: Option<&Workload>,
        _destination: Option<&Workload>,
    ) -> Decision {
        if conn.destination.port == 666 {
            Decision::Deny("legacy-policy denies port 666".to_string())
        } else {
            Decision::Allow
        }
    }
}

export!(Legacy);
