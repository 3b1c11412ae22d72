//! Test kit for the DNS proxy: a real upstream DNS server (weft-devmesh's), a proxy over a mesh file with a
//! hand-moved clock, and raw clients that send from a chosen source address.

#![allow(dead_code, clippy::unwrap_used)]

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use hickory_proto::op::{Edns, Message, MessageType, Query};
use hickory_proto::rr::{Name, RData, RecordType};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream, UdpSocket};
use tokio_util::sync::CancellationToken;
use weft_dns::{
    Clients, DnsConfig, DnsMetrics, DnsServer, DnsSockets, Forwarder, ForwarderConfig, ManualClock,
    NodeSockets, Serving,
};
use weft_state::StateStore;

/// A generous bound on waiting for one answer (an event; never expected to be reached).
pub const WAIT: Duration = Duration::from_secs(30);

/// The test upstream, on 127.0.0.1.
pub use weft_devmesh::dns::Upstream;

/// A DNS proxy serving `mesh` (ztunnel's local-config YAML) for `clients`, forwarding to `upstreams`.
pub struct Proxy {
    pub serving: Serving,
    pub addr: SocketAddr,
    pub clock: Arc<ManualClock>,
    pub state: Arc<StateStore>,
    pub metrics: Arc<DnsMetrics>,
    pub forwarder: Arc<Forwarder>,
}

impl Proxy {
    pub async fn start(mesh: &str, clients: Clients, upstreams: Vec<SocketAddr>) -> Proxy {
        let state = Arc::new(StateStore::new());
        state.replace(weft_state::local::parse(mesh, Path::new("/")).unwrap());
        let clock = Arc::new(ManualClock::default());
        let metrics = Arc::new(DnsMetrics::default());
        let forwarder = Arc::new(Forwarder::new(
            ForwarderConfig {
                upstreams,
                timeout: WAIT,
                attempts: 1,
                ..Default::default()
            },
            Arc::new(NodeSockets::default()),
            clock.clone(),
            metrics.clone(),
        ));
        let server = DnsServer::new(
            state.clone(),
            forwarder.clone(),
            DnsConfig::default(),
            metrics.clone(),
        );
        let sockets = DnsSockets::bind("127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
        let serving = server
            .serve(sockets, clients, CancellationToken::new())
            .unwrap();
        assert_eq!(serving.udp_addr, serving.tcp_addr);
        Proxy {
            addr: serving.udp_addr,
            serving,
            clock,
            state,
            metrics,
            forwarder,
        }
    }

    /// Requests counted with this transport and result.
    pub fn count(&self, transport: &'static str, result: &'static str) -> u64 {
        self.metrics
            .requests
            .get_or_create(&weft_dns::RequestLabels { transport, result })
            .get()
    }
}

/// How a raw query travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    Udp,
    Tcp,
}

/// A query message for `name`/`rtype` (RD set, id random, EDNS when `edns`).
pub fn query(name: &str, rtype: RecordType, edns: bool) -> Message {
    let mut m = Message::query();
    m.metadata.id = rand::random();
    m.metadata.recursion_desired = true;
    m.add_query(Query::query(Name::from_ascii(name).unwrap(), rtype));
    if edns {
        let mut e = Edns::new();
        e.set_max_payload(1232);
        m.set_edns(e);
    }
    m
}

/// Send raw bytes to `server` from `src` (an address on this machine) and return the raw reply.
pub async fn exchange(server: SocketAddr, src: IpAddr, bytes: &[u8], via: Via) -> Vec<u8> {
    match via {
        Via::Udp => {
            let s = UdpSocket::bind(SocketAddr::new(src, 0)).await.unwrap();
            s.send_to(bytes, server).await.unwrap();
            let mut buf = vec![0u8; 65535];
            let (n, from) = tokio::time::timeout(WAIT, s.recv_from(&mut buf))
                .await
                .expect("no UDP reply")
                .unwrap();
            assert_eq!(from, server);
            buf.truncate(n);
            buf
        }
        Via::Tcp => {
            let mut s = tcp_from(src, server).await;
            s.write_u16(bytes.len() as u16).await.unwrap();
            s.write_all(bytes).await.unwrap();
            let len = tokio::time::timeout(WAIT, s.read_u16())
                .await
                .expect("no TCP reply")
                .unwrap();
            let mut buf = vec![0u8; usize::from(len)];
            s.read_exact(&mut buf).await.unwrap();
            buf
        }
    }
}

/// A TCP connection to `server` from `src`.
pub async fn tcp_from(src: IpAddr, server: SocketAddr) -> TcpStream {
    let sock = TcpSocket::new_v4().unwrap();
    sock.bind(SocketAddr::new(src, 0)).unwrap();
    sock.connect(server).await.unwrap()
}

/// Ask `server` from `src` and decode the reply, checking it answers this query.
pub async fn ask(
    server: SocketAddr,
    src: IpAddr,
    name: &str,
    rtype: RecordType,
    via: Via,
) -> Message {
    let q = query(name, rtype, false);
    let reply = Message::from_vec(&exchange(server, src, &q.to_vec().unwrap(), via).await).unwrap();
    assert_eq!(reply.metadata.id, q.metadata.id);
    assert_eq!(reply.metadata.message_type, MessageType::Response);
    assert_eq!(reply.queries, q.queries, "the question is echoed");
    reply
}

/// The addresses in a reply's answer section, sorted.
pub fn ips(m: &Message) -> Vec<IpAddr> {
    let mut v: Vec<IpAddr> = m
        .answers
        .iter()
        .filter_map(|r| match &r.data {
            RData::A(a) => Some(IpAddr::V4(a.0)),
            RData::AAAA(a) => Some(IpAddr::V6(a.0)),
            _ => None,
        })
        .collect();
    v.sort();
    v
}

pub fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}
