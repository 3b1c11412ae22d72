//! Where the node's state comes from: the mesh config file, the mesh over xDS, plugins over xDS; and the plugin
//! host, which runs each state version's plugins and policies before xDS acknowledges them.

use std::sync::Arc;

use anyhow::Context;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use weft_plugin_host::{Outcome, PluginHost};
use weft_state::{MeshState, StateStore};
use weft_xds::XdsHandle;

use crate::config::NodeConfig;

/// The state, its sources, and the plugin host.
pub(crate) struct Sources {
    pub state: Arc<StateStore>,
    pub host: Arc<PluginHost>,
    /// The xDS clients (mesh, plugins), as configured.
    pub xds: Vec<XdsHandle>,
    /// State changes for the identity loop, subscribed before any source could change the state.
    pub identity_changes: watch::Receiver<u64>,
    /// State changes for the plugin loop, likewise.
    pub plugin_changes: watch::Receiver<u64>,
    /// The state version the plugin host runs (policies from xDS are ACKed once it does).
    pub plugins_applied: watch::Sender<u64>,
}

/// Loads the mesh file and starts the xDS clients and the plugin host (on the current runtime).
pub(super) fn start(config: &NodeConfig, cpus: usize) -> anyhow::Result<Sources> {
    let state = Arc::new(StateStore::new());
    if let Some(file) = &config.config {
        weft_state::load_into(file, &state).context("loading the mesh config")?;
    }
    // Before any source starts: a source (xDS) may change the state while the plugins load, and that version
    // must not be missed by either loop.
    let (plugin_changes, identity_changes) = (state.subscribe(), state.subscribe());
    let (plugins_applied, applied) = watch::channel(0u64);
    let mut xds = crate::xds::start(config, &state, applied).context("starting the xDS client")?;
    let host = Arc::new(
        PluginHost::new(config.plugin_host_config(cpus)).context("starting the plugin host")?,
    );
    let plugins = crate::plugin_xds::start(
        &config.plugin_xds,
        config.fetch_paths(),
        crate::xds::node_info(config),
        config.cluster_id.clone(),
        &state,
        &host,
    )
    .context("starting the plugin xDS client")?;
    xds.extend(plugins);
    Ok(Sources {
        state,
        host,
        xds,
        identity_changes,
        plugin_changes,
        plugins_applied,
    })
}

/// Loads the current version's plugins (before the first connection is accepted), then applies later versions
/// in order on a task of their own.
pub(super) async fn run_plugins(
    state: &Arc<StateStore>,
    host: &Arc<PluginHost>,
    mut changes: watch::Receiver<u64>,
    applied: watch::Sender<u64>,
    defaults: bool,
) -> JoinHandle<()> {
    let current = state.current();
    apply_plugins(host, &current, defaults).await;
    applied.send_replace(current.version);
    let (state, host) = (state.clone(), host.clone());
    tokio::spawn(async move {
        while changes.changed().await.is_ok() {
            let current = state.current();
            apply_plugins(&host, &current, defaults).await;
            applied.send_replace(current.version);
        }
    })
}

/// Hand the plugin host the plugin specs and the authorization policies of `state`; log what happened to each
/// plugin (a rejected version is logged with its reason; the previous version keeps serving).
async fn apply_plugins(host: &Arc<PluginHost>, state: &MeshState, defaults: bool) {
    let specs = crate::default_plugins::merge(defaults, state.plugins.values().cloned());
    let policies = state.policies.values().cloned().collect();
    let report = host
        .apply_version_async(state.version, specs, policies)
        .await;
    for p in &report.plugins {
        match &p.outcome {
            Outcome::Loaded { sha256 } => {
                tracing::info!(plugin = %p.name, %sha256, version = state.version, "plugin loaded")
            }
            Outcome::StateUpdated => {
                tracing::info!(plugin = %p.name, version = state.version, "plugin state updated")
            }
            Outcome::Removed => tracing::info!(plugin = %p.name, "plugin removed"),
            Outcome::Unchanged => {}
            // Logged once, with its reason and at the level its consequence deserves, by the plugin host.
            Outcome::Rejected { .. } => {}
        }
    }
}
