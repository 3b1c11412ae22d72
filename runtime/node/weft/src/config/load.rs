//! Reading `weft run`'s [`NodeConfig`] once: the flags and their env vars (clap), then the optional YAML file of
//! `--config-file` under them, the cluster id as ztunnel takes it, and [`NodeConfig::validate`].
//!
//! Precedence, per setting: flag, env var, config file, default. Which settings the flags or env vars gave is
//! clap's `ValueSource`; the file fills every other one it names.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use clap::parser::ValueSource;
use clap::{ArgMatches, Args, FromArgMatches};
use serde_json::{Map, Value};

use super::{ConfigError, NodeConfig};

/// `--config-file`, beside the settings it may hold.
#[derive(Debug, Args)]
struct FileArg {
    /// YAML file with `weft run`'s settings: the flags' names in camelCase, grouped as /config_dump's nodeConfig
    /// shows them (e.g. `node: n1`, `ca: {caKind: istio}`, `tuning: {logLinger: 0s}`). A flag or env var given
    /// wins over the file, the file over the defaults.
    #[arg(long, env = "WEFT_CONFIG_FILE")]
    config_file: Option<PathBuf>,
}

/// `weft run`'s command line as read: the settings, the config file, and which settings the flags or env vars
/// gave (the file does not override those).
#[derive(Debug)]
pub struct RunArgs {
    /// The settings from flags, env vars and defaults.
    pub config: NodeConfig,
    /// `--config-file`.
    pub config_file: Option<PathBuf>,
    /// Ids (field names) of the settings a flag or env var gave.
    pub explicit: BTreeSet<String>,
}

impl FromArgMatches for RunArgs {
    fn from_arg_matches(m: &ArgMatches) -> Result<Self, clap::Error> {
        let explicit = m
            .ids()
            .filter(|id| {
                matches!(
                    m.value_source(id.as_str()),
                    Some(ValueSource::CommandLine | ValueSource::EnvVariable)
                )
            })
            .map(|id| id.as_str().to_owned())
            .collect();
        Ok(Self {
            config: NodeConfig::from_arg_matches(m)?,
            config_file: FileArg::from_arg_matches(m)?.config_file,
            explicit,
        })
    }

    fn update_from_arg_matches(&mut self, m: &ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(m)?;
        Ok(())
    }
}

impl Args for RunArgs {
    fn augment_args(cmd: clap::Command) -> clap::Command {
        FileArg::augment_args(NodeConfig::augment_args(cmd))
    }

    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        Self::augment_args(cmd)
    }
}

impl NodeConfig {
    /// The config `weft run <args>` would run with (flags, the env vars, `--config-file`), validated; the
    /// cluster id from `ISTIO_META_CLUSTER_ID` when set. For embedding a node ([`crate::start`]).
    pub fn from_args<I, T>(args: I) -> Result<Self, ConfigError>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        let cmd = RunArgs::augment_args(clap::Command::new("weft run").no_binary_name(true));
        let matches = cmd
            .try_get_matches_from(args)
            .map_err(|e| ConfigError::Flags(e.to_string()))?;
        let args =
            RunArgs::from_arg_matches(&matches).map_err(|e| ConfigError::Flags(e.to_string()))?;
        load(args, std::env::var("ISTIO_META_CLUSTER_ID").ok())
    }
}

/// The node's config: the flags and env vars over `--config-file` over the defaults; the cluster id from
/// `ISTIO_META_CLUSTER_ID` when set (`istio_meta_cluster_id`, ztunnel's rule), validated.
pub fn load(
    args: RunArgs,
    istio_meta_cluster_id: Option<String>,
) -> Result<NodeConfig, ConfigError> {
    let mut config = match &args.config_file {
        None => args.config,
        Some(path) => {
            let file = read_file(path)?;
            merge(args.config, &file, &args.explicit)?
        }
    };
    config.cluster_id = crate::xds::cluster_id(istio_meta_cluster_id, &config.cluster_id);
    config.validate()?;
    Ok(config)
}

fn read_file(path: &Path) -> Result<Value, ConfigError> {
    let err = |reason: String| ConfigError::File {
        path: path.display().to_string(),
        reason,
    };
    let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
    match serde_yaml::from_str::<Value>(&text).map_err(|e| err(e.to_string()))? {
        Value::Null => Ok(Value::Object(Map::new())),
        v @ Value::Object(_) => Ok(v),
        _ => Err(err("expected a mapping of settings".to_owned())),
    }
}

/// `flags` with the settings of `file` that no flag or env var gave (`explicit`).
fn merge(
    flags: NodeConfig,
    file: &Value,
    explicit: &BTreeSet<String>,
) -> Result<NodeConfig, ConfigError> {
    let base = serde_json::to_value(&flags)
        .map_err(|e| ConfigError::invalid("--config-file", e.to_string()))?;
    let mut merged = base.clone();
    let mut taken = Vec::new();
    overlay(&mut merged, file, explicit, &mut Vec::new(), &mut taken)?;
    serde_json::from_value(merged).map_err(|e| blame(&base, &taken, e))
}

/// Copies `file`'s settings into `into`, section by section; records the path of each one taken.
fn overlay(
    into: &mut Value,
    file: &Value,
    explicit: &BTreeSet<String>,
    path: &mut Vec<String>,
    taken: &mut Vec<(Vec<String>, Value)>,
) -> Result<(), ConfigError> {
    let Some(file) = file.as_object() else {
        return Err(ConfigError::UnknownKey(path.join(".")));
    };
    for (key, value) in file {
        path.push(key.clone());
        let slot = into
            .get_mut(key)
            .ok_or_else(|| ConfigError::UnknownKey(path.join(".")))?;
        if slot.is_object() {
            overlay(slot, value, explicit, path, taken)?;
        } else if !explicit.contains(&snake(key)) {
            *slot = value.clone();
            taken.push((path.clone(), value.clone()));
        }
        path.pop();
    }
    Ok(())
}

/// The error of the first file setting that alone makes the defaults unreadable, named by its flag.
fn blame(base: &Value, taken: &[(Vec<String>, Value)], whole: serde_json::Error) -> ConfigError {
    for (path, value) in taken {
        let mut one = base.clone();
        let mut slot = &mut one;
        for key in path {
            slot = &mut slot[key.as_str()];
        }
        *slot = value.clone();
        if let Err(e) = serde_json::from_value::<NodeConfig>(one) {
            let key = path.last().map_or("", String::as_str);
            return ConfigError::invalid(
                &format!("--{}", snake(key).replace('_', "-")),
                format!("`{}` in --config-file: {e}", path.join(".")),
            );
        }
    }
    ConfigError::invalid("--config-file", whole.to_string())
}

/// `caKind` → `ca_kind` (the clap id of the flag `--ca-kind`).
fn snake(key: &str) -> String {
    let mut out = String::with_capacity(key.len() + 4);
    for c in key.chars() {
        if c.is_ascii_uppercase() {
            out.push('_');
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}
