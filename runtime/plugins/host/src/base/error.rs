//! The host's errors: why a plugin version was rejected, and why a call failed.

use std::fmt;

/// Why a plugin version (or a state update) was rejected. The previous version keeps serving.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The code could not be read.
    #[error("cannot read plugin code from {path}: {source}")]
    Read {
        /// The path.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The sha256 of the code is not the one the spec expects.
    #[error("sha256 mismatch: expected {expected}, got {actual}")]
    Sha256Mismatch {
        /// From the spec.
        expected: String,
        /// Of the code.
        actual: String,
    },
    /// Not a valid component (garbage, a core module, a compile error).
    #[error("not a valid WebAssembly component: {0}")]
    Compile(String),
    /// The compiler process could not compile it (could not start, crashed, timed out, wrote a bad artifact).
    #[error("the plugin compiler failed: {0}")]
    Compiler(String),
    /// A component of another world (e.g. a telemetry plugin loaded as a policy plugin), or with imports the host
    /// does not offer (WASI, network, filesystem...).
    #[error("component does not fit the {world} world: {reason}")]
    WrongWorld {
        /// The world expected from the spec's kind.
        world: &'static str,
        /// What does not fit.
        reason: String,
    },
    /// Instantiation failed (e.g. no free instance slot, a start function trapped).
    #[error("instantiation failed: {0}")]
    Instantiate(String),
    /// `configure` returned an error.
    #[error("configure rejected the config: {0}")]
    Configure(String),
    /// `update-state` returned an error.
    #[error("update-state rejected the state: {0}")]
    State(String),
    /// A call during loading trapped or ran out of time.
    #[error("{stage} failed: {error}")]
    Call {
        /// `configure` or `update-state`.
        stage: &'static str,
        /// The failure.
        error: CallError,
    },
    /// The loading thread went away.
    #[error("loader failed: {0}")]
    Internal(String),
}

/// What kind of failure a call had (a label of `weft_plugin_errors_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The call overran its deadline (epoch interruption).
    Timeout,
    /// The instance hit its memory cap.
    Memory,
    /// The wasm stack overflowed.
    StackOverflow,
    /// Any other trap (unreachable, out-of-bounds access, a plugin panic...).
    Trap,
    /// The plugin returned something the host refuses (e.g. an oversized deny reason).
    BadOutput,
    /// No instance could be created (a background refill failed to instantiate or configure one).
    Instantiate,
    /// No configured instance was ready when the call came (the pool is exhausted: instances were lost to
    /// failures faster than the background refill replaces them, or more threads call at once than the pool
    /// holds). The failure policy applies at once; the call never instantiates on the caller's thread.
    NoInstance,
}

impl ErrorKind {
    /// All kinds, for pre-created metric series.
    pub const ALL: [ErrorKind; 7] = [
        ErrorKind::Timeout,
        ErrorKind::Memory,
        ErrorKind::StackOverflow,
        ErrorKind::Trap,
        ErrorKind::BadOutput,
        ErrorKind::Instantiate,
        ErrorKind::NoInstance,
    ];

    /// Lowercase name for labels and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::Timeout => "timeout",
            ErrorKind::Memory => "memory",
            ErrorKind::StackOverflow => "stack_overflow",
            ErrorKind::Trap => "trap",
            ErrorKind::BadOutput => "bad_output",
            ErrorKind::Instantiate => "instantiate",
            ErrorKind::NoInstance => "no_instance",
        }
    }
}

/// A failed call: its kind and a message. The instance it ran on is thrown away.
#[derive(Debug, Clone)]
pub struct CallError {
    /// The kind.
    pub kind: ErrorKind,
    /// Details.
    pub message: String,
}

impl fmt::Display for CallError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.kind.as_str(), self.message)
    }
}

impl std::error::Error for CallError {}
