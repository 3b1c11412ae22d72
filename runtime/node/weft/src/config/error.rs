//! Why a [`super::NodeConfig`] was refused: each error names the flag (or the config file and its key).

/// A config that cannot run, with the flag to fix.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The command line does not parse (clap's message names the flag).
    #[error("{0}")]
    Flags(String),
    /// `--config-file` could not be read or is not YAML.
    #[error("--config-file {path}: {reason}")]
    File {
        /// The file.
        path: String,
        /// What went wrong.
        reason: String,
    },
    /// A key of `--config-file` that names no setting.
    #[error(
        "--config-file: unknown key `{0}` (keys are the flags' names in camelCase, e.g. `caKind` under `ca`)"
    )]
    UnknownKey(String),
    /// A setting's value is refused.
    #[error("{flag}: {reason}")]
    Invalid {
        /// The flag, e.g. `--node`.
        flag: String,
        /// Why.
        reason: String,
    },
}

impl ConfigError {
    pub(crate) fn invalid(flag: &str, reason: impl Into<String>) -> Self {
        ConfigError::Invalid {
            flag: flag.to_owned(),
            reason: reason.into(),
        }
    }
}
