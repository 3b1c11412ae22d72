//! A mesh of real weft processes on one machine: node processes with their admin endpoints and logs, echo
//! workloads, a `weft-control` process, a SOCKS5 client, an upstream DNS server, plain HTTP/1.1 requests, and a way
//! to run code inside a network namespace. Used by `weft-demo` and by the conformance suite, so both exercise
//! exactly the same thing.

pub mod control;
pub mod dns;
pub mod http;
pub mod netns;
pub mod node;
pub mod socks5;
pub mod workload;

pub use node::{NodeOptions, NodeProcess};

use std::path::{Path, PathBuf};

pub use weft_testkit::ca::write_dev_ca;

/// The weft binary: `$WEFT_BIN`, or `weft` in the target directory that holds the running executable
/// (`target/<profile>/deps/<test>` → `target/<profile>/weft`).
pub fn weft_binary() -> Result<PathBuf, String> {
    sibling_binary("weft", "WEFT_BIN", "weft")
}

/// The control plane binary: `$WEFT_CONTROL_BIN`, or `weft-control` found as [`weft_binary`] is.
pub fn control_binary() -> Result<PathBuf, String> {
    sibling_binary("weft-control", "WEFT_CONTROL_BIN", "weft-control")
}

/// `$env`, else `name` in the directory of the running executable or up to two above it.
fn sibling_binary(name: &str, env: &str, package: &str) -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os(env) {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
    for _ in 0..3 {
        let cand = dir.join(name);
        if cand.is_file() {
            return Ok(cand);
        }
        if !dir.pop() {
            break;
        }
    }
    Err(format!(
        "{name} binary not found next to {}; build it first (`cargo build -p {package}`) or set {env}",
        exe.display()
    ))
}
