//! Metrics, a sink: the host's own families (calls, errors, loads, rollbacks...) and the plugin-defined metrics.
//! Every layer above writes to it (the sandbox's imports, versions' calls, the lifecycle's loads and rollbacks); it
//! reads nothing above the leaves, so the arrows into it stay one-way.

pub(crate) mod host;
pub(crate) mod plugin;
