//! Socket helpers: listeners, outgoing connections with `SO_MARK` and a chosen source IP, and the original
//! destination of a REDIRECTed connection.

use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;

use socket2::{Domain, Protocol, SockRef, Socket, Type};
use tokio::net::{TcpListener, TcpSocket, TcpStream};

/// A new non-blocking TCP socket of `addr`'s family in weft's own namespace.
pub fn new_tcp(addr: SocketAddr) -> io::Result<Socket> {
    Socket::new(
        Domain::for_address(addr),
        Type::STREAM.nonblocking(),
        Some(Protocol::TCP),
    )
}

/// Bind a listener with `SO_REUSEADDR` (and `IP_FREEBIND`-free semantics: the address must exist). It has
/// `TCP_NODELAY` set, which Linux copies to every accepted socket (no `setsockopt` per connection).
pub fn listen(addr: SocketAddr) -> io::Result<TcpListener> {
    listen_on(new_tcp(addr)?, addr)
}

/// [`listen`] on a socket made already (e.g. transparent).
pub fn listen_on(sock: Socket, addr: SocketAddr) -> io::Result<TcpListener> {
    sock.set_reuse_address(true)?;
    sock.set_tcp_nodelay(true)?;
    sock.bind(&addr.into())?;
    sock.listen(1024)?;
    TcpListener::from_std(std::net::TcpListener::from(sock))
}

/// Where a data path's sockets are created. A socket belongs to the network namespace it was created in, so a
/// per-pod data path (in-pod mode) gets a factory that creates them inside the pod's namespace; binding, listening
/// and connecting then happen on the data-path runtime as usual. Shared-node mode has no factory (sockets are
/// created in weft's own namespace).
pub trait SocketFactory: Send + Sync + 'static {
    /// A new non-blocking, close-on-exec TCP socket of `domain`.
    fn tcp_socket(
        &self,
        domain: Domain,
    ) -> Pin<Box<dyn Future<Output = io::Result<Socket>> + Send + '_>>;
}

/// Bind and listen on a socket from a [`SocketFactory`]: `SO_REUSEADDR`, `TCP_NODELAY` (inherited by accepted
/// sockets), `SO_REUSEPORT` when asked, `SO_MARK` when given (accepted sockets inherit it too). A listener on
/// `[::]` accepts IPv4 as well. A listener that must take TPROXY'd connections is made so with
/// [`set_transparent`] before this.
pub fn listen_socket(
    sock: Socket,
    addr: SocketAddr,
    reuse_port: bool,
    mark: Option<u32>,
) -> io::Result<TcpListener> {
    sock.set_reuse_address(true)?;
    if reuse_port {
        sock.set_reuse_port(true)?;
    }
    if let Some(m) = mark {
        sock.set_mark(m)?;
    }
    if addr.is_ipv6() {
        sock.set_only_v6(false)?;
    }
    sock.set_tcp_nodelay(true)?;
    sock.bind(&addr.into())?;
    sock.listen(1024)?;
    TcpListener::from_std(std::net::TcpListener::from(sock))
}

/// The source address of an outgoing connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// Whatever the kernel picks.
    Any,
    /// Bind this address, which is local (`--bind-source-ip`, a loopback application tunnel).
    Local(IpAddr),
    /// Bind this address although it is not local (the original client's address, so the application sees it as
    /// the peer): `IP_TRANSPARENT` and `IP_FREEBIND` first, which need `CAP_NET_ADMIN`; the replies reach weft only
    /// where the routing sends them back (istio-cni's in-pod rules do: connmark 0x111, table 100).
    Transparent(IpAddr),
}

/// Mark `sock` `IP_TRANSPARENT` (`IPV6_TRANSPARENT` for an IPv6 socket): a listener then takes connections the
/// TPROXY target hands it, and an outgoing socket may bind an address that is not local. Needs `CAP_NET_ADMIN`.
pub fn set_transparent(sock: &Socket) -> io::Result<()> {
    if sock.domain()? == Domain::IPV6 {
        sock.set_ip_transparent_v6(true)
    } else {
        sock.set_ip_transparent_v4(true)
    }
}

/// Bind `sock` for a connection to `dst` from `src` (nothing when the families differ: the kernel picks).
fn bind_source(sock: &Socket, dst: SocketAddr, src: Source) -> io::Result<()> {
    let (ip, transparent) = match src {
        Source::Any => return Ok(()),
        Source::Local(ip) => (ip, false),
        Source::Transparent(ip) => (ip, true),
    };
    if ip.is_ipv4() != dst.is_ipv4() {
        return Ok(());
    }
    if transparent {
        set_transparent(sock)?;
        if dst.is_ipv4() {
            sock.set_freebind_v4(true)?;
        } else {
            sock.set_freebind_v6(true)?;
        }
    }
    sock.bind(&SocketAddr::new(ip, 0).into())
}

/// Connect a socket from a [`SocketFactory`] to `dst`, as [`connect`] does.
pub async fn connect_socket(
    sock: Socket,
    dst: SocketAddr,
    mark: Option<u32>,
    src: Source,
) -> io::Result<TcpStream> {
    sock.set_tcp_nodelay(true)?;
    if let Some(m) = mark {
        sock.set_mark(m)?;
    }
    bind_source(&sock, dst, src)?;
    let tcp = TcpSocket::from_std_stream(std::net::TcpStream::from(sock));
    tcp.connect(dst).await
}

/// Connect to `dst` with a socket from `factory` (or weft's own namespace when there is none).
pub async fn connect_via(
    factory: Option<&dyn SocketFactory>,
    dst: SocketAddr,
    mark: Option<u32>,
    src: Source,
) -> io::Result<TcpStream> {
    match factory {
        None => connect(dst, mark, src).await,
        Some(f) => {
            let sock = f.tcp_socket(Domain::for_address(dst)).await?;
            connect_socket(sock, dst, mark, src).await
        }
    }
}

/// Connect to `dst`, marking the socket (so capture rules skip it) and binding the source as asked. The socket is
/// created non-blocking and gets `TCP_NODELAY` before connecting (no extra syscalls per connection).
pub async fn connect(dst: SocketAddr, mark: Option<u32>, src: Source) -> io::Result<TcpStream> {
    connect_socket(new_tcp(dst)?, dst, mark, src).await
}

/// The destination a connection had before an iptables REDIRECT sent it to us (`SO_ORIGINAL_DST`); `local` is
/// the connection's local address, which picks the IPv4 or IPv6 lookup (see [`captured_destination`]).
fn original_dst(stream: &TcpStream, local: SocketAddr) -> io::Result<SocketAddr> {
    let sock = SockRef::from(stream);
    // A dual-stack listener sees IPv4 clients as IPv4-mapped IPv6: their NAT entry is an IPv4 one.
    let orig = if local.ip().to_canonical().is_ipv4() {
        sock.original_dst_v4()?
    } else {
        sock.original_dst_v6()?
    };
    orig.as_socket().map(canonical).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            "original destination is not an IP address",
        )
    })
}

/// Where a captured connection was going, or `None` when it was addressed to the capture listener itself. An
/// iptables REDIRECT (istio-cni's rules today) leaves the original destination in the NAT entry (`SO_ORIGINAL_DST`)
/// and makes the local address the listener's. The TPROXY target (earlier in-pod rules) changes no address: on a
/// transparent listener (`tproxy_port`: its port) the local address is the original destination, on a port that is
/// not the listener's. So the answer is the same under both rule sets.
pub fn captured_destination(
    stream: &TcpStream,
    tproxy_port: Option<u16>,
) -> io::Result<Option<SocketAddr>> {
    let local = canonical(stream.local_addr()?);
    let tproxied = tproxy_port.is_some_and(|p| p != local.port());
    match original_dst(stream, local) {
        Ok(orig) if orig != local => Ok(Some(orig)),
        Ok(_) | Err(_) if tproxied => Ok(Some(local)),
        Ok(_) => Ok(None),
        Err(e) => Err(e),
    }
}

/// The address with an IPv4-mapped IPv6 address (`::ffff:a.b.c.d`, as a dual-stack socket reports IPv4 peers)
/// turned back into plain IPv4, so it matches the workload addresses in the state.
pub fn canonical(addr: SocketAddr) -> SocketAddr {
    SocketAddr::new(addr.ip().to_canonical(), addr.port())
}
