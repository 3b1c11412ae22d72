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
use weft_identity::{SecretManager, SpiffeId};
use weft_plugin_host::{Outcome, PluginHost};
use weft_proxy::{Proxy, ProxyMetrics};
use weft_state::{MeshState, StateStore, TunnelProtocol};

use crate::admin::{Node, NodeCollector};
use crate::config::{CaKind, Listen, Mode, NodeConfig};

/// Node mode's DNS proxy: one server, upstream sockets in weft's namespace.
fn dns_server(
    a: &NodeConfig,
    state: Arc<StateStore>,
    metrics: Arc<weft_dns::DnsMetrics>,
) -> weft_dns::DnsServer {
    let forwarder = Arc::new(weft_dns::Forwarder::new(
        a.dns_forwarding(),
        Arc::new(weft_dns::NodeSockets { mark: a.mark }),
        Arc::new(weft_dns::SystemClock::default()),
        metrics.clone(),
    ));
    weft_dns::DnsServer::new(state, forwarder, a.dns_config(), metrics)
}

/// Identities of the HBONE workloads on this node (in-pod mode: of the pods weft serves): the only ones this
/// node may hold certificates for.
fn local_identities(
    state: &StateStore,
    node: &str,
    inpod: Option<&weft_inpod::Status>,
) -> HashSet<SpiffeId> {
    state
        .current()
        .local_workloads(node)
        .filter(|w| w.protocol == TunnelProtocol::Hbone)
        .filter(|w| inpod.is_none_or(|p| crate::inpod::InPod::serves(p, node, w)))
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

/// CPUs this process may use: cores, less what its affinity mask and cgroup CPU limit leave out.
fn available_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
}

/// The shards' threads (`--shards`): each drives a current-thread runtime until it is told to stop.
struct ShardThreads {
    shards: Arc<weft_proxy::shards::Shards>,
    stop: Vec<tokio::sync::oneshot::Sender<()>>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl ShardThreads {
    fn start(n: usize) -> anyhow::Result<Self> {
        let (mut handles, mut stop, mut threads) = (Vec::new(), Vec::new(), Vec::new());
        for i in 0..n {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            handles.push(rt.handle().clone());
            let (tx, rx) = tokio::sync::oneshot::channel::<()>();
            stop.push(tx);
            threads.push(
                std::thread::Builder::new()
                    .name(format!("weft-shard-{i}"))
                    .spawn(move || {
                        weft_proxy::shards::enter(i);
                        rt.block_on(async {
                            let _ = rx.await;
                        });
                        rt.shutdown_timeout(Duration::from_secs(1));
                    })?,
            );
        }
        let shards = weft_proxy::shards::Shards::new(handles)
            .ok_or_else(|| anyhow::anyhow!("--shards needs at least one shard"))?;
        Ok(Self {
            shards: Arc::new(shards),
            stop,
            threads,
        })
    }

    /// Stops every shard (what still runs on it is dropped) and waits for its thread.
    fn stop(self) {
        drop(self.stop);
        for t in self.threads {
            if t.join().is_err() {
                tracing::error!("a shard thread panicked");
            }
        }
    }
}

/// Run the node until SIGTERM/SIGINT or `/quitquitquit`, then drain.
pub fn run(args: NodeConfig) -> anyhow::Result<()> {
    // `_log_flush` is dropped last (locals drop in reverse): the lines of the whole drain are written.
    let (logs, _log_flush) =
        weft_logging::init(&args.log, args.log_format, args.tuning.log_linger)?;

    let control = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .thread_name("weft-control")
        .build()?;
    let data = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.worker_threads(available_cpus()))
        .enable_all()
        .thread_name("weft-data")
        .build()?;

    let state = Arc::new(StateStore::new());
    if let Some(config) = &args.config {
        weft_state::load_into(config, &state)
            .with_context(|| "loading the mesh config".to_owned())?;
    }
    // The state version the plugin host runs (policies from xDS are ACKed once it does).
    let (plugins_applied, plugins_applied_rx) = tokio::sync::watch::channel(0u64);
    let mut xds = {
        let _in_control = control.enter();
        crate::xds::start(&args, &state, plugins_applied_rx).context("starting the xDS client")?
    };
    let ca_settings = args.ca_settings();
    let ca = weft_identity::select::build_ca(&ca_settings).context("setting up the CA client")?;
    if args.ca.ca_kind == CaKind::Local {
        tracing::warn!(ca_dir = %args.ca_dir.as_deref().unwrap_or(std::path::Path::new("-")).display(),
            "local CA mode: the CA's private key is on this node, so whoever takes this node can mint any identity \
             in the mesh; use it on a single machine or for development only (a cluster: --ca-kind istio or k8s-csr)");
    }
    // Built inside the control runtime, so CA calls run there.
    let identity = {
        let _in_control = control.enter();
        SecretManager::new(ca, args.manager_config())
    };
    let host = Arc::new(
        PluginHost::new(args.plugin_host_config(available_cpus()))
            .context("starting the plugin host")?,
    );
    let hooks: Arc<dyn ConnectionHooks> = host.clone();
    {
        let _in_control = control.enter();
        let plugins = crate::plugin_xds::start(
            &args.plugin_xds,
            args.fetch_paths(),
            crate::xds::node_info(&args),
            args.cluster_id.clone(),
            &state,
            &host,
        )
        .context("starting the plugin xDS client")?;
        xds.extend(plugins);
    }

    let metrics = Arc::new(ProxyMetrics::default());
    let dns_metrics = Arc::new(weft_dns::DnsMetrics::default());
    let mut registry = Registry::default();
    metrics.register(&mut registry);
    dns_metrics.register(&mut registry);
    host.register_metrics(&mut registry);
    let inpod_status =
        (args.inpod.mode == Mode::Inpod).then(|| Arc::new(weft_inpod::Status::default()));
    if let Some(s) = &inpod_status {
        s.register(&mut registry);
    }
    registry.register_collector(Box::new(NodeCollector {
        state: state.clone(),
        identity: identity.clone(),
    }));
    registry.register_collector(Box::new(crate::xds::XdsCollector(xds.clone())));
    let quit = CancellationToken::new();
    let node = Arc::new(Node {
        node: args.node.clone(),
        config: serde_json::to_value(&args).unwrap_or_default(),
        state: state.clone(),
        identity: identity.clone(),
        proxy: std::sync::OnceLock::new(),
        inpod: inpod_status.clone(),
        registry,
        logs,
        quit: quit.clone(),
        needs_file: args.config.is_some(),
        xds,
        plugins: {
            let host = host.clone();
            Box::new(move || serde_json::to_value(host.status()).unwrap_or_default())
        },
        unenforced_policies: {
            let host = host.clone();
            Box::new(move || host.unenforced_policies())
        },
    });
    let shards = match args.shard_count(available_cpus()) {
        0 => None,
        n => Some(ShardThreads::start(n)?),
    };
    let mut pcfg = args.proxy_config();
    pcfg.shards = shards.as_ref().map(|s| s.shards.clone());
    tracing::info!(node = %args.node, config = ?args.config, xds = ?args.xds.xds_address, version = state.version(),
        worker_threads = args.worker_threads(available_cpus()), shards = args.shard_count(available_cpus()), cpus = available_cpus(),
        tls_record_layer = %pcfg.tls_record_layer, "weft starting");

    control.block_on(async {
        // Signal handlers first: a SIGTERM that arrives while weft starts (a supervisor that reads "ready" and
        // stops it at once) is then a drain once started, never the default action's kill.
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        let mut int = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
        let _watch = args
            .config
            .clone()
            .map(|c| weft_state::watch_file(c, state.clone(), args.tuning.config_poll));
        let _refresh = identity.spawn_refresher(Duration::from_secs(1));
        // Subscribed before the first await: a source (xDS) may change the state while the plugins load, and that
        // version must not be missed by either loop.
        let mut plugins_rx = state.subscribe();
        let mut identity_rx = state.subscribe();
        identity.retain(&local_identities(
            &state,
            &args.node,
            inpod_status.as_deref(),
        ));
        {
            let (state, identity, node_name) = (state.clone(), identity.clone(), args.node.clone());
            let inpod = inpod_status.clone();
            let mut pods = inpod.as_ref().map(|s| s.subscribe());
            tokio::spawn(async move {
                loop {
                    // In-pod mode: the set also changes when pods come and go.
                    let pods_changed = async {
                        match pods.as_mut() {
                            Some(p) => p.changed().await.is_ok(),
                            None => std::future::pending().await,
                        }
                    };
                    let alive = tokio::select! {
                        r = identity_rx.changed() => r.is_ok(),
                        ok = pods_changed => ok,
                    };
                    if !alive {
                        return;
                    }
                    identity.retain(&local_identities(&state, &node_name, inpod.as_deref()));
                }
            });
        }
        // Plugins load before the first connection is accepted; later config versions are applied in order.
        let current = state.current();
        apply_plugins(&host, &current, args.default_plugins).await;
        plugins_applied.send_replace(current.version);
        {
            let (state, host) = (state.clone(), host.clone());
            tokio::spawn(async move {
                while plugins_rx.changed().await.is_ok() {
                    let current = state.current();
                    apply_plugins(&host, &current, args.default_plugins).await;
                    plugins_applied.send_replace(current.version);
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
        // The DNS proxy serves on the data-path runtime, bound before the node reports ready. In-pod mode has
        // no node-wide listener: each pod gets its own on its loopback, at --dns's port.
        let mut pod_dns = None;
        let dns = match args.dns {
            Listen::At(addr) if inpod_status.is_some() => {
                tracing::info!(
                    port = addr.port(),
                    "in-pod mode: the DNS proxy listens inside each pod, on 127.0.0.1 and [::1]"
                );
                pod_dns = Some(weft_inpod::PodDns {
                    port: addr.port(),
                    forwarder: args.dns_forwarding(),
                    config: args.dns_config(),
                    metrics: dns_metrics,
                });
                None
            }
            Listen::At(addr) => {
                let server = dns_server(&args, state.clone(), dns_metrics);
                let node_name = args.node.clone();
                let serving = data
                    .spawn(async move {
                        let sockets = weft_dns::DnsSockets::bind(addr).await?;
                        server.serve(
                            sockets,
                            weft_dns::Clients::Node { node: node_name },
                            CancellationToken::new(),
                        )
                    })
                    .await
                    .context("DNS proxy task")?
                    .with_context(|| format!("cannot listen on {addr} (DNS proxy)"))?;
                Some(serving)
            }
            Listen::Off => None,
        };
        // In-pod mode: no shared listeners, one data path per pod the CNI node agent hands over.
        let mut inpod = None;
        let mut proxy = None;
        if let Some(status) = &inpod_status {
            inpod = Some(crate::inpod::InPod::start(
                &args.inpod,
                pcfg,
                state.clone(),
                identity.clone(),
                hooks,
                metrics,
                status.clone(),
                data.handle().clone(),
                pod_dns,
            )?);
        } else {
            let p = data
                .spawn(Proxy::start(
                    pcfg,
                    state.clone(),
                    identity.clone(),
                    hooks,
                    metrics,
                ))
                .await
                .context("data path task")??;
            let _ = node.proxy.set(p.clone());
            proxy = Some(p);
        }
        tracing::info!("weft ready to serve");

        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM received"),
            _ = int.recv() => tracing::info!("SIGINT received"),
            () = quit.cancelled() => tracing::info!("/quitquitquit received"),
        }
        if let Some(dns) = dns {
            data.spawn(async move { dns.stop().await }).await?;
        }
        if let Some(proxy) = proxy {
            data.spawn(async move { proxy.drain().await }).await?;
        }
        if let Some(inpod) = inpod {
            inpod.drain().await;
        }
        stop_admin.cancel();
        anyhow::Ok(())
    })?;
    data.shutdown_timeout(Duration::from_secs(1));
    if let Some(s) = shards {
        s.stop();
    }
    Ok(())
}
