//! Why logging could not be set up.

/// Why [`crate::init`] failed.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    /// The filter is not tracing `EnvFilter` syntax.
    #[error("bad log filter {filter:?}: {reason}")]
    BadFilter {
        /// The filter as given.
        filter: String,
        /// What the parser said.
        reason: String,
    },
    /// The writer thread did not start.
    #[error("starting the log writer thread: {0}")]
    Writer(#[from] std::io::Error),
    /// A global subscriber was already installed.
    #[error("installing the log subscriber: {0}")]
    Install(#[from] tracing_subscriber::util::TryInitError),
}
