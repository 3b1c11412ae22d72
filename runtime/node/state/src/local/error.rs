//! Errors of the local config file: every one names the file, and those found in the YAML name the field path and
//! the line and column.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// Why a local config file was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read (missing, unreadable, not UTF-8).
    #[error("{}: cannot read config file: {source}", file.display())]
    Read {
        /// The file.
        file: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The YAML is malformed, or a value is invalid (unknown field, bad IP, duplicate uid, ...).
    #[error("{}", render(file, *line, *column, message))]
    Invalid {
        /// The file (`<inline>` for text parsed without a file name).
        file: PathBuf,
        /// 1-based line of the offending value, when known.
        line: Option<usize>,
        /// 1-based column of the offending value, when known.
        column: Option<usize>,
        /// What is wrong, starting with the field path (e.g. `workloads[1].workloadIps[0]: invalid IP address ...`).
        message: String,
    },
}

impl ConfigError {
    /// The 1-based line of the offending value, when known.
    pub fn line(&self) -> Option<usize> {
        match self {
            ConfigError::Read { .. } => None,
            ConfigError::Invalid { line, .. } => *line,
        }
    }

    /// The file the error is about.
    pub fn file(&self) -> &Path {
        match self {
            ConfigError::Read { file, .. } | ConfigError::Invalid { file, .. } => file,
        }
    }

    /// Convert a serde_yaml error, moving its position out of the message into `line` and `column`.
    pub fn from_yaml(file: &Path, err: &serde_yaml::Error) -> Self {
        let location = err.location();
        let mut message = err.to_string();
        if let Some(loc) = &location {
            let suffix = format!(" at line {} column {}", loc.line(), loc.column());
            if let Some(stripped) = message.strip_suffix(&suffix) {
                message = stripped.to_owned();
            }
        }
        ConfigError::Invalid {
            file: file.to_path_buf(),
            line: location.as_ref().map(|l| l.line()),
            column: location.as_ref().map(|l| l.column()),
            message,
        }
    }
}

/// `file: line L, column C: message`.
fn render(file: &Path, line: Option<usize>, column: Option<usize>, message: &str) -> String {
    let mut out = file.display().to_string();
    if let Some(line) = line {
        let _ = write!(out, ": line {line}");
        if let Some(column) = column {
            let _ = write!(out, ", column {column}");
        }
    }
    let _ = write!(out, ": {message}");
    out
}
