//! The Wasm plugin host: engine, compile cache, sandbox limits, instance pools and the hot-swappable plugin chain.
//!
//! [`PluginHost`] is the only thing in weft that links wasmtime. It implements [`weft_hooks::ConnectionHooks`]:
//! the data path calls `authorize` once per connection (the policy chain, synchronous, on pooled pre-configured
//! instances, each call under an epoch deadline), and `on_open`/`on_close` (queued to a telemetry thread, never
//! blocking). [`PluginHost::apply`] reconciles the plugin set with the config: new or changed plugins are compiled
//! (cached by content hash), linked against their world, instantiated and configured before the chain is swapped
//! atomically; a plugin that fails any step is rejected with the reason while its previous version keeps serving.
//!
//! Sandbox: a locked-down WASI (no filesystem, sockets, environment or arguments; stdout/stderr go to the
//! rate-limited log; random bytes from the OS CSPRNG, at most 64 KiB a call; any other import is rejected at load),
//! a memory cap per instance (growing past it traps), a wasm stack cap, a deadline per call (epoch interruption,
//! a ticker thread that ticks only while calls run), a cap on every guest-to-host copy (hostcall fuel), pooled instance slots. A call never creates
//! an instance: each plugin version has a shared idle pool refilled by its own background thread, and a call that
//! finds none idle fails at once (`no_instance`). A call that traps or times out throws its instance away and
//! applies the plugin's failure policy (policy: fail closed unless configured fail-open; telemetry: the batch is
//! dropped), counted in `weft_plugin_errors_total{plugin,kind}`.
//!
//! Safe rollout: a version swapped in over a serving one is on probation (the plugin's `rollout`, else the
//! host's); if its calls fail too often within the window it is swapped back for the previous version, counted in
//! `weft_plugin_rollbacks_total{plugin}`, reported on [`PluginHost::rollbacks`], and refused until different code
//! arrives. [`PluginHost::wait_applied`] tells a config source what became of the state version it produced.
//!
//! Shadow versions: a policy plugin's spec may carry a `shadow` (other code or config). It loads like a serving
//! version but never enters the chain's decisions: each connection a serving version decides is queued (bounded,
//! `try_send`; full: skipped and counted) to the shadow thread, which decides it again with the shadow and counts
//! `weft_plugin_shadow_decisions_total{plugin,direction,serving,shadow}` (a trap or timeout is `error`), keeping
//! rate-limited divergence samples ([`PluginHost::shadow_report`]).

// The layers, bottom first: each uses only itself and the ones declared before it (`tests/layers.rs` holds this).

// Leaves: the config, the clock, the errors, where code is compiled.
mod base;

// The WIT bindings and the conversions into WIT values.
mod wit;

// A sink every layer above writes to: the host's metric families and the plugin-defined metrics.
mod metrics;

// The engine, a store and its caps, the time budget, the epoch ticker, the locked-down WASI.
mod sandbox;

// Linking a component and the typed calls into one instance.
mod guest;

// The compile cache, plugin versions, their pools, scopes and probation counters.
mod versions;

// Apply, the chain, rollout and rollback, the unenforced-policy guard, status.
mod lifecycle;

// `PluginHost`, which owns the threads and wires the layers.
mod host;

// Test support, over the public API (feature `testing`).
#[cfg(feature = "testing")]
pub mod testing;

pub use base::clock::{Clock, ManualClock, SystemClock};
pub use base::compiler::{
    Compiler, DEFAULT_COMPILE_ADDRESS_SPACE, EngineSettings, SubprocessCompiler, compile_child_main,
};
pub use base::config::{HostConfig, default_rollout};
pub use base::error::{CallError, ErrorKind, LoadError};
pub use host::plugin_host::{EpochTickerStatus, HostError, PluginHost};
pub use lifecycle::report::{AppliedVersion, ApplyReport, Outcome, PluginOutcome};
pub use lifecycle::rollout::RollbackEvent;
pub use lifecycle::shadow::{DivergenceSample, ShadowCount, ShadowReport};
pub use lifecycle::status::PluginStatus;
pub use metrics::plugin::MetricsHub;
pub use versions::cache::sha256_hex;
pub use wit::bindings;
