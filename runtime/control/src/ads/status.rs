//! The status endpoint (weft-admin's admin server, loopback only: `GET /status` or `/config_dump`), the metrics
//! page (`/metrics`, `/stats/prometheus`) and `/logging`: every connected node with the version of each plugin it
//! runs, its NACKs and their reasons, the rollbacks it reported; the sources and what they serve.

use std::sync::Arc;

use serde_json::{Value, json};
use weft_admin::AdminHandler;
use weft_proto::type_url;

use crate::ads::publish::Publisher;
use crate::ads::registry::Registry;

/// Change the log filter at run time.
pub trait LogLevel: Send + Sync + std::fmt::Debug {
    /// The current filter.
    fn current(&self) -> String;
    /// Replace it.
    fn set(&self, filter: &str) -> Result<String, String>;
}

/// What the status and metrics servers show.
#[derive(Debug)]
pub struct Status {
    /// What is served.
    pub publisher: Arc<Publisher>,
    /// Who is connected.
    pub registry: Arc<Registry>,
    /// The log filter, when it can be changed.
    pub log: Option<Arc<dyn LogLevel>>,
    /// Cancelled by `POST /quitquitquit`.
    pub stop: tokio_util::sync::CancellationToken,
    /// The WeftPlugin controller's view, with `--plugins-from-kube`: each resource and whether this replica leads.
    pub controller: Option<ControllerView>,
}

/// What the status page shows of the WeftPlugin controller.
#[derive(Debug, Clone)]
pub struct ControllerView {
    /// Each resource's state.
    pub resources: Arc<crate::kube::reconcile::Resources>,
    /// Whether this replica leads.
    pub leader: tokio::sync::watch::Receiver<bool>,
}

impl ControllerView {
    fn document(&self) -> Value {
        let resources: Vec<Value> = self
            .resources
            .all()
            .into_iter()
            .map(|((ns, name), s)| {
                json!({
                    "namespace": ns,
                    "name": name,
                    "generation": s.generation,
                    "plugin": s.xds_name,
                    "refused": s.refused,
                    "version": s.serving.as_ref().map(|v| v.version.clone()),
                    "nodes": s.serving.as_ref().and_then(|v| v.nodes.clone()),
                })
            })
            .collect();
        json!({"leader": *self.leader.borrow(), "resources": resources})
    }
}

impl Status {
    /// The status document.
    pub fn document(&self) -> Value {
        let snap = self.publisher.current();
        let (mesh, plugins_src) = self.publisher.sources();
        let plugins: serde_json::Map<String, Value> = snap
            .plugins
            .iter()
            .map(|(name, p)| {
                let running =
                    self.registry
                        .acked_count(type_url::EXTENSION_CONFIG, name, &p.current.version);
                (
                    name.clone(),
                    json!({
                        "version": p.current.version,
                        "url": p.info.url,
                        "sha256": p.info.sha256,
                        "file": p.info.file,
                        "nodes": p.nodes,
                        "placement": p.placement,
                        "base": p.base.as_ref().map(|b| json!({
                            "version": b.version,
                            "sha256": p.base_info.as_ref().and_then(|i| i.sha256.clone()),
                        })),
                        "nodesRunningIt": running,
                    }),
                )
            })
            .collect();
        let nodes: Vec<Value> = self
            .registry
            .nodes()
            .into_iter()
            .map(|n| {
                let ecds = n.types.get(type_url::EXTENSION_CONFIG);
                let runs: serde_json::Map<String, Value> = ecds
                    .map(|t| {
                        t.acked
                            .iter()
                            .map(|(name, version)| {
                                let info = snap.plugin_info(name, version);
                                let current = snap
                                    .plugins
                                    .get(name)
                                    .is_some_and(|p| p.current.version == *version);
                                (
                                    name.clone(),
                                    json!({
                                        "version": version,
                                        "sha256": info.and_then(|i| i.sha256.clone()),
                                        "current": current,
                                    }),
                                )
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                let nacked: serde_json::Map<String, Value> = n
                    .types
                    .iter()
                    .filter(|(_, t)| !t.nacked.is_empty())
                    .map(|(ty, t)| (ty.clone(), json!(t.nacked)))
                    .collect();
                json!({
                    "stream": n.stream,
                    "id": n.id,
                    "name": n.name,
                    "cluster": n.cluster,
                    "peer": n.peer.map(|p| p.to_string()),
                    "caller": n.caller,
                    "callerNode": n.caller_node,
                    "connectedAt": n.connected_at,
                    "plugins": runs,
                    "nacked": nacked,
                    "rollbacks": n.rollbacks,
                    "shadows": n.shadows,
                    "counts": n.counts,
                    "types": n.types,
                })
            })
            .collect();
        json!({
            "snapshotVersion": snap.version,
            "sources": {"mesh": mesh, "plugins": plugins_src},
            "resources": {
                "addresses": snap.addresses.len(),
                "authorizations": snap.authorizations.len(),
                "plugins": snap.plugins.len(),
            },
            "plugins": plugins,
            "connectedNodes": nodes.len(),
            "nodes": nodes,
            "controller": self.controller.as_ref().map(ControllerView::document),
            "rollouts": self.publisher.rollouts().map(|r| rollouts_document(&r)),
        })
    }
}

/// The staged rollouts: where they are kept, and per plugin its stable version (without its bytes) and its
/// rollout.
fn rollouts_document(r: &crate::rollout::driver::Rollouts) -> Value {
    let (path, save_error) = r.persistence();
    let plugins: serde_json::Map<String, Value> =
        r.records()
            .into_iter()
            .map(|(name, rec)| {
                let stable = rec.stable.as_ref().map(
                    |s| json!({"version": s.version, "sha256": s.info.sha256, "url": s.info.url}),
                );
                (name, json!({"stable": stable, "rollout": rec.rollout}))
            })
            .collect();
    json!({"stateFile": path, "saveError": save_error, "plugins": plugins})
}

impl AdminHandler for Status {
    fn config_dump(&self) -> Value {
        self.document()
    }

    fn readiness(&self) -> Result<(), Vec<String>> {
        Ok(())
    }

    fn log_level(&self) -> String {
        self.log
            .as_ref()
            .map_or_else(|| "unknown".into(), |l| l.current())
    }

    fn set_log_level(&self, level: &str) -> Result<String, String> {
        match &self.log {
            Some(l) => l.set(level),
            None => Err("the log filter cannot be changed in this process".into()),
        }
    }

    fn metrics(&self) -> String {
        let m = self.registry.metrics();
        let snap = self.publisher.current();
        m.snapshot_version
            .set(i64::try_from(snap.version).unwrap_or(i64::MAX));
        let (mesh, plugins) = self.publisher.sources();
        for (name, st) in [("mesh", mesh), ("plugins", plugins)] {
            m.source_refused
                .get_or_create(&crate::ads::metrics::SourceLabel {
                    source: name.into(),
                })
                .set(i64::try_from(st.refused).unwrap_or(i64::MAX));
        }
        if let Some(r) = self.publisher.rollouts() {
            let g = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
            // A removed plugin's series go with it.
            m.rollout_stage.clear();
            m.rollout_nodes.clear();
            m.rollout_divergences.clear();
            m.rollout_decisions.clear();
            m.rollout_state.clear();
            for (plugin, rec) in r.records() {
                let Some(ro) = rec.rollout else { continue };
                let label = crate::ads::metrics::PluginLabel {
                    plugin: plugin.clone(),
                };
                m.rollout_stage
                    .get_or_create(&label)
                    .set(g(ro.stage as u64 + 1));
                m.rollout_nodes
                    .get_or_create(&label)
                    .set(g(ro.nodes.len() as u64));
                m.rollout_divergences
                    .get_or_create(&label)
                    .set(g(ro.figures.divergences));
                m.rollout_decisions
                    .get_or_create(&label)
                    .set(g(ro.figures.decisions));
                for (state, name) in [
                    (crate::rollout::state::Progress::Progressing, "progressing"),
                    (crate::rollout::state::Progress::Complete, "complete"),
                    (crate::rollout::state::Progress::Aborted, "aborted"),
                ] {
                    m.rollout_state
                        .get_or_create(&crate::ads::metrics::RolloutStateLabel {
                            plugin: plugin.clone(),
                            state: name.into(),
                        })
                        .set(i64::from(ro.state == state));
                }
            }
        }
        m.encode()
    }

    fn quit(&self) {
        self.stop.cancel();
    }
}
