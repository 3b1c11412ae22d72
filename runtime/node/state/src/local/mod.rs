//! The local config file: ztunnel's local-config format (`workloads`, `services`, `policies`) accepted unchanged,
//! plus weft's own `plugins` section.
//!
//! ```yaml
//! workloads:
//! - uid: cluster1//v1/Pod/default/local
//!   name: local
//!   namespace: default
//!   serviceAccount: default
//!   workloadIps: ["127.0.0.1"]
//!   protocol: HBONE
//!   node: local
//!   services:
//!     "default/example.com": {80: 8080}
//!   labels: {app: local}            # weft extension
//! services:
//! - name: local
//!   namespace: default
//!   hostname: example.com
//!   vips: ["/127.10.0.1"]
//!   ports: {80: 8080}
//! policies:
//! - name: deny-9999
//!   namespace: default
//!   scope: Namespace
//!   action: Allow
//!   rules: [[[{notDestinationPorts: [9999]}]]]
//! plugins:                          # weft extension
//! - name: allowlist
//!   kind: policy
//!   path: plugins/allowlist.wasm    # relative to this file's directory
//!   config: {allow: ["default"]}
//! ```
//!
//! Errors name the file, the field path and the line: values are checked while they are deserialized (see
//! `values.rs` and `checked.rs`), never afterwards on a position-less tree.

mod checked;
mod convert;
mod error;
mod plugins;
mod values;
mod wire;

use std::path::Path;

pub use convert::{DEFAULT_SERVICE_ACCOUNT, DEFAULT_TRUST_DOMAIN};
pub use error::ConfigError;

use crate::mesh::MeshState;
use crate::model::{PluginSpec, Policy, Service, Workload};

/// A parsed, checked and converted local config file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LocalConfig {
    /// Workloads, in file order.
    pub workloads: Vec<Workload>,
    /// Services, in file order.
    pub services: Vec<Service>,
    /// Authorization policies, in file order.
    pub policies: Vec<Policy>,
    /// Plugin specs, in file order (relative paths already resolved).
    pub plugins: Vec<PluginSpec>,
}

impl LocalConfig {
    /// Build the snapshot this config describes.
    pub fn into_state(self, version: u64) -> MeshState {
        MeshState::new(
            version,
            self.workloads,
            self.services,
            self.policies,
            self.plugins,
        )
    }
}

/// Parse config text that has no file name; relative plugin paths are resolved against `base_dir`.
pub fn parse(text: &str, base_dir: &Path) -> Result<LocalConfig, ConfigError> {
    parse_inner(text, Path::new("<inline>"), base_dir)
}

/// Parse the text of `file` (used in error messages); relative plugin paths are resolved against its directory.
pub fn parse_named(text: &str, file: &Path) -> Result<LocalConfig, ConfigError> {
    parse_inner(text, file, file.parent().unwrap_or(Path::new(".")))
}

/// Read and parse the config file at `path`.
pub fn load(path: &Path) -> Result<LocalConfig, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        file: path.to_path_buf(),
        source,
    })?;
    parse_named(&text, path)
}

fn parse_inner(text: &str, file: &Path, base_dir: &Path) -> Result<LocalConfig, ConfigError> {
    // An empty (or comments-only) file is an empty config.
    let wire: Option<wire::FileWire> =
        serde_yaml::from_str(text).map_err(|e| ConfigError::from_yaml(file, &e))?;
    let wire = wire.unwrap_or_default();
    let mut workloads: Vec<Workload> = wire.workloads.into_iter().map(convert::workload).collect();
    convert::fold_endpoints(&mut workloads, &wire.services);
    Ok(LocalConfig {
        workloads,
        services: wire.services.into_iter().map(convert::service).collect(),
        policies: wire.policies.into_iter().map(convert::policy).collect(),
        plugins: wire
            .plugins
            .into_iter()
            .map(|p| p.into_spec(base_dir))
            .collect(),
    })
}
