//! Builds the default plugins (`plugins/istio-authz`, `plugins/istio-telemetry`) for wasm32-wasip2 and embeds them
//! in the weft binary, so a node enforces Istio's L4 policy and exports Istio's metrics with no plugin files on
//! disk. They build in `<repo>/target-wasm`, shared with the tests' plugin builds under the same lock.

fn main() {
    weft_plugin_build::embed(&["istio-authz", "istio-telemetry"]);
}
