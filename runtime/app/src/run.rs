//! `weft run`: load the config, build the identity manager and the data path, serve admin, wait for a signal,
//! drain. Two runtimes: a single-threaded control runtime (config watch, certificates, admin, metrics) and the
//! multi-threaded data-path runtime, so a slow scrape or a config storm never stalls traffic.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;
use weft_admin::{AdminHandler, Server};
use weft_hooks::ConnectionHooks;
use weft_identity::{ManagerConfig, SecretManager, SpiffeId};
use weft_plugin_host::{HostConfig, Outcome, PluginHost};
use weft_proxy::{InboundBind, Proxy, ProxyConfig, ProxyMetrics};
use weft_state::{MeshState, StateStore, TunnelProtocol};

use crate::admin::{Node, NodeCollector};
use crate::cli::{HboneListen, Listen, RunArgs};
use crate::logging;

fn opt(l: Listen) -> Option<std::net::SocketAddr> {
    match l {
        Listen::At(a) => Some(a),
        Listen::Off => None,
    }
}

fn proxy_config(a: &RunArgs) -> ProxyConfig {
    let mut c = ProxyConfig::new(a.node.clone());
    c.cluster_id = a.cluster_id.clone();
    c.outbound_addr = opt(a.outbound);
    c.socks5_addr = opt(a.socks5);
    c.inbound_plaintext_addr = opt(a.inbound_plaintext);
    c.inbound = match a.hbone {
        HboneListen::At(addr) => InboundBind::Addr(addr),
        HboneListen::Workloads => InboundBind::Workloads { port: a.hbone_port },
        HboneListen::Off => InboundBind::Disabled,
    };
    c.hbone_port = a.hbone_port;
    c.mark = a.mark;
    c.bind_source_ip = a.bind_source_ip;
    c.idle_timeout = a.idle_timeout;
    c.drain_deadline = a.drain_deadline;
    c.max_connections_per_listener =
        (a.max_connections_per_listener > 0).then_some(a.max_connections_per_listener);
    c
}

/// Identities of the HBONE workloads on this node: the only ones this node may hold certificates for.
fn local_identities(state: &StateStore, node: &str) -> HashSet<SpiffeId> {
    state
        .current()
        .local_workloads(node)
        .filter(|w| w.protocol == TunnelProtocol::Hbone)
        .filter_map(
            |w| match SpiffeId::new(&w.trust_domain, &w.namespace, &w.service_account) {
                Ok(id) => Some(id),
                Err(e) => {
                    tracing::warn!(workload = %w.uid, error = %e, "workload has no valid identity");
                    None
                }
            },
        )
        .collect()
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

/// The plugin host's settings. A call never creates a plugin instance (it fails with `no_instance` when none is
/// idle), so each plugin keeps one for every thread that may call at once: the data-path workers and the thread
/// re-checking live connections.
fn plugin_host_config(args: &RunArgs) -> HostConfig {
    let defaults = HostConfig::default();
    // Calls never create instances, so each plugin keeps one per thread that may call at once (the data-path
    // workers and the re-check thread), twice over: a burst of trapping calls (each throws its instance away)
    // then leaves instances for the plugin's healthy calls while the refill thread replaces the lost ones.
    let instances = defaults
        .prewarm_instances
        .max((args.worker_threads.max(1) + 1) * 2 + 2);
    HostConfig {
        cache_dir: args.plugin_cache.clone(),
        rollout: weft_state::PluginRollout {
            window: args.plugin_rollout_window,
            max_failure_ppm: weft_state::PluginRollout::ppm(args.plugin_rollout_max_failure_ratio),
            min_calls: args.plugin_rollout_min_calls,
            disabled: args.plugin_rollout_window.is_zero(),
        },
        prewarm_instances: instances,
        max_idle_per_plugin: defaults.max_idle_per_plugin.max(instances),
        ..defaults
    }
}

/// Run the node until SIGTERM/SIGINT or `/quitquitquit`, then drain.
pub fn run(args: RunArgs) -> anyhow::Result<()> {
    let logs = logging::init(&args.log, args.log_format)?;
    let control = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .thread_name("weft-control")
        .build()?;
    let data = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.worker_threads.max(1))
        .enable_all()
        .thread_name("weft-data")
        .build()?;

    let state = Arc::new(StateStore::new());
    weft_state::load_into(&args.config, &state)
        .with_context(|| "loading the mesh config".to_owned())?;
    let ca_settings = args.ca.settings(args.ca_dir.clone(), &args.cluster_id);
    let ca = weft_identity::select::build_ca(&ca_settings).context("setting up the CA client")?;
    if args.ca.ca_kind == crate::cli::CaKind::Local {
        tracing::warn!(ca_dir = %args.ca_dir.as_deref().unwrap_or(std::path::Path::new("-")).display(),
            "local CA mode: the CA's private key is on this node, so whoever takes this node can mint any identity \
             in the mesh; use it on a single machine or for development only (a cluster: --ca-kind istio or k8s-csr)");
    }
    // Built inside the control runtime, so CA calls run there.
    let identity = {
        let _in_control = control.enter();
        SecretManager::new(
            ca,
            ManagerConfig {
                validity: args.cert_validity,
                ca_timeout: args.ca.ca_timeout + Duration::from_secs(5),
                ..ManagerConfig::default()
            },
        )
    };
    let host =
        Arc::new(PluginHost::new(plugin_host_config(&args)).context("starting the plugin host")?);
    let hooks: Arc<dyn ConnectionHooks> = host.clone();

    let metrics = Arc::new(ProxyMetrics::default());
    let mut registry = Registry::default();
    metrics.register(&mut registry);
    host.register_metrics(&mut registry);
    registry.register_collector(Box::new(NodeCollector {
        state: state.clone(),
        identity: identity.clone(),
    }));
    let quit = CancellationToken::new();
    let node = Arc::new(Node {
        node: args.node.clone(),
        state: state.clone(),
        identity: identity.clone(),
        proxy: std::sync::OnceLock::new(),
        registry,
        logs,
        quit: quit.clone(),
        plugins: {
            let host = host.clone();
            Box::new(move || serde_json::to_value(host.status()).unwrap_or_default())
        },
    });
    let pcfg = proxy_config(&args);
    tracing::info!(node = %args.node, config = %args.config.display(), version = state.version(), "weft starting");

    control.block_on(async {
        let _watch = weft_state::watch_file(args.config.clone(), state.clone(), args.config_poll);
        let _refresh = identity.spawn_refresher(Duration::from_secs(1));
        identity.retain(&local_identities(&state, &args.node));
        // Plugins load before the first connection is accepted; later config versions are applied in order.
        apply_plugins(&host, &state.current(), args.default_plugins).await;
        {
            let (state, host) = (state.clone(), host.clone());
            let mut rx = state.subscribe();
            tokio::spawn(async move {
                while rx.changed().await.is_ok() {
                    apply_plugins(&host, &state.current(), args.default_plugins).await;
                }
            });
        }
        {
            let (state, identity, node_name) = (state.clone(), identity.clone(), args.node.clone());
            let mut rx = state.subscribe();
            tokio::spawn(async move {
                while rx.changed().await.is_ok() {
                    identity.retain(&local_identities(&state, &node_name));
                }
            });
        }
        let stop_admin = CancellationToken::new();
        let handler: Arc<dyn AdminHandler> = node.clone();
        for (which, l) in [
            (Server::Admin, args.admin),
            (Server::Metrics, args.metrics),
            (Server::Readiness, args.readiness),
        ] {
            if let Listen::At(addr) = l {
                weft_admin::serve(which, addr, handler.clone(), stop_admin.clone()).await?;
            }
        }
        let proxy = data
            .spawn(Proxy::start(
                pcfg,
                state.clone(),
                identity.clone(),
                hooks,
                metrics,
            ))
            .await
            .context("data path task")??;
        let _ = node.proxy.set(proxy.clone());
        tracing::info!("weft ready to serve");

        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM received"),
            r = tokio::signal::ctrl_c() => { r?; tracing::info!("SIGINT received") }
            () = quit.cancelled() => tracing::info!("/quitquitquit received"),
        }
        data.spawn(async move { proxy.drain().await }).await?;
        stop_admin.cancel();
        anyhow::Ok(())
    })?;
    data.shutdown_timeout(Duration::from_secs(1));
    Ok(())
}
