//! Rollbacks to the control plane: each automatic rollback of the plugin host becomes an unsolicited NACK of the
//! plugin's resource whose `error_detail.details` carry a `weft.plugin.v1.RollbackReport` with the figures.

use std::sync::Arc;

use weft_plugin_host::{PluginHost, RollbackEvent};
use weft_proto::type_url;
use weft_proto::weft::plugin::v1::RollbackReport;

use crate::handler::EcdsHandler;

/// The `RollbackReport` of a rollback, packed for `error_detail.details`.
pub fn rollback_report(e: &RollbackEvent) -> prost_types::Any {
    weft_proto::to_any(
        type_url::ROLLBACK_REPORT,
        &RollbackReport {
            plugin: e.plugin.clone(),
            rolled_back_sha256: e.rolled_back_sha256.clone(),
            restored_sha256: e.restored_sha256.clone(),
            calls: e.calls,
            failures: e.failures,
            traps: e.traps,
            timeouts: e.timeouts,
            after: Some(prost_types::Duration {
                seconds: e.after.as_secs() as i64,
                nanos: e.after.subsec_nanos() as i32,
            }),
            max_failure_ratio: e.max_failure_ratio,
        },
    )
}

/// Sends an unsolicited NACK: (resource name, reason, details).
pub type Nack = dyn Fn(&str, &str, Vec<prost_types::Any>) + Send + Sync;

/// Reports every rollback of `host` with `nack` (the xDS source's unsolicited NACK) and puts the restored
/// version's spec back into the state through `handler`. Runs until the host goes away.
pub fn spawn_rollback_reporter(
    host: &PluginHost,
    handler: Arc<EcdsHandler>,
    nack: Arc<Nack>,
) -> tokio::task::JoinHandle<()> {
    let mut rx = host.rollbacks();
    tokio::spawn(async move {
        loop {
            match rx.recv().await {
                Ok(e) => {
                    // The state first, so that whoever sees the NACK sees the restored version in the state.
                    handler.rolled_back(&e.plugin).await;
                    nack(&e.plugin, &e.reason(), vec![rollback_report(&e)]);
                }
                Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                    tracing::warn!(
                        missed = n,
                        "rollback reports lagged; some were not sent to the control plane"
                    );
                }
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
            }
        }
    })
}
