//! What every plugin version shares: the engine, the compile cache, the limits, the metrics.

use std::sync::Arc;
use std::time::Instant;

use wasmtime::Engine;

use crate::config::HostConfig;
use crate::engine::CompileCache;
use crate::host_metrics::HostMetrics;
use crate::instance::Limits;
use crate::plugin_metrics::MetricsHub;

pub(crate) struct Shared {
    pub config: HostConfig,
    pub engine: Engine,
    pub cache: CompileCache,
    pub limits: Limits,
    pub metrics: HostMetrics,
    pub hub: Arc<MetricsHub>,
    pub epoch_start: Instant,
}
