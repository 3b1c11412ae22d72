//! weft's fuzz targets as plain functions, one per thing a peer or an operator can feed weft, so the cargo-fuzz
//! binaries (`fuzz_targets/`, nightly) and the stable replay test (`tests/replay.rs`, seeds and regressions) run
//! the same code. Each function panics only when an invariant of the code under test is broken.

pub mod ca_csr;
pub mod connect_headers;
pub mod hbone_connect;
pub mod local_config;
pub mod mem;
pub mod plugin_json;
pub mod socks5_request;
pub mod tls_records;

/// A target's entry point: one input.
pub type Target = fn(&[u8]);

/// Every target, by the name of its cargo-fuzz binary and of its seed directory.
pub const TARGETS: &[(&str, Target)] = &[
    ("hbone_connect", hbone_connect::run),
    ("connect_headers", connect_headers::run),
    ("socks5_request", socks5_request::run),
    ("local_config", local_config::run),
    ("plugin_json", plugin_json::run),
    ("ca_csr", ca_csr::run),
    ("tls_records", tls_records::run),
];

/// A current-thread tokio runtime whose clock is paused (it jumps to the next timer when every task is idle), so
/// an input can never wait on a real timer.
pub fn paused_runtime() -> tokio::runtime::Runtime {
    match tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
    {
        Ok(rt) => rt,
        Err(e) => panic!("cannot build a tokio runtime: {e}"),
    }
}
