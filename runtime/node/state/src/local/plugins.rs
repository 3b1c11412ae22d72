//! weft's `plugins` section of the local config file: which Wasm components the node runs, where their code comes
//! from, their configuration, and which workloads and directions they apply to.

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;

use serde::{Deserialize, Deserializer};
use sha2::{Digest, Sha256};

use super::checked::deserialize_checked_list;
use super::values::{Base64Bytes, Sha256Hex};
use crate::model::{
    FailurePolicy, PluginDirections, PluginKind, PluginSource, PluginSpec, WorkloadSelector,
};

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "lowercase")]
enum KindWire {
    Policy,
    Telemetry,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "camelCase")]
enum FailurePolicyWire {
    FailClosed,
    FailOpen,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "lowercase")]
enum DirectionWire {
    Inbound,
    Outbound,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct SelectorWire {
    #[serde(default)]
    namespaces: Vec<String>,
    #[serde(default)]
    workloads: Vec<String>,
}

/// One entry of `plugins`, as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct PluginFields {
    name: String,
    kind: KindWire,
    #[serde(default)]
    path: Option<String>,
    #[serde(default)]
    inline: Option<Base64Bytes>,
    #[serde(default)]
    sha256: Option<Sha256Hex>,
    #[serde(default)]
    config: Option<serde_yaml::Value>,
    #[serde(default)]
    failure_policy: Option<FailurePolicyWire>,
    #[serde(default)]
    priority: i32,
    #[serde(default)]
    selector: SelectorWire,
    #[serde(default)]
    directions: Option<Vec<DirectionWire>>,
    #[serde(default = "default_recheck")]
    recheck: bool,
}

fn default_recheck() -> bool {
    true
}

/// Where the code comes from, before relative paths are resolved.
#[derive(Debug, Clone)]
enum SourceWire {
    Path(String),
    Inline(Vec<u8>),
}

/// One entry of `plugins`, checked; only the path resolution remains (it needs the file's directory).
#[derive(Debug, Clone)]
pub(crate) struct PluginWire {
    name: String,
    kind: PluginKind,
    source: SourceWire,
    sha256: Option<String>,
    config: String,
    failure_policy: FailurePolicy,
    priority: i32,
    selector: WorkloadSelector,
    directions: PluginDirections,
    recheck: bool,
}

impl PluginWire {
    /// The spec, with a relative `path` resolved against `base_dir` (the config file's directory).
    pub(crate) fn into_spec(self, base_dir: &Path) -> PluginSpec {
        let source = match self.source {
            SourceWire::Path(p) => {
                let p = Path::new(&p);
                PluginSource::Path(if p.is_absolute() {
                    p.to_path_buf()
                } else {
                    base_dir.join(p)
                })
            }
            SourceWire::Inline(bytes) => PluginSource::Inline(Arc::new(bytes)),
        };
        PluginSpec {
            name: self.name,
            kind: self.kind,
            source,
            sha256: self.sha256,
            config: self.config,
            failure_policy: self.failure_policy,
            priority: self.priority,
            selector: self.selector,
            directions: self.directions,
            recheck: self.recheck,
            rollout: None,
            shadow: None,
        }
    }
}

/// `plugins:`: each entry checked in place; names must be unique.
pub(crate) fn deserialize_plugins<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Vec<PluginWire>, D::Error> {
    let mut names = HashSet::new();
    deserialize_checked_list(d, "plugin", move |_, fields: PluginFields| {
        let plugin = check(fields)?;
        if !names.insert(plugin.name.clone()) {
            return Err(format!("duplicate plugin name {:?}", plugin.name));
        }
        Ok(plugin)
    })
}

fn check(f: PluginFields) -> Result<PluginWire, String> {
    let name = f.name.trim().to_owned();
    if name.is_empty() {
        return Err("plugin `name` must not be empty".to_owned());
    }
    let source = match (f.path, f.inline) {
        (Some(_), Some(_)) => {
            return Err(format!(
                "plugin {name:?}: set exactly one of `path` or `inline`, not both"
            ));
        }
        (None, None) => {
            return Err(format!(
                "plugin {name:?}: set one of `path` (a file) or `inline` (base64 of the component)"
            ));
        }
        (Some(p), None) if p.trim().is_empty() => {
            return Err(format!("plugin {name:?}: `path` must not be empty"));
        }
        (Some(p), None) => SourceWire::Path(p),
        (None, Some(b)) => SourceWire::Inline(b.0),
    };
    let sha256 = f.sha256.map(|h| h.0);
    if let (SourceWire::Inline(bytes), Some(expected)) = (&source, &sha256) {
        let actual = hex::encode(Sha256::digest(bytes));
        if &actual != expected {
            return Err(format!(
                "plugin {name:?}: `inline` has sha256 {actual}, but `sha256` says {expected}"
            ));
        }
    }
    let config = match f.config {
        None => "{}".to_owned(),
        Some(serde_yaml::Value::String(s)) => s,
        Some(v) => serde_json::to_string(&v)
            .map_err(|e| format!("plugin {name:?}: `config` cannot be turned into JSON: {e}"))?,
    };
    let kind = match f.kind {
        KindWire::Policy => PluginKind::Policy,
        KindWire::Telemetry => PluginKind::Telemetry,
    };
    let failure_policy = match (f.failure_policy, kind) {
        (Some(FailurePolicyWire::FailClosed), _) | (None, PluginKind::Policy) => {
            FailurePolicy::FailClosed
        }
        (Some(FailurePolicyWire::FailOpen), _) | (None, PluginKind::Telemetry) => {
            FailurePolicy::FailOpen
        }
    };
    let directions = match f.directions {
        None => PluginDirections::default(),
        Some(list) if list.is_empty() => {
            return Err(format!(
                "plugin {name:?}: `directions` must name at least one of inbound, outbound"
            ));
        }
        Some(list) => PluginDirections {
            inbound: list.iter().any(|d| matches!(d, DirectionWire::Inbound)),
            outbound: list.iter().any(|d| matches!(d, DirectionWire::Outbound)),
        },
    };
    Ok(PluginWire {
        name,
        kind,
        source,
        sha256,
        config,
        failure_policy,
        priority: f.priority,
        selector: WorkloadSelector {
            namespaces: f.selector.namespaces,
            workloads: f.selector.workloads,
        },
        directions,
        recheck: f.recheck,
    })
}
