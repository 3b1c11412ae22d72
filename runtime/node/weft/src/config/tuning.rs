//! The `tuning` section: internals and benchmark switches, hidden from `weft run --help` because a node runs well
//! on their defaults. Each is still a flag and an env var (both shown here), and a key under `tuning:` in the
//! config file; `/config_dump` shows them with the rest of `nodeConfig`.

use std::time::Duration;

use clap::Args;
use serde::{Deserialize, Serialize};

use super::serde_text::duration;
use super::values::{PluginCompiler, parse_epoch_tick, parse_ratio};

/// Internals and benchmark switches of `weft run` (hidden from `--help`).
#[derive(Debug, Clone, Args, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Tuning {
    /// `--config-poll` (`WEFT_CONFIG_POLL`, default 250ms). How often the mesh config file is checked for edits.
    #[arg(long, hide = true, env = "WEFT_CONFIG_POLL", default_value = "250ms", value_parser = humantime::parse_duration)]
    #[serde(with = "duration")]
    pub config_poll: Duration,
    /// `--log-linger` (`WEFT_LOG_LINGER`, default 10ms). How long log lines may wait in memory before they go to
    /// stderr, so that the lines of a busy moment (an access log line per connection) are written together by a
    /// thread of their own, not one `write` each by the data path; a panic and the end of the process write what
    /// waits. 0: each line as it is logged.
    #[arg(long, hide = true, env = "WEFT_LOG_LINGER", default_value = "10ms", value_parser = humantime::parse_duration)]
    #[serde(with = "duration")]
    pub log_linger: Duration,
    /// `--plugin-compiler` (`WEFT_PLUGIN_COMPILER`, default `subprocess`). Where plugins are compiled.
    /// subprocess: in a short-lived child (this same executable), so the compiler's code and memory never stay
    /// resident in the node; in-process: in the node itself.
    #[arg(long, hide = true, env = "WEFT_PLUGIN_COMPILER", value_enum, default_value_t = PluginCompiler::Subprocess)]
    pub plugin_compiler: PluginCompiler,
    /// `--plugin-compile-timeout` (`WEFT_PLUGIN_COMPILE_TIMEOUT`, default 120s). A plugin compile still running
    /// after this is stopped and the plugin version rejected.
    #[arg(long, hide = true, env = "WEFT_PLUGIN_COMPILE_TIMEOUT", default_value = "120s", value_parser = humantime::parse_duration)]
    #[serde(with = "duration")]
    pub plugin_compile_timeout: Duration,
    /// `--plugin-compile-memory-mib` (`WEFT_PLUGIN_COMPILE_MEMORY_MIB`, default 2048). The address space a plugin
    /// compile may use, in MiB (the compiler child's RLIMIT_AS; 0: no cap). A component that drives the compiler
    /// past it is rejected.
    #[arg(long, hide = true, env = "WEFT_PLUGIN_COMPILE_MEMORY_MIB", default_value_t = weft_plugin_host::DEFAULT_COMPILE_ADDRESS_SPACE >> 20)]
    pub plugin_compile_memory_mib: u64,
    /// `--plugin-telemetry-linger` (`WEFT_PLUGIN_TELEMETRY_LINGER`, default 20ms). How long telemetry events may
    /// gather before the telemetry thread hands them to the telemetry plugins (after a quiet spell an event goes
    /// at once). Longer: fewer wake-ups and larger batches under load; an event (a metric update, a plugin's
    /// access log line) waits at most this long.
    #[arg(long, hide = true, env = "WEFT_PLUGIN_TELEMETRY_LINGER", default_value = "20ms", value_parser = humantime::parse_duration)]
    #[serde(with = "duration")]
    pub plugin_telemetry_linger: Duration,
    /// `--plugin-epoch-tick` (`WEFT_PLUGIN_EPOCH_TICK`, default 1ms, within 100us..10ms). The plugin engine's
    /// epoch tick: how often a running guest call's deadline is checked (a call overrunning its deadline is
    /// interrupted within about a tick). The ticker runs only while calls do.
    #[arg(long, hide = true, env = "WEFT_PLUGIN_EPOCH_TICK", default_value = "1ms", value_parser = parse_epoch_tick)]
    #[serde(with = "duration")]
    pub plugin_epoch_tick: Duration,
    /// `--plugin-rollout-window` (`WEFT_PLUGIN_ROLLOUT_WINDOW`, default 60s). Probation of a new plugin version
    /// (plugins whose resource sets no rollout): how long after the swap its failures can roll it back (0 turns
    /// probation off).
    #[arg(long, hide = true, env = "WEFT_PLUGIN_ROLLOUT_WINDOW", default_value = "60s", value_parser = humantime::parse_duration)]
    #[serde(with = "duration")]
    pub plugin_rollout_window: Duration,
    /// `--plugin-rollout-max-failure-ratio` (`WEFT_PLUGIN_ROLLOUT_MAX_FAILURE_RATIO`, default 0.2). Probation: the
    /// share of calls (0..1) that may fail (traps, deadline overruns) before the version is rolled back to the
    /// previous one.
    #[arg(long, hide = true, env = "WEFT_PLUGIN_ROLLOUT_MAX_FAILURE_RATIO", default_value_t = 0.2, value_parser = parse_ratio)]
    pub plugin_rollout_max_failure_ratio: f64,
    /// `--plugin-rollout-min-calls` (`WEFT_PLUGIN_ROLLOUT_MIN_CALLS`, default 20). Probation: calls needed before
    /// the failure share is judged.
    #[arg(
        long,
        hide = true,
        env = "WEFT_PLUGIN_ROLLOUT_MIN_CALLS",
        default_value_t = 20
    )]
    pub plugin_rollout_min_calls: u32,
}
