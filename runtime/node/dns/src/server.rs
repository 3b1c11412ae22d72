//! The listeners: one UDP socket and one TCP listener per address, each served until stopped. UDP requests are
//! handled concurrently up to a cap (more are dropped and counted); TCP connections are capped, carry
//! length-prefixed messages one after another, and are closed when idle.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::handler::{Clients, Handler, Transport};

/// Pause after a failed receive or accept, so a persistent error does not spin a core.
const ERROR_PAUSE: Duration = Duration::from_millis(10);

/// A bound UDP socket and TCP listener pair (normally on the same address).
#[derive(Debug)]
pub struct DnsSockets {
    /// UDP.
    pub udp: UdpSocket,
    /// TCP.
    pub tcp: TcpListener,
}

impl DnsSockets {
    /// Bind UDP and TCP on `addr` (port 0: TCP picks a port, UDP takes the same one).
    pub async fn bind(addr: SocketAddr) -> io::Result<Self> {
        let tcp = TcpListener::bind(addr).await?;
        let udp = UdpSocket::bind(SocketAddr::new(addr.ip(), tcp.local_addr()?.port())).await?;
        Ok(Self { udp, tcp })
    }

    /// Take sockets that were bound elsewhere (e.g. inside a pod's network namespace). Must be called inside a
    /// tokio runtime; the sockets are switched to non-blocking mode.
    pub fn from_std(udp: std::net::UdpSocket, tcp: std::net::TcpListener) -> io::Result<Self> {
        udp.set_nonblocking(true)?;
        tcp.set_nonblocking(true)?;
        Ok(Self {
            udp: UdpSocket::from_std(udp)?,
            tcp: TcpListener::from_std(tcp)?,
        })
    }
}

/// Listener limits.
#[derive(Debug, Clone)]
pub struct ServerLimits {
    /// UDP requests in progress at once per socket (a forwarded one waits for its upstream); more are dropped.
    pub max_udp_in_flight: usize,
    /// Open TCP connections per listener; more are closed at once.
    pub max_tcp_connections: usize,
    /// A TCP connection that sends no complete request for this long is closed (ztunnel: 5 s).
    pub tcp_idle_timeout: Duration,
}

impl Default for ServerLimits {
    fn default() -> Self {
        Self {
            max_udp_in_flight: 1024,
            max_tcp_connections: 512,
            tcp_idle_timeout: Duration::from_secs(5),
        }
    }
}

/// A served listener pair.
#[derive(Debug)]
pub struct Serving {
    /// The UDP address.
    pub udp_addr: SocketAddr,
    /// The TCP address.
    pub tcp_addr: SocketAddr,
    udp: JoinHandle<()>,
    tcp: JoinHandle<()>,
    stop: CancellationToken,
}

impl Serving {
    /// Stop serving and wait until both listeners are closed (TCP connections in progress end too).
    pub async fn stop(self) {
        self.stop.cancel();
        let _ = self.udp.await;
        let _ = self.tcp.await;
    }

    /// Stop without waiting.
    pub fn abort(&self) {
        self.stop.cancel();
    }
}

pub(crate) fn serve(
    handler: Arc<Handler>,
    limits: ServerLimits,
    sockets: DnsSockets,
    clients: Clients,
    stop: CancellationToken,
) -> io::Result<Serving> {
    let udp_addr = sockets.udp.local_addr()?;
    let tcp_addr = sockets.tcp.local_addr()?;
    let clients = Arc::new(clients);
    tracing::info!(udp = %udp_addr, tcp = %tcp_addr, clients = ?clients, "DNS proxy listening");
    let udp = tokio::spawn(
        serve_udp(
            handler.clone(),
            Arc::new(sockets.udp),
            clients.clone(),
            limits.max_udp_in_flight,
            stop.clone(),
        )
        .instrument(tracing::info_span!("dns_udp", addr = %udp_addr)),
    );
    let tcp = tokio::spawn(
        serve_tcp(handler, sockets.tcp, clients, limits, stop.clone())
            .instrument(tracing::info_span!("dns_tcp", addr = %tcp_addr)),
    );
    Ok(Serving {
        udp_addr,
        tcp_addr,
        udp,
        tcp,
        stop,
    })
}

async fn serve_udp(
    handler: Arc<Handler>,
    sock: Arc<UdpSocket>,
    clients: Arc<Clients>,
    max_in_flight: usize,
    stop: CancellationToken,
) {
    let in_flight = Arc::new(Semaphore::new(max_in_flight.max(1)));
    let mut buf = vec![0u8; 65_535];
    loop {
        let (n, src) = tokio::select! {
            () = stop.cancelled() => break,
            r = sock.recv_from(&mut buf) => match r {
                Ok(x) => x,
                Err(e) => {
                    tracing::debug!(error = %e, "DNS UDP receive failed");
                    tokio::time::sleep(ERROR_PAUSE).await;
                    continue;
                }
            },
        };
        let Ok(permit) = in_flight.clone().try_acquire_owned() else {
            handler.metrics.count("udp", "dropped");
            tracing::debug!(%src, "DNS UDP request dropped: too many in flight");
            continue;
        };
        let bytes = buf[..n].to_vec();
        let (handler, sock, clients, stop) =
            (handler.clone(), sock.clone(), clients.clone(), stop.clone());
        tokio::spawn(
            async move {
                let _permit = permit;
                let reply = tokio::select! {
                    () = stop.cancelled() => None,
                    r = handler.handle(&bytes, src, &clients, Transport::Udp) => r,
                };
                if let Some(reply) = reply
                    && let Err(e) = sock.send_to(&reply, src).await
                {
                    tracing::debug!(%src, error = %e, "DNS UDP reply not sent");
                }
            }
            .instrument(tracing::debug_span!("dns_request", %src)),
        );
    }
}

async fn serve_tcp(
    handler: Arc<Handler>,
    listener: TcpListener,
    clients: Arc<Clients>,
    limits: ServerLimits,
    stop: CancellationToken,
) {
    let open = Arc::new(Semaphore::new(limits.max_tcp_connections.max(1)));
    let mut conns = tokio::task::JoinSet::new();
    loop {
        let (stream, src) = tokio::select! {
            () = stop.cancelled() => break,
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    // E.g. out of file descriptors: pause instead of spinning.
                    tracing::debug!(error = %e, "DNS TCP accept failed");
                    tokio::time::sleep(ERROR_PAUSE).await;
                    continue;
                }
            },
        };
        // Reap finished connections so the set does not grow.
        while conns.try_join_next().is_some() {}
        let Ok(permit) = open.clone().try_acquire_owned() else {
            handler.metrics.count("tcp", "dropped");
            tracing::debug!(%src, "DNS TCP connection closed: too many open");
            continue;
        };
        let (handler, clients, stop) = (handler.clone(), clients.clone(), stop.clone());
        let idle = limits.tcp_idle_timeout;
        conns.spawn(
            async move {
                let _permit = permit;
                tokio::select! {
                    () = stop.cancelled() => {}
                    r = tcp_conn(&handler, stream, src, &clients, idle) => {
                        if let Err(e) = r {
                            tracing::debug!(error = %e, "DNS TCP connection ended");
                        }
                    }
                }
            }
            .instrument(tracing::debug_span!("dns_tcp_conn", %src)),
        );
    }
    conns.shutdown().await;
}

async fn tcp_conn(
    handler: &Handler,
    mut stream: TcpStream,
    src: SocketAddr,
    clients: &Clients,
    idle: Duration,
) -> io::Result<()> {
    let timed_out = || io::Error::new(io::ErrorKind::TimedOut, "idle");
    loop {
        let len = match tokio::time::timeout(idle, stream.read_u16()).await {
            Err(_) => return Err(timed_out()),
            Ok(Err(e)) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            Ok(r) => r?,
        };
        let mut buf = vec![0u8; usize::from(len)];
        tokio::time::timeout(idle, stream.read_exact(&mut buf))
            .await
            .map_err(|_| timed_out())??;
        let Some(reply) = handler.handle(&buf, src, clients, Transport::Tcp).await else {
            // Nothing sensible to say (not a query): the stream is not worth keeping.
            return Ok(());
        };
        let n = u16::try_from(reply.len()).map_err(io::Error::other)?;
        let mut framed = Vec::with_capacity(reply.len() + 2);
        framed.extend_from_slice(&n.to_be_bytes());
        framed.extend_from_slice(&reply);
        tokio::time::timeout(idle, stream.write_all(&framed))
            .await
            .map_err(|_| timed_out())??;
    }
}
