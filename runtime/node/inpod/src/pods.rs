//! A pod's listener set: a weft data path of its own (15001 outbound capture, 15006 inbound plaintext, 15008
//! HBONE, and the DNS proxy on 15053) whose sockets, listeners and outgoing connections alike, are created inside the pod's network namespace
//! by the namespace thread. So outbound connections leave with the pod's own source address, and the
//! listeners set `SO_REUSEPORT` (unless turned off) so a second weft can serve the pod during an upgrade. The
//! data paths share the node's mesh state, certificates, plugins and metrics.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use serde_json::{Value, json};
use weft_hooks::ConnectionHooks;
use weft_identity::SecretManager;
use weft_proxy::{InboundBind, LocalPod, Proxy, ProxyConfig, ProxyMetrics};
use weft_state::StateStore;

use weft_dns::Serving;

use crate::dns::{self, PodDns};
use crate::manager::ListenerSets;
use crate::netns::{Netns, NetnsThread};
use crate::protocol::PodInfo;
use crate::status::Describe;

/// Ports of a pod's listeners (ztunnel's).
#[derive(Debug, Clone, Copy)]
pub struct PodPorts {
    /// Outbound capture.
    pub outbound: u16,
    /// Inbound plaintext capture.
    pub inbound_plaintext: u16,
    /// Inbound HBONE.
    pub hbone: u16,
}

impl Default for PodPorts {
    fn default() -> Self {
        Self {
            outbound: 15001,
            inbound_plaintext: 15006,
            hbone: 15008,
        }
    }
}

/// Opens per-pod data paths.
pub struct ProxyPods {
    /// The data-path settings every pod starts from (node name, mark, timeouts, drain deadline, reuse_port);
    /// listener addresses and the pod are set per pod.
    pub base: ProxyConfig,
    /// Ports of each pod's listeners.
    pub ports: PodPorts,
    /// The mesh state.
    pub state: Arc<StateStore>,
    /// Certificates.
    pub identity: Arc<SecretManager>,
    /// Plugins.
    pub hooks: Arc<dyn ConnectionHooks>,
    /// Data-path metrics (shared by every pod).
    pub metrics: Arc<ProxyMetrics>,
    /// The data-path runtime: pods' listeners and connections run there.
    pub data: tokio::runtime::Handle,
    /// The per-pod DNS proxy (15053 on the pod's loopback), `None` when turned off.
    pub dns: Option<PodDns>,
}

impl std::fmt::Debug for ProxyPods {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProxyPods")
            .field("node", &self.base.node)
            .finish_non_exhaustive()
    }
}

/// One pod's open data path.
pub struct PodListeners {
    proxy: Arc<Proxy>,
    thread: Arc<NetnsThread>,
    dns: std::sync::Mutex<Vec<Serving>>,
}

impl PodListeners {
    /// The pod's data path.
    pub fn proxy(&self) -> &Arc<Proxy> {
        &self.proxy
    }
}

impl Describe for PodListeners {
    fn describe(&self) -> Value {
        let mut listeners: Vec<Value> = self
            .proxy
            .bound_addrs()
            .iter()
            .map(|(what, a)| json!({"listener": what, "addr": a.to_string()}))
            .collect();
        if let Ok(dns) = self.dns.lock() {
            for s in dns.iter() {
                listeners.push(json!({"listener": "dns_udp", "addr": s.udp_addr.to_string()}));
                listeners.push(json!({"listener": "dns_tcp", "addr": s.tcp_addr.to_string()}));
            }
        }
        json!({
            "listeners": listeners,
            "liveConnections": self.proxy.tracker().len(),
            "pooledHbone": self.proxy.pooled_connections(),
            "netns": self.thread.netns_id().to_string(),
        })
    }

    fn connections(&self) -> Vec<weft_proxy::LiveConnection> {
        self.proxy.tracker().live()
    }
}

/// Whether IPv6 sockets work in the current namespace (then listeners bind `[::]` and take IPv4 too).
fn ipv6_usable() -> bool {
    let Ok(s) = socket2::Socket::new(socket2::Domain::IPV6, socket2::Type::STREAM, None) else {
        return false;
    };
    let _ = s.set_only_v6(false);
    s.bind(&SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), 0).into())
        .is_ok()
}

/// Turn on `net.ipv4.tcp_migrate_req` in the current network namespace.
pub(crate) fn enable_migrate_req() -> std::io::Result<()> {
    const PATH: &str = "/proc/sys/net/ipv4/tcp_migrate_req";
    if std::fs::read_to_string(PATH)?.trim() == "1" {
        return Ok(());
    }
    std::fs::write(PATH, "1")
}

impl ListenerSets for ProxyPods {
    type Set = PodListeners;

    async fn open(&self, pod: &PodInfo, netns: &Arc<Netns>) -> Result<Arc<PodListeners>, String> {
        let thread = Arc::new(
            NetnsThread::new(netns.clone())
                .await
                .map_err(|e| e.to_string())?,
        );
        let v6 = thread.run(ipv6_usable).await.map_err(|e| e.to_string())?;
        if self.base.reuse_port {
            // When the old weft of an upgrade closes its listeners, the kernel hands the connections still waiting
            // in their accept queues to the new weft's listeners of the same SO_REUSEPORT group, instead of
            // resetting them (net.ipv4.tcp_migrate_req, Linux 5.14+, per namespace: written from the pod's thread).
            match thread.run(enable_migrate_req).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) | Err(e) => {
                    tracing::warn!(uid = %pod.uid, error = %e, "cannot enable net.ipv4.tcp_migrate_req in the pod: an upgrade may reset connections queued on the old listeners")
                }
            }
        }
        let any = if v6 {
            IpAddr::V6(Ipv6Addr::UNSPECIFIED)
        } else {
            IpAddr::V4(Ipv4Addr::UNSPECIFIED)
        };
        let local = LocalPod {
            uid: pod.uid.clone(),
            name: pod.name.clone(),
            namespace: pod.namespace.clone(),
            service_account: pod.service_account.clone(),
        };
        // DNS sockets first: a pod whose DNS port cannot be bound is not served (error ack, retried), and nothing
        // has to be undone.
        let dns_bound = match &self.dns {
            Some(d) => Some(dns::bind(d, &thread, v6, self.base.reuse_port).await?),
            None => None,
        };
        let mut cfg = self.base.clone();
        cfg.pod = Some(local.clone());
        cfg.outbound_addr = Some(SocketAddr::new(any, self.ports.outbound));
        cfg.inbound_plaintext_addr = Some(SocketAddr::new(any, self.ports.inbound_plaintext));
        cfg.inbound = InboundBind::Addr(SocketAddr::new(any, self.ports.hbone));
        cfg.socks5_addr = None;
        // The socket is in the pod's namespace: the kernel picks the pod's address as the source.
        cfg.bind_source_ip = false;
        let start = Proxy::start_with(
            cfg,
            self.state.clone(),
            self.identity.clone(),
            self.hooks.clone(),
            self.metrics.clone(),
            Some(thread.clone()),
        );
        let proxy = self
            .data
            .spawn(start)
            .await
            .map_err(|e| format!("data path task: {e}"))?
            .map_err(|e| e.to_string())?;
        let mut dns_serving = Vec::new();
        if let (Some(d), Some(bound)) = (self.dns.clone(), dns_bound) {
            let (state, t, mark, node) = (
                self.state.clone(),
                thread.clone(),
                self.base.mark,
                self.base.node.clone(),
            );
            let served = self
                .data
                .spawn(async move { dns::serve(&d, bound, state, t, mark, &node, local) })
                .await
                .map_err(|e| format!("DNS proxy task: {e}"))
                .and_then(|r| r.map_err(|e| format!("DNS proxy in the pod: {e}")));
            match served {
                Ok(s) => dns_serving = s,
                Err(e) => {
                    let p = proxy.clone();
                    let _ = self.data.spawn(async move { p.drain().await }).await;
                    return Err(e);
                }
            }
        }
        Ok(Arc::new(PodListeners {
            proxy,
            thread,
            dns: std::sync::Mutex::new(dns_serving),
        }))
    }

    fn drain(
        &self,
        set: Arc<PodListeners>,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        let data = self.data.clone();
        async move {
            // The DNS proxy stops at once (a question has no connection to drain); the data path drains.
            let dns: Vec<Serving> = set
                .dns
                .lock()
                .map(|mut d| std::mem::take(&mut *d))
                .unwrap_or_default();
            let proxy = set.proxy.clone();
            let _ = data
                .spawn(async move {
                    for s in dns {
                        s.stop().await;
                    }
                    proxy.drain().await
                })
                .await;
            // The namespace thread ends with the last handle on it.
            drop(set);
        }
    }
}
