//! Builds `plugins/port-allowlist` for wasm32-wasip2 and embeds it: the policy plugin the demo pushes over xDS.

fn main() {
    weft_plugin_build::embed(&["port-allowlist"]);
}
