//! The SDK plugin authors use to write weft plugins in Rust: implement [`TransportPolicy`] or [`Telemetry`], export
//! it with [`export_policy!`] or [`export_telemetry!`], and build the crate for `wasm32-wasip2`.
//!
//! weft runs plugins as sandboxed WebAssembly components (interface: the `weft:plugin` WIT package in this crate's
//! `wit/` folder). A policy plugin decides on each connection once, before any payload byte is forwarded; a telemetry
//! plugin sees every connection open and close, off the connection's path. Plugins never see payload bytes, and
//! have no filesystem, network or environment: they get their configuration string, control-plane state (the
//! authorization policies, if they ask for them), logging, metrics and a monotonic clock.
//!
//! # A complete policy plugin
//!
//! `Cargo.toml`:
//!
//! ```toml
//! [package]
//! name = "port-guard"
//! edition = "2024"
//!
//! [lib]
//! crate-type = ["cdylib"]
//!
//! [dependencies]
//! weft-plugin-sdk = { path = "../weft/sdk" }
//!
//! [profile.release]
//! panic = "abort"      # no unwinding machinery, no WASI imports
//! opt-level = "s"
//! lto = true
//! strip = true
//! ```
//!
//! `src/lib.rs`:
//!
//! ```
//! use weft_plugin_sdk::metrics::Counter;
//! use weft_plugin_sdk::net::PortSet;
//! use weft_plugin_sdk::{Connection, Decision, TransportPolicy, Workloads};
//!
//! struct PortGuard {
//!     ports: PortSet,
//!     denied: Counter,
//! }
//!
//! impl TransportPolicy for PortGuard {
//!     fn configure(config: &str) -> Result<Self, String> {
//!         // The config is the plugin's `config` string from weft's config file, e.g. "80,443,8000-8099".
//!         let ports = config.parse().map_err(|e| format!("bad port list: {e}"))?;
//!         let denied = Counter::define("port_guard_denied_total", "Connections denied.", &["port"])?;
//!         Ok(PortGuard { ports, denied })
//!     }
//!
//!     fn authorize(&mut self, conn: &Connection, _workloads: &Workloads<'_>) -> Decision {
//!         let port = conn.destination.port;
//!         if self.ports.contains(port) {
//!             Decision::Allow
//!         } else {
//!             self.denied.inc(&[&port.to_string()]);
//!             Decision::Deny(format!("port {port} is not allowed"))
//!         }
//!     }
//! }
//!
//! weft_plugin_sdk::export_policy!(PortGuard);
//! # fn main() {}
//! ```
//!
//! Build it with `cargo build --release --target wasm32-wasip2`; the component is
//! `target/wasm32-wasip2/release/port_guard.wasm`. `sdk/README.md` walks from `cargo new` to a plugin hot-swapped
//! into a running weft, and `weft_plugin_sdk::harness` (feature `harness`) loads the `.wasm` in the real host for
//! unit tests.
//!
//! # Target
//!
//! Plugins are built for `wasm32-wasip2`: rustc emits a component directly (no extra tool), and with
//! `panic = "abort"` and no std I/O (`println!`, files, env) the component imports nothing but `weft:plugin`. weft
//! offers no WASI at all: a plugin that imports WASI (for example because it prints) is rejected at load time with
//! the list of the imports it asked for. Use [`log`] instead of printing.

#![deny(missing_docs)]

pub mod bindings;
pub mod hash;
pub mod json;
pub mod log;
pub mod metrics;
pub mod net;
pub mod spiffe;
pub mod workload_cache;

#[doc(hidden)]
#[path = "private.rs"]
pub mod __private;

#[cfg(all(feature = "harness", not(target_arch = "wasm32")))]
pub use weft_plugin_host::testing as harness;

include!(concat!(env!("OUT_DIR"), "/export_macros.rs"));

pub use bindings::weft::plugin::types::{
    AuthorizationPolicy, CloseInfo, Connection, ConnectionScope, Decision, DestinationScope,
    Direction, IpAddress, PolicyAction, PolicyClause, PolicyMatch, PolicyRule, PolicyScope,
    ServiceAccountMatch, SocketAddress, StateKinds, StringMatch, Verdict, Workload, WorkloadMeta,
};

pub use workload_cache::WorkloadCache;

use std::net::SocketAddr;

/// The workloads at both ends of a connection, as lazy handles (each accessor is one call into the host, so a
/// plugin pays only for what it reads). Valid only during the `authorize` call.
#[derive(Debug, Clone, Copy)]
pub struct Workloads<'a> {
    /// The source workload, when the node knows it.
    pub source: Option<&'a Workload>,
    /// The destination workload, when the node knows it.
    pub destination: Option<&'a Workload>,
}

impl Workloads<'_> {
    /// The workload this node serves for the connection: the destination inbound, the source outbound.
    pub fn local(&self, conn: &Connection) -> Option<&Workload> {
        match conn.direction {
            Direction::Inbound => self.destination,
            Direction::Outbound => self.source,
        }
    }
}

/// A transport-policy plugin. One value lives per plugin instance; the host may run several instances of a plugin
/// in parallel, each configured with the same config and state, so keep decisions a function of the connection,
/// the config and the state.
pub trait TransportPolicy: Sized + 'static {
    /// Builds the plugin from its configuration string. An error rejects this plugin version (the previous version
    /// keeps serving) and the message is reported to the operator.
    fn configure(config: &str) -> Result<Self, String>;

    /// The control-plane state this plugin wants (default: none).
    fn state_kinds(&self) -> StateKinds {
        StateKinds::empty()
    }

    /// The mesh's authorization policies, whole, after `configure` and on every change (only when
    /// [`StateKinds::AUTHORIZATION_POLICIES`] was asked for). An error rejects the update; the previous state keeps
    /// serving.
    fn update_policies(&mut self, policies: Vec<AuthorizationPolicy>) -> Result<(), String> {
        let _ = policies;
        Ok(())
    }

    /// Decides on one connection. Every policy plugin must allow; the first deny wins.
    fn authorize(&mut self, conn: &Connection, workloads: &Workloads<'_>) -> Decision;

    /// Which connections [`authorize`](Self::authorize) needs to see under the current config and state, asked
    /// once after `configure` and the state (each new config or state is a new plugin version, asked again). The
    /// host allows every connection outside the answer without calling the plugin, so a plugin with nothing to
    /// enforce for most workloads costs their connections nothing. The answer must never leave out a connection
    /// `authorize` could deny (or would log or count): a connection outside it is allowed as if `authorize` had
    /// returned [`Decision::Allow`]. Default: [`ConnectionScope::All`].
    fn scope(&self) -> ConnectionScope {
        ConnectionScope::All
    }
}

/// A connection with the metadata of both ends, as a telemetry plugin sees it. The workloads are none when the node
/// does not know them. (Each batch carries a workload's metadata once, however many of its connections name it;
/// the SDK resolves the references.)
#[derive(Debug, Clone, Copy)]
pub struct ConnectionInfo<'a> {
    /// The connection.
    pub conn: &'a Connection,
    /// The source workload.
    pub source_workload: Option<&'a WorkloadMeta>,
    /// The destination workload.
    pub destination_workload: Option<&'a WorkloadMeta>,
    /// Where the connection's strings sit in the batch being delivered (see [`BatchStrings`]).
    pub batch_strings: BatchStrings,
}

/// The positions of a connection's peer identity and destination service in the strings of the batch being
/// delivered, when the host sent the batch with its strings listed once (`telemetry-batches`). Within one batch,
/// equal positions name equal strings, so a plugin that derives something from a string (an interned id, a label)
/// can remember it by position until [`Telemetry::on_batch_end`] instead of hashing the string on every event.
/// Positions mean nothing past the batch's end. A position is none when the string is absent *or* the batch did
/// not come with positions: read the string itself from [`ConnectionInfo::conn`] then.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BatchStrings {
    /// Position of `conn.peer_identity`.
    pub peer_identity: Option<u32>,
    /// Position of `conn.destination_service`.
    pub destination_service: Option<u32>,
}

/// A telemetry plugin. Calls come off the connections' path, in batches, in order.
pub trait Telemetry: Sized + 'static {
    /// Builds the plugin from its configuration string (define metrics here). An error rejects this version.
    fn configure(config: &str) -> Result<Self, String>;

    /// A connection was established.
    fn on_open(&mut self, conn: &ConnectionInfo<'_>) {
        let _ = conn;
    }

    /// A connection ended (allowed or not).
    fn on_close(&mut self, conn: &ConnectionInfo<'_>, close: &CloseInfo) {
        let _ = (conn, close);
    }

    /// A connection that opened and closed within one batch (most short connections), reported once. Default:
    /// [`on_open`](Self::on_open) then [`on_close`](Self::on_close). Override it to skip what an open followed at
    /// once by its close does not need (`istio-telemetry` does not track it as live).
    fn on_open_close(&mut self, conn: &ConnectionInfo<'_>, close: &CloseInfo) {
        self.on_open(conn);
        self.on_close(conn, close);
    }

    /// The batch's events have all been seen: the place to hand the host what was summed over them (one metric
    /// update per series per batch instead of one per event; each update is a call into the host).
    fn on_batch_end(&mut self) {}
}

impl Decision {
    /// A deny with a reason.
    pub fn deny(reason: impl Into<String>) -> Self {
        Decision::Deny(reason.into())
    }

    /// Whether this is an allow.
    pub fn is_allow(&self) -> bool {
        matches!(self, Decision::Allow)
    }
}

impl Connection {
    /// The source as a `std` socket address.
    pub fn source_addr(&self) -> SocketAddr {
        SocketAddr::from(&self.source)
    }

    /// The destination as a `std` socket address.
    pub fn destination_addr(&self) -> SocketAddr {
        SocketAddr::from(&self.destination)
    }

    /// The peer identity, parsed (none when absent or not an Istio SPIFFE identity).
    pub fn peer(&self) -> Option<spiffe::SpiffeId> {
        self.peer_identity.as_deref().and_then(|s| s.parse().ok())
    }
}

impl WorkloadMeta {
    /// The value of a label, if set.
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}
