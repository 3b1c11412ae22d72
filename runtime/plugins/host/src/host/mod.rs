//! The host: [`plugin_host::PluginHost`] owns the engine, the threads (epoch ticker, telemetry, rollout) and the
//! plugin set, and puts them behind `weft_hooks::ConnectionHooks`.

pub(crate) mod apply;
pub(crate) mod check;
pub(crate) mod plugin_host;
pub(crate) mod telemetry;
