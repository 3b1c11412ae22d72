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
use weft_plugin_host::{Compiler, HostConfig, Outcome, PluginHost, SubprocessCompiler};
use weft_proxy::{InboundBind, OriginalSource, Proxy, ProxyConfig, ProxyMetrics};
use weft_state::{MeshState, StateStore, TunnelProtocol};

use crate::admin::{Node, NodeCollector};
use crate::cli::{HboneListen, Listen, PluginCompiler, RunArgs};

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
    c.original_source = match (a.original_source, a.inpod.mode) {
        (Some(true), _) => OriginalSource::Required,
        (Some(false), _) => OriginalSource::Off,
        (None, crate::inpod::Mode::Inpod) => OriginalSource::BestEffort,
        (None, crate::inpod::Mode::Node) => OriginalSource::Off,
    };
    c.response_baggage = a.response_baggage;
    c.tls_record_layer = a.tls_record_layer;
    c.idle_timeout = a.idle_timeout;
    c.drain_deadline = a.drain_deadline;
    c.max_connections_per_listener =
        (a.max_connections_per_listener > 0).then_some(a.max_connections_per_listener);
    c
}

/// The DNS proxy's forwarding from the flags. A resolv.conf that cannot be read, or names no server, is logged
/// and leaves the proxy without upstreams (mesh names are still answered; forwarded questions get SERVFAIL), so
/// a node is never kept down by its forwarding setup.
fn dns_forwarding(a: &RunArgs) -> weft_dns::ForwarderConfig {
    let mut fwd = weft_dns::ForwarderConfig::default();
    if a.dns_upstream.is_empty() {
        match weft_dns::resolv::load(&a.dns_resolv_conf) {
            Ok(conf) => {
                fwd.upstreams = conf.nameservers;
                fwd.timeout = conf.timeout;
                fwd.attempts = conf.attempts;
            }
            Err(e) => tracing::warn!(error = %e,
                "DNS proxy has no upstream resolver: names outside the mesh will get SERVFAIL (set --dns-upstream)"),
        }
    } else {
        fwd.upstreams = a.dns_upstream.clone();
    }
    tracing::info!(upstreams = ?fwd.upstreams, "DNS proxy forwards to");
    fwd
}

/// How the DNS proxy answers, from the flags.
fn dns_config(a: &RunArgs) -> weft_dns::DnsConfig {
    weft_dns::DnsConfig {
        cluster_domain: a.cluster_domain.clone(),
        ..Default::default()
    }
}

/// Node mode's DNS proxy: one server, upstream sockets in weft's namespace.
fn dns_server(
    a: &RunArgs,
    state: Arc<StateStore>,
    metrics: Arc<weft_dns::DnsMetrics>,
) -> weft_dns::DnsServer {
    let forwarder = Arc::new(weft_dns::Forwarder::new(
        dns_forwarding(a),
        Arc::new(weft_dns::NodeSockets { mark: a.mark }),
        Arc::new(weft_dns::SystemClock::default()),
        metrics.clone(),
    ));
    weft_dns::DnsServer::new(state, forwarder, dns_config(a), metrics)
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

/// The plugin host's settings. A call never creates a plugin instance (it fails with `no_instance` when none is
/// idle), so each policy plugin keeps one for every thread that may call at once: the data-path workers and the
/// thread re-checking live connections. (A telemetry plugin keeps two: only the telemetry thread calls it.)
fn plugin_host_config(args: &RunArgs) -> HostConfig {
    let defaults = HostConfig::default();
    // Calls never create instances, so each policy plugin keeps one per thread that may call at once (the data-path
    // workers and the re-check thread), twice over: a burst of trapping calls (each throws its instance away)
    // then leaves instances for the plugin's healthy calls while the refill thread replaces the lost ones.
    let instances = defaults
        .prewarm_instances
        .max((worker_threads(args) + shard_count(args) + 1) * 2 + 2);
    HostConfig {
        cache_dir: args.plugin_cache.clone(),
        compiler: match args.plugin_compiler {
            PluginCompiler::InProcess => Compiler::InProcess,
            PluginCompiler::Subprocess => Compiler::Subprocess(SubprocessCompiler {
                // The running binary itself, even if its file was replaced since it started.
                program: "/proc/self/exe".into(),
                args: vec!["compile-plugin".into()],
                timeout: args.plugin_compile_timeout,
                address_space_limit: (args.plugin_compile_memory_mib > 0)
                    .then(|| args.plugin_compile_memory_mib.saturating_mul(1 << 20)),
            }),
        },
        rollout: weft_state::PluginRollout {
            window: args.plugin_rollout_window,
            max_failure_ppm: weft_state::PluginRollout::ppm(args.plugin_rollout_max_failure_ratio),
            min_calls: args.plugin_rollout_min_calls,
            disabled: args.plugin_rollout_window.is_zero(),
        },
        prewarm_instances: instances,
        telemetry_linger: args.plugin_telemetry_linger,
        epoch_tick: args.plugin_epoch_tick,
        max_idle_per_plugin: defaults.max_idle_per_plugin.max(instances),
        allow_unenforced_policies: args.allow_unenforced_policies,
        ..defaults
    }
}

/// CPUs this process may use: cores, less what its affinity mask and cgroup CPU limit leave out.
fn available_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
}

/// The data path's worker threads (`--worker-threads`, `auto` sized from [`available_cpus`] and the shards).
fn worker_threads(args: &RunArgs) -> usize {
    args.worker_threads
        .count(available_cpus(), shard_count(args))
}

/// The data path's shards (`--shards`, `auto` sized from [`available_cpus`]); 0: none.
fn shard_count(args: &RunArgs) -> usize {
    args.shards.count(available_cpus())
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
pub fn run(mut args: RunArgs) -> anyhow::Result<()> {
    // One cluster id for the CA, xDS and telemetry (ztunnel's rule: ISTIO_META_CLUSTER_ID wins over CLUSTER_ID).
    args.cluster_id = crate::xds::cluster_id(
        std::env::var("ISTIO_META_CLUSTER_ID").ok(),
        &args.cluster_id,
    );
    // `_log_flush` is dropped last (locals drop in reverse): the lines of the whole drain are written.
    let (logs, _log_flush) = weft_logging::init(&args.log, args.log_format, args.log_linger)?;

    let control = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .thread_name("weft-control")
        .build()?;
    let data = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(worker_threads(&args))
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
        crate::xds::start(
            &args.xds,
            &args.node,
            &args.cluster_id,
            &state,
            plugins_applied_rx,
        )
        .context("starting the xDS client")?
    };
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
    {
        let _in_control = control.enter();
        let plugins = crate::plugin_xds::start(
            &args.plugin_xds,
            crate::plugin_xds::FetchPaths {
                cache_dir: args.plugin_fetch_cache.clone(),
                pull_secret: args.plugin_pull_secret.clone(),
            },
            crate::xds::node_info(&args.xds, &args.node, &args.cluster_id),
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
    let inpod_status = (args.inpod.mode == crate::inpod::Mode::Inpod)
        .then(|| Arc::new(weft_inpod::Status::default()));
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
    let shards = match shard_count(&args) {
        0 => None,
        n => Some(ShardThreads::start(n)?),
    };
    let mut pcfg = proxy_config(&args);
    pcfg.shards = shards.as_ref().map(|s| s.shards.clone());
    tracing::info!(node = %args.node, config = ?args.config, xds = ?args.xds.xds_address, version = state.version(),
        worker_threads = worker_threads(&args), shards = shard_count(&args), cpus = available_cpus(),
        tls_record_layer = %pcfg.tls_record_layer, "weft starting");

    control.block_on(async {
        // Signal handlers first: a SIGTERM that arrives while weft starts (a supervisor that reads "ready" and
        // stops it at once) is then a drain once started, never the default action's kill.
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        let mut int = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
        let _watch = args
            .config
            .clone()
            .map(|c| weft_state::watch_file(c, state.clone(), args.config_poll));
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
                    forwarder: dns_forwarding(&args),
                    config: dns_config(&args),
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
