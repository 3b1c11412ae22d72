//! A pod's DNS proxy: weft-dns on the pod's loopback (`127.0.0.1:15053`, and `[::1]:15053` where IPv6 works), UDP
//! and TCP, inside the pod's network namespace, where istio-cni's pod rules redirect the pod's port-53 traffic.
//! Every question on it is the pod's own ([`Clients::Pod`]); forwarded questions leave from the pod's namespace,
//! marked so the pod's rules let them out, as ztunnel's per-pod DNS proxy does.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use socket2::{Domain, Protocol, Socket, Type};
use weft_dns::{
    Clients, DnsConfig, DnsMetrics, DnsServer, DnsSockets, Forwarder, ForwarderConfig, Serving,
    SystemClock, TcpConnect, UdpBind, UpstreamSockets,
};
use weft_state::{LocalPod, StateStore};

use crate::netns::NetnsThread;

/// The DNS proxy settings every pod gets.
#[derive(Debug, Clone)]
pub struct PodDns {
    /// Port on the pod's loopback (15053: where istio-cni's rules send port 53).
    pub port: u16,
    /// Upstream resolvers and forwarding behaviour (the node's resolv.conf, as ztunnel reads its own).
    pub forwarder: ForwarderConfig,
    /// Answers.
    pub config: DnsConfig,
    /// Metrics (shared by every pod).
    pub metrics: Arc<DnsMetrics>,
}

/// Upstream sockets created by the pod's namespace thread, so forwarded questions leave from the pod.
#[derive(Debug)]
struct PodUpstreams {
    thread: Arc<NetnsThread>,
    mark: Option<u32>,
}

impl UpstreamSockets for PodUpstreams {
    fn udp(&self, upstream: SocketAddr) -> UdpBind {
        let (thread, mark) = (self.thread.clone(), self.mark);
        Box::pin(async move {
            let s = thread
                .run(move || weft_dns::new_udp_socket(upstream))
                .await??;
            weft_dns::bind_udp(s, mark, upstream)
        })
    }

    fn tcp(&self, upstream: SocketAddr) -> TcpConnect {
        let (thread, mark) = (self.thread.clone(), self.mark);
        Box::pin(async move {
            let s = thread
                .run(move || weft_dns::new_tcp_socket(upstream))
                .await??;
            weft_dns::connect_tcp(s, mark, upstream).await
        })
    }
}

/// The pod's DNS sockets, bound in its namespace but not served yet.
pub(crate) struct Bound {
    pairs: Vec<(std::net::UdpSocket, std::net::TcpListener)>,
}

/// Create and bind the pod's DNS sockets on its namespace thread (`SO_REUSEPORT` when `reuse_port`, so a second
/// weft can serve the pod during an upgrade).
pub(crate) async fn bind(
    dns: &PodDns,
    thread: &NetnsThread,
    v6: bool,
    reuse_port: bool,
) -> Result<Bound, String> {
    let mut addrs = vec![SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), dns.port)];
    if v6 {
        addrs.push(SocketAddr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), dns.port));
    }
    let mut pairs = Vec::new();
    for addr in addrs {
        let pair = thread
            .run(move || bind_pair(addr, reuse_port))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| format!("DNS proxy on {addr} in the pod: {e}"))?;
        pairs.push(pair);
    }
    Ok(Bound { pairs })
}

fn bind_pair(
    addr: SocketAddr,
    reuse_port: bool,
) -> io::Result<(std::net::UdpSocket, std::net::TcpListener)> {
    let domain = Domain::for_address(addr);
    let tcp = Socket::new(domain, Type::STREAM.cloexec(), Some(Protocol::TCP))?;
    let udp = Socket::new(domain, Type::DGRAM.cloexec(), Some(Protocol::UDP))?;
    for s in [&tcp, &udp] {
        if domain == Domain::IPV6 {
            s.set_only_v6(true)?;
        }
        s.set_reuse_address(true)?;
        if reuse_port {
            s.set_reuse_port(true)?;
        }
        s.bind(&addr.into())?;
    }
    tcp.listen(128)?;
    Ok((udp.into(), tcp.into()))
}

/// Serve `bound` for `pod` (on the data-path runtime: call inside it).
pub(crate) fn serve(
    dns: &PodDns,
    bound: Bound,
    state: Arc<StateStore>,
    thread: Arc<NetnsThread>,
    mark: Option<u32>,
    node: &str,
    pod: LocalPod,
) -> io::Result<Vec<Serving>> {
    let forwarder = Arc::new(Forwarder::new(
        dns.forwarder.clone(),
        Arc::new(PodUpstreams { thread, mark }),
        Arc::new(SystemClock::default()),
        dns.metrics.clone(),
    ));
    let server = DnsServer::new(state, forwarder, dns.config.clone(), dns.metrics.clone());
    let mut serving = Vec::new();
    for (udp, tcp) in bound.pairs {
        let clients = Clients::Pod {
            node: node.to_string(),
            pod: pod.clone(),
        };
        match DnsSockets::from_std(udp, tcp)
            .and_then(|sockets| server.serve(sockets, clients, Default::default()))
        {
            Ok(s) => serving.push(s),
            Err(e) => {
                serving.iter().for_each(Serving::abort);
                return Err(e);
            }
        }
    }
    Ok(serving)
}
