//! The node's data path: the DNS proxy and the proxy's listeners (node mode), or one data path per pod the CNI
//! node agent hands over (in-pod mode), all on the data-path runtime.

use std::sync::Arc;

use anyhow::Context;
use tokio_util::sync::CancellationToken;
use weft_hooks::ConnectionHooks;
use weft_identity::SecretManager;
use weft_proxy::{Proxy, ProxyConfig, ProxyMetrics};
use weft_state::StateStore;

use crate::config::{Listen, NodeConfig};
use crate::inpod::InPod;

/// What the data path runs with.
pub(super) struct Inputs {
    pub proxy: ProxyConfig,
    pub state: Arc<StateStore>,
    pub identity: Arc<SecretManager>,
    pub hooks: Arc<dyn ConnectionHooks>,
    pub metrics: Arc<ProxyMetrics>,
    pub dns_metrics: Arc<weft_dns::DnsMetrics>,
    /// In-pod mode: the pods' status.
    pub inpod: Option<Arc<weft_inpod::Status>>,
    pub data: tokio::runtime::Handle,
}

/// The running data path.
pub(super) struct DataPath {
    pub dns: Option<weft_dns::Serving>,
    pub proxy: Option<Arc<Proxy>>,
    pub inpod: Option<InPod>,
}

/// Binds the DNS proxy and starts the listeners (node mode) or the ZDS client (in-pod mode).
pub(super) async fn start(config: &NodeConfig, i: Inputs) -> anyhow::Result<DataPath> {
    let Some(status) = i.inpod else {
        let dns = match config.dns {
            Listen::At(addr) => {
                Some(node_dns(config, addr, &i.state, i.dns_metrics, &i.data).await?)
            }
            Listen::Off => None,
        };
        let proxy = i
            .data
            .spawn(Proxy::start(
                i.proxy, i.state, i.identity, i.hooks, i.metrics,
            ))
            .await
            .context("data path task")??;
        return Ok(DataPath {
            dns,
            proxy: Some(proxy),
            inpod: None,
        });
    };
    // In-pod mode: no shared listeners, one data path per pod, each with its own DNS proxy on its loopback at
    // --dns's port.
    let pod_dns = match config.dns {
        Listen::At(addr) => {
            tracing::info!(
                port = addr.port(),
                "in-pod mode: the DNS proxy listens inside each pod, on 127.0.0.1 and [::1]"
            );
            Some(weft_inpod::PodDns {
                port: addr.port(),
                forwarder: config.dns_forwarding(),
                config: config.dns_config(),
                metrics: i.dns_metrics,
            })
        }
        Listen::Off => None,
    };
    let inpod = InPod::start(
        &config.inpod,
        i.proxy,
        i.state,
        i.identity,
        i.hooks,
        i.metrics,
        status,
        i.data,
        pod_dns,
    )?;
    Ok(DataPath {
        dns: None,
        proxy: None,
        inpod: Some(inpod),
    })
}

/// Node mode's DNS proxy: one server, upstream sockets in weft's namespace, bound before the node reports ready.
async fn node_dns(
    config: &NodeConfig,
    addr: std::net::SocketAddr,
    state: &Arc<StateStore>,
    metrics: Arc<weft_dns::DnsMetrics>,
    data: &tokio::runtime::Handle,
) -> anyhow::Result<weft_dns::Serving> {
    let forwarder = Arc::new(weft_dns::Forwarder::new(
        config.dns_forwarding(),
        Arc::new(weft_dns::NodeSockets { mark: config.mark }),
        Arc::new(weft_dns::SystemClock::default()),
        metrics.clone(),
    ));
    let server = weft_dns::DnsServer::new(state.clone(), forwarder, config.dns_config(), metrics);
    let node = config.node.clone();
    data.spawn(async move {
        let sockets = weft_dns::DnsSockets::bind(addr).await?;
        server.serve(
            sockets,
            weft_dns::Clients::Node { node },
            CancellationToken::new(),
        )
    })
    .await
    .context("DNS proxy task")?
    .with_context(|| format!("cannot listen on {addr} (DNS proxy)"))
}

impl DataPath {
    /// Stops the DNS proxy and drains the connections (each with the SIGTERM drain rules).
    pub(super) async fn drain(self, data: &tokio::runtime::Handle) -> anyhow::Result<()> {
        if let Some(dns) = self.dns {
            data.spawn(async move { dns.stop().await }).await?;
        }
        if let Some(proxy) = self.proxy {
            data.spawn(async move { proxy.drain().await }).await?;
        }
        if let Some(inpod) = self.inpod {
            inpod.drain().await;
        }
        Ok(())
    }
}
