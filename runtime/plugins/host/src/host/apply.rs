//! `PluginHost`'s `apply` entry points: blocking, for a state version, and on tokio's blocking pool.

use std::sync::Arc;

use weft_state::{PluginSpec, Policy};

use super::plugin_host::PluginHost;
use crate::lifecycle::report::{ApplyReport, Outcome, PluginOutcome};
use crate::versions::cache::release_freed_memory;

impl PluginHost {
    /// Reconciles the plugins with `specs` and hands `policies` to the policy plugins that want them. Blocking:
    /// compiling and configuring take milliseconds to seconds, so call it from a blocking thread (or use
    /// [`Self::apply_async`]). Calls are serialized. New connections see the new chain as soon as it returns.
    pub fn apply(&self, specs: &[Arc<PluginSpec>], policies: &[Arc<Policy>]) -> ApplyReport {
        self.plugins.apply(None, specs, policies)
    }

    /// [`Self::apply`] for state version `version`: its outcome is published to [`Self::applied`] and
    /// [`Self::wait_applied`] under that version.
    pub fn apply_version(
        &self,
        version: u64,
        specs: &[Arc<PluginSpec>],
        policies: &[Arc<Policy>],
    ) -> ApplyReport {
        self.plugins.apply(Some(version), specs, policies)
    }

    /// [`Self::apply`] on tokio's blocking pool, for callers in an async context.
    pub async fn apply_async(
        self: &Arc<Self>,
        specs: Vec<Arc<PluginSpec>>,
        policies: Vec<Arc<Policy>>,
    ) -> ApplyReport {
        self.apply_async_inner(None, specs, policies).await
    }

    /// [`Self::apply_version`] on tokio's blocking pool.
    pub async fn apply_version_async(
        self: &Arc<Self>,
        version: u64,
        specs: Vec<Arc<PluginSpec>>,
        policies: Vec<Arc<Policy>>,
    ) -> ApplyReport {
        self.apply_async_inner(Some(version), specs, policies).await
    }

    async fn apply_async_inner(
        self: &Arc<Self>,
        version: Option<u64>,
        specs: Vec<Arc<PluginSpec>>,
        policies: Vec<Arc<Policy>>,
    ) -> ApplyReport {
        let host = self.clone();
        let apply = move || {
            let report = host.plugins.apply(version, &specs, &policies);
            // Loading and pre-warming a plugin allocate and free megabytes on this thread; give what it holds back
            // so a node's resident memory is what it serves with, not the apply's high-water mark.
            release_freed_memory(host.config().release_memory);
            report
        };
        match tokio::task::spawn_blocking(apply).await {
            Ok(report) => report,
            Err(e) => ApplyReport {
                plugins: vec![PluginOutcome {
                    name: "*".into(),
                    outcome: Outcome::Rejected {
                        reason: format!("apply task failed: {e}"),
                        still_serving: None,
                    },
                }],
                recheck: false,
            },
        }
    }
}
