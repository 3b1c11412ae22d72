//! Forwarding to the node's resolvers: the question is sent as a fresh query (random id, from a fresh socket with a
//! random port, RD set, EDNS 1232) to each upstream in turn, over UDP and over TCP when the answer is truncated;
//! only an answer with our id and our question is accepted (RFC 5452). Answers are cached by TTL.

use std::fmt::Debug;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use hickory_proto::op::{Edns, Message, MessageType, Query, ResponseCode};
use socket2::{Domain, Protocol, Socket, Type};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UdpSocket};

use crate::cache::{Answer, Cache, Clock, Key};
use crate::metrics::DnsMetrics;

/// Payload size weft advertises to upstreams (the DNS flag day 2020 value).
const UPSTREAM_EDNS_PAYLOAD: u16 = 1232;

/// A boxed future of a TCP connection.
pub type TcpConnect = Pin<Box<dyn Future<Output = io::Result<TcpStream>> + Send>>;

/// A boxed future of a bound UDP socket.
pub type UdpBind = Pin<Box<dyn Future<Output = io::Result<UdpSocket>> + Send>>;

/// Where the sockets to upstream resolvers come from. In node mode they are plain sockets in the node's network
/// namespace (marked, so capture rules let them out); an in-pod implementation creates them in the pod's.
pub trait UpstreamSockets: Send + Sync + Debug {
    /// An unconnected UDP socket bound to an ephemeral port, for talking to `upstream`.
    fn udp(&self, upstream: SocketAddr) -> UdpBind;
    /// A TCP connection to `upstream`.
    fn tcp(&self, upstream: SocketAddr) -> TcpConnect;
}

/// Sockets in the current network namespace, with an optional `SO_MARK`.
#[derive(Debug, Clone, Default)]
pub struct NodeSockets {
    /// `SO_MARK` for every upstream socket.
    pub mark: Option<u32>,
}

impl UpstreamSockets for NodeSockets {
    fn udp(&self, upstream: SocketAddr) -> UdpBind {
        let mark = self.mark;
        Box::pin(async move { bind_udp(new_udp_socket(upstream)?, mark, upstream) })
    }

    fn tcp(&self, upstream: SocketAddr) -> TcpConnect {
        let mark = self.mark;
        Box::pin(async move { connect_tcp(new_tcp_socket(upstream)?, mark, upstream).await })
    }
}

/// A non-blocking TCP socket of `upstream`'s address family, in the calling thread's network namespace.
pub fn new_tcp_socket(upstream: SocketAddr) -> io::Result<Socket> {
    Socket::new(
        Domain::for_address(upstream),
        Type::STREAM.nonblocking().cloexec(),
        Some(Protocol::TCP),
    )
}

/// Mark `s` (when `mark` is set) and connect it to `upstream` (inside a runtime). The socket may come from another
/// network namespace.
pub async fn connect_tcp(
    s: Socket,
    mark: Option<u32>,
    upstream: SocketAddr,
) -> io::Result<TcpStream> {
    if let Some(m) = mark {
        s.set_mark(m)?;
    }
    tokio::net::TcpSocket::from_std_stream(s.into())
        .connect(upstream)
        .await
}

/// A non-blocking UDP socket of `upstream`'s address family, in the calling thread's network namespace.
pub fn new_udp_socket(upstream: SocketAddr) -> io::Result<Socket> {
    Socket::new(
        Domain::for_address(upstream),
        Type::DGRAM.nonblocking().cloexec(),
        Some(Protocol::UDP),
    )
}

/// Mark `s` (when `mark` is set), bind it to an ephemeral port of the wildcard address of `upstream`'s family and
/// hand it to tokio (call inside a runtime). The socket may come from another network namespace.
pub fn bind_udp(s: Socket, mark: Option<u32>, upstream: SocketAddr) -> io::Result<UdpSocket> {
    if let Some(m) = mark {
        s.set_mark(m)?;
    }
    let any: SocketAddr = if upstream.is_ipv4() {
        (std::net::Ipv4Addr::UNSPECIFIED, 0).into()
    } else {
        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
    };
    s.bind(&any.into())?;
    UdpSocket::from_std(s.into())
}

/// How forwarding behaves.
#[derive(Debug, Clone)]
pub struct ForwarderConfig {
    /// Resolvers, tried in order.
    pub upstreams: Vec<SocketAddr>,
    /// Wait for one upstream's answer (resolv.conf `timeout`).
    pub timeout: Duration,
    /// Rounds over the upstream list (resolv.conf `attempts`).
    pub attempts: usize,
    /// Cached answers at most (0: no cache).
    pub cache_size: usize,
    /// An answer is cached at most this long, whatever its TTL.
    pub max_cache_ttl: Duration,
}

impl Default for ForwarderConfig {
    fn default() -> Self {
        Self {
            upstreams: Vec::new(),
            timeout: Duration::from_secs(5),
            attempts: 2,
            cache_size: 4096,
            max_cache_ttl: Duration::from_secs(86_400),
        }
    }
}

/// Why no upstream answered.
#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    /// No resolver is configured.
    #[error("no upstream resolver configured")]
    NoUpstream,
    /// Every attempt failed; the last reason.
    #[error("no upstream answered: {0}")]
    Failed(String),
}

/// The forwarder, shared by every client it serves.
#[derive(Debug)]
pub struct Forwarder {
    cfg: ForwarderConfig,
    sockets: Arc<dyn UpstreamSockets>,
    cache: Cache,
    metrics: Arc<DnsMetrics>,
}

impl Forwarder {
    /// A forwarder over `sockets`, caching by `clock`.
    pub fn new(
        cfg: ForwarderConfig,
        sockets: Arc<dyn UpstreamSockets>,
        clock: Arc<dyn Clock>,
        metrics: Arc<DnsMetrics>,
    ) -> Self {
        let max_ttl = u32::try_from(cfg.max_cache_ttl.as_secs()).unwrap_or(u32::MAX);
        Self {
            cache: Cache::new(clock, cfg.cache_size, max_ttl),
            cfg,
            sockets,
            metrics,
        }
    }

    /// The upstreams in use.
    pub fn upstreams(&self) -> &[SocketAddr] {
        &self.cfg.upstreams
    }

    /// Answers cached now.
    pub fn cached(&self) -> usize {
        self.cache.len()
    }

    /// The answer to `query`, from the cache or an upstream. Whether it came from the cache is returned too.
    pub async fn resolve(&self, query: &Query) -> Result<(Answer, bool), ForwardError> {
        let key = Key {
            name: query.name().to_lowercase().to_ascii(),
            rtype: query.query_type(),
            class: query.query_class(),
        };
        if let Some(a) = self.cache.get(&key) {
            self.metrics.cache_hits.inc();
            return Ok((a, true));
        }
        if self.cfg.upstreams.is_empty() {
            return Err(ForwardError::NoUpstream);
        }
        let mut last = String::new();
        let mut last_answer = None;
        for _ in 0..self.cfg.attempts.max(1) {
            for &up in &self.cfg.upstreams {
                self.metrics.upstream_requests.inc();
                match self.exchange(up, query).await {
                    Ok(answer) => match answer.code {
                        // The upstream could not answer: the next one may (as resolv.conf's stub does).
                        ResponseCode::ServFail
                        | ResponseCode::Refused
                        | ResponseCode::NotImp
                        | ResponseCode::FormErr => {
                            self.metrics.upstream_failures.inc();
                            last = format!("{up} answered {}", answer.code);
                            last_answer = Some(answer);
                        }
                        _ => {
                            self.cache.put(key, &answer);
                            return Ok((answer, false));
                        }
                    },
                    Err(e) => {
                        self.metrics.upstream_failures.inc();
                        tracing::debug!(upstream = %up, error = %e, "upstream resolver failed");
                        last = format!("{up}: {e}");
                    }
                }
            }
        }
        match last_answer {
            Some(a) => Ok((a, false)),
            None => Err(ForwardError::Failed(last)),
        }
    }

    async fn exchange(&self, up: SocketAddr, query: &Query) -> io::Result<Answer> {
        let id: u16 = rand::random();
        let mut m = Message::query();
        m.metadata.id = id;
        m.metadata.recursion_desired = true;
        m.add_query(query.clone());
        let mut edns = Edns::new();
        edns.set_max_payload(UPSTREAM_EDNS_PAYLOAD);
        m.set_edns(edns);
        let bytes = m.to_vec().map_err(io::Error::other)?;
        let reply = tokio::time::timeout(self.cfg.timeout, self.udp(up, &bytes, id, query))
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "no answer over UDP"))??;
        let reply = if reply.metadata.truncation {
            tokio::time::timeout(self.cfg.timeout, self.tcp(up, &bytes, id, query))
                .await
                .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "no answer over TCP"))??
        } else {
            reply
        };
        Ok(Answer {
            code: reply.metadata.response_code,
            answers: reply.answers,
            authorities: reply.authorities,
            additionals: reply.additionals,
        })
    }

    async fn udp(&self, up: SocketAddr, bytes: &[u8], id: u16, q: &Query) -> io::Result<Message> {
        let sock = self.sockets.udp(up).await?;
        // Connected: the kernel drops datagrams from anyone but the upstream.
        sock.connect(up).await?;
        sock.send(bytes).await?;
        let mut buf = vec![0u8; 65_535];
        loop {
            let n = sock.recv(&mut buf).await?;
            match Message::from_vec(&buf[..n]) {
                Ok(m) if answers(&m, id, q) => return Ok(m),
                // Not our answer (late, spoofed or garbage): keep waiting until the deadline.
                _ => tracing::debug!(upstream = %up, "ignored a datagram that is not the answer"),
            }
        }
    }

    async fn tcp(&self, up: SocketAddr, bytes: &[u8], id: u16, q: &Query) -> io::Result<Message> {
        let mut s = self.sockets.tcp(up).await?;
        let len = u16::try_from(bytes.len()).map_err(io::Error::other)?;
        let mut framed = Vec::with_capacity(bytes.len() + 2);
        framed.extend_from_slice(&len.to_be_bytes());
        framed.extend_from_slice(bytes);
        s.write_all(&framed).await?;
        let n = s.read_u16().await?;
        let mut buf = vec![0u8; usize::from(n)];
        s.read_exact(&mut buf).await?;
        match Message::from_vec(&buf) {
            Ok(m) if answers(&m, id, q) => Ok(m),
            Ok(_) => Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "TCP answer does not match the question",
            )),
            Err(e) => Err(io::Error::new(io::ErrorKind::InvalidData, e)),
        }
    }
}

/// Whether `m` is the answer to our query `id` for `q`.
fn answers(m: &Message, id: u16, q: &Query) -> bool {
    m.metadata.id == id
        && m.metadata.message_type == MessageType::Response
        && matches!(m.queries.as_slice(), [a] if a.query_type() == q.query_type()
            && a.query_class() == q.query_class()
            && a.name().eq_ignore_root(q.name()))
}
