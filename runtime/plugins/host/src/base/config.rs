//! The host's knobs: sandbox limits, deadlines, pools, caches and queues.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use weft_state::PluginRollout;

use crate::base::clock::{Clock, SystemClock};
use crate::base::compiler::{Compiler, EngineSettings};

/// How the plugin host runs plugins. `Default` gives production values.
#[derive(Debug, Clone)]
pub struct HostConfig {
    /// Where compiled components are cached on disk; `None`: memory only. Created 0700 if missing; a directory
    /// that is not weft's own, is group- or world-writable or is a symlink is not used (WARN, memory only). Entries
    /// are keyed by the component's sha256 and the engine settings and verified with an HMAC (key `cache.key`,
    /// 0600, in the directory) before they are loaded; a bad entry is compiled again and rewritten.
    pub cache_dir: Option<PathBuf>,
    /// Where plugins are compiled (`weft run`: a child process, so the node never pages in the compiler).
    pub compiler: Compiler,
    /// Called on a host thread that has just allocated and freed a lot (an apply: load, configure, pre-warm; a
    /// refill of instances) before it goes idle, so the process's allocator can give back what that thread still
    /// holds. `None`: glibc's `malloc_trim` (right for the system allocator; a no-op elsewhere). `weft run`, whose
    /// allocator is jemalloc, passes jemalloc's `thread.idle` (the thread's cache flushed, its freed pages left to
    /// the background purge): an idle thread's cache is otherwise never flushed.
    pub release_memory: Option<fn()>,
    /// Per-call budget for `authorize` and telemetry batches: CPU time of the calling thread, checked at epoch
    /// ticks (so OS preemption does not count against a plugin), with a wall-clock cap of 100× the budget.
    pub call_deadline: Duration,
    /// Deadline for `configure` and `update-state` (they may index large state).
    pub configure_deadline: Duration,
    /// Epoch tick of the ticker thread. A deadline is rounded up to whole ticks, plus one tick (a deadline of one
    /// tick can trap a healthy call when the tick lands just after it starts).
    pub epoch_tick: Duration,
    /// Linear memory cap per instance.
    pub memory_limit: usize,
    /// Wasm stack cap per call.
    pub max_wasm_stack: usize,
    /// Instance slots in the pooling allocator, for all plugins and versions together (loading a new version
    /// needs free slots while the old one still serves).
    pub max_instances: u32,
    /// Idle instances kept per plugin version for reuse.
    pub max_idle_per_plugin: usize,
    /// Instances created and configured when a version loads, before it serves, and the size the background
    /// refill keeps the idle pool at. Calls never create instances (a call that finds none idle fails at once with
    /// `no_instance`), so this should be at least the number of threads that call at once (`weft run` uses the
    /// data-path worker count + 1). Telemetry plugins, which only the telemetry thread calls, keep at most two.
    pub prewarm_instances: usize,
    /// Metric series a plugin may create (all its metrics together); more are dropped and counted
    /// (`weft_plugin_metric_dropped_total{reason="series_cap"}`).
    pub max_series_per_plugin: usize,
    /// Longest plugin metric label value, in bytes. An update with a longer value is refused, not truncated (two
    /// values cut to one prefix would merge into one series), and counted (`reason="label_value_too_long"`). The
    /// default fits a DNS name (253) and a SPIFFE ID with the longest namespace and service account.
    pub max_label_value_len: usize,
    /// Label bytes (names and values of every series) one plugin version may hold; a new series past it is
    /// dropped and counted (`reason="label_bytes"`). This bounds the host memory a plugin's metrics take and the
    /// size of its part of `/stats/prometheus`.
    pub max_label_bytes_per_plugin: usize,
    /// Longest deny reason kept (longer: the call counts as failed, failure policy applies).
    pub max_reason_len: usize,
    /// Log lines a policy plugin may write per second (burst the same); more are dropped and counted.
    pub log_lines_per_sec: u32,
    /// Log lines a telemetry plugin may write per second: an access log writes one per connection.
    pub telemetry_log_lines_per_sec: u32,
    /// Longest log line (longer lines are truncated).
    pub max_log_len: usize,
    /// Telemetry events queued for the telemetry thread; when full, events are dropped and counted.
    pub telemetry_queue: usize,
    /// Most events handed to a telemetry plugin in one call.
    pub telemetry_batch: usize,
    /// After a batch that did not fill up, the telemetry thread waits this long before it takes more, so that
    /// under load one wake-up delivers many events (0: deliver every event as soon as it is queued). An event
    /// waits at most this long for its plugins.
    pub telemetry_linger: Duration,
    /// Probation of a new version of a plugin whose spec sets none (`weft run --plugin-rollout-*`).
    pub rollout: PluginRollout,
    /// The clock probation windows are measured on (tests inject a [`crate::ManualClock`]).
    pub clock: Arc<dyn Clock>,
    /// Let connections through when Istio authorization policies apply to their destination but no serving policy
    /// plugin enforces them (`--allow-unenforced-policies`); by default they are denied (see `enforce.rs`).
    pub allow_unenforced_policies: bool,
    /// Shadow decisions of one plugin waiting for the shadow thread, at most (each plugin's shadow has its own
    /// bound); past it a decision is skipped and counted, never waited for.
    pub shadow_queue: usize,
    /// Divergence samples kept per plugin (the oldest go first).
    pub shadow_samples: usize,
    /// Divergence samples taken per plugin per [`Self::shadow_sample_interval`], at most (the rest are counted only).
    pub shadow_samples_per_interval: u32,
    /// The interval of [`Self::shadow_samples_per_interval`], on [`Self::clock`].
    pub shadow_sample_interval: Duration,
}

impl Default for HostConfig {
    fn default() -> Self {
        let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
        Self {
            cache_dir: None,
            compiler: Compiler::InProcess,
            release_memory: None,
            call_deadline: Duration::from_millis(10),
            configure_deadline: Duration::from_secs(1),
            epoch_tick: Duration::from_millis(1),
            memory_limit: 16 << 20,
            max_wasm_stack: 512 << 10,
            max_instances: 256,
            max_idle_per_plugin: cpus.max(2) * 2,
            prewarm_instances: cpus.max(1),
            max_series_per_plugin: 10_000,
            max_label_value_len: 1024,
            max_label_bytes_per_plugin: 8 << 20,
            max_reason_len: 1024,
            log_lines_per_sec: 20,
            telemetry_log_lines_per_sec: 20_000,
            max_log_len: 1024,
            telemetry_queue: 16 * 1024,
            telemetry_batch: 256,
            telemetry_linger: Duration::from_millis(20),
            rollout: default_rollout(),
            clock: Arc::new(SystemClock::default()),
            allow_unenforced_policies: false,
            shadow_queue: 1024,
            shadow_samples: 64,
            shadow_samples_per_interval: 10,
            shadow_sample_interval: Duration::from_secs(10),
        }
    }
}

impl HostConfig {
    /// The settings that decide what compiled code looks like (the node's engine and a compiler child's).
    pub fn engine_settings(&self) -> EngineSettings {
        EngineSettings {
            max_wasm_stack: self.max_wasm_stack,
        }
    }
}

/// The node's default probation (a plugin's own `rollout` overrides it): 60 s, more than 20 % failed calls over
/// at least 20 calls.
pub fn default_rollout() -> PluginRollout {
    PluginRollout {
        window: Duration::from_secs(60),
        max_failure_ppm: 200_000,
        min_calls: 20,
        disabled: false,
    }
}
