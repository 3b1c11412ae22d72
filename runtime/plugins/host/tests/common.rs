//! Shared helpers for the plugin-host integration tests: building the repository's plugins and making specs.
#![allow(clippy::unwrap_used)] // a test panics to fail
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::Arc;

use weft_plugin_host::testing::{build_plugin, spec};
use weft_plugin_host::{HostConfig, PluginHost};
use weft_state::{PluginKind, PluginSpec};

pub fn allowlist() -> PathBuf {
    build_plugin("plugins/port-allowlist").expect("build port-allowlist")
}

pub fn counter() -> PathBuf {
    build_plugin("plugins/conn-counter").expect("build conn-counter")
}

pub fn misbehave() -> PathBuf {
    build_plugin("plugins/testdata/misbehave").expect("build misbehave")
}

pub fn policy(name: &str, wasm: &std::path::Path, config: &str) -> Arc<PluginSpec> {
    Arc::new(spec(name, PluginKind::Policy, wasm, config))
}

pub fn telemetry(name: &str, wasm: &std::path::Path, config: &str) -> Arc<PluginSpec> {
    Arc::new(spec(name, PluginKind::Telemetry, wasm, config))
}

pub fn host() -> PluginHost {
    PluginHost::new(HostConfig {
        prewarm_instances: 2,
        ..HostConfig::default()
    })
    .expect("host")
}

pub const PEER: &str = "spiffe://cluster.local/ns/shop/sa/frontend";

/// [`weft_plugin_host::testing::pinned_code`].
pub fn pinned_code(wasm: &std::path::Path) -> weft_state::PluginSource {
    weft_plugin_host::testing::pinned_code(wasm).expect("read plugin")
}

/// A policy plugin built without the optional `authorize-scope` export (as plugins were before it existed).
pub fn legacy_policy() -> PathBuf {
    build_plugin("plugins/testdata/legacy-policy").expect("build legacy-policy")
}
