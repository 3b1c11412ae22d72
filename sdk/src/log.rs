//! Logging into the proxy's log. The host rate-limits each plugin and truncates long messages, so log decisions
//! sparingly (count them with [`crate::metrics`] instead).
//!
//! ```no_run
//! weft_plugin_sdk::info!("configured with {} rules", 3);
//! weft_plugin_sdk::log::warn("something odd");
//! ```

pub use crate::bindings::weft::plugin::log::{AccessEntry, Level};

/// Logs one message at `level`.
pub fn log(level: Level, message: &str) {
    crate::bindings::weft::plugin::log::log(level, message);
}

/// Writes one connection's access log line: the host logs it as ztunnel does, under scope `access` with the
/// message "connection complete" and ztunnel's field names, at error level when `entry.error` is set. Rate-limited
/// with [`log`].
pub fn access(entry: &AccessEntry) {
    crate::bindings::weft::plugin::log::access(entry);
}

/// Logs at trace level.
pub fn trace(message: &str) {
    log(Level::Trace, message);
}
/// Logs at debug level.
pub fn debug(message: &str) {
    log(Level::Debug, message);
}
/// Logs at info level.
pub fn info(message: &str) {
    log(Level::Info, message);
}
/// Logs at warn level.
pub fn warn(message: &str) {
    log(Level::Warn, message);
}
/// Logs at error level.
pub fn error(message: &str) {
    log(Level::Error, message);
}

/// `format!`-style logging at debug level.
#[macro_export]
macro_rules! debug {
    ($($arg:tt)*) => { $crate::log::debug(&::std::format!($($arg)*)) };
}
/// `format!`-style logging at info level.
#[macro_export]
macro_rules! info {
    ($($arg:tt)*) => { $crate::log::info(&::std::format!($($arg)*)) };
}
/// `format!`-style logging at warn level.
#[macro_export]
macro_rules! warn {
    ($($arg:tt)*) => { $crate::log::warn(&::std::format!($($arg)*)) };
}
/// `format!`-style logging at error level.
#[macro_export]
macro_rules! error {
    ($($arg:tt)*) => { $crate::log::error(&::std::format!($($arg)*)) };
}
