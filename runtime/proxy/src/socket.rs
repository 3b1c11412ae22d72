//! Socket helpers: listeners, outgoing connections with `SO_MARK` and a chosen source IP, and the original
//! destination of a REDIRECTed connection.

use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;

use socket2::{Domain, Protocol, SockRef, Socket, Type};
use tokio::net::{TcpListener, TcpSocket, TcpStream};

/// Bind a listener with `SO_REUSEADDR` (and `IP_FREEBIND`-free semantics: the address must exist). It has
/// `TCP_NODELAY` set, which Linux copies to every accepted socket (no `setsockopt` per connection).
pub fn listen(addr: SocketAddr) -> io::Result<TcpListener> {
    let sock = Socket::new(
        Domain::for_address(addr),
        Type::STREAM.nonblocking(),
        Some(Protocol::TCP),
    )?;
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
/// `[::]` accepts IPv4 as well.
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

/// Connect a socket from a [`SocketFactory`] to `dst`, as [`connect`] does.
pub async fn connect_socket(
    sock: Socket,
    dst: SocketAddr,
    mark: Option<u32>,
    src_ip: Option<IpAddr>,
) -> io::Result<TcpStream> {
    sock.set_tcp_nodelay(true)?;
    if let Some(m) = mark {
        sock.set_mark(m)?;
    }
    if let Some(ip) = src_ip
        && ip.is_ipv4() == dst.is_ipv4()
    {
        sock.bind(&SocketAddr::new(ip, 0).into())?;
    }
    let tcp = TcpSocket::from_std_stream(std::net::TcpStream::from(sock));
    tcp.connect(dst).await
}

/// Connect to `dst` with a socket from `factory` (or weft's own namespace when there is none).
pub async fn connect_via(
    factory: Option<&dyn SocketFactory>,
    dst: SocketAddr,
    mark: Option<u32>,
    src_ip: Option<IpAddr>,
) -> io::Result<TcpStream> {
    match factory {
        None => connect(dst, mark, src_ip).await,
        Some(f) => {
            let sock = f.tcp_socket(Domain::for_address(dst)).await?;
            connect_socket(sock, dst, mark, src_ip).await
        }
    }
}

/// Connect to `dst`, marking the socket (so capture rules skip it) and binding the source IP when asked. The
/// socket is created non-blocking and gets `TCP_NODELAY` before connecting (no extra syscalls per connection).
pub async fn connect(
    dst: SocketAddr,
    mark: Option<u32>,
    src_ip: Option<IpAddr>,
) -> io::Result<TcpStream> {
    let sock = Socket::new(
        Domain::for_address(dst),
        Type::STREAM.nonblocking(),
        Some(Protocol::TCP),
    )?;
    sock.set_tcp_nodelay(true)?;
    if let Some(m) = mark {
        sock.set_mark(m)?;
    }
    if let Some(ip) = src_ip
        && ip.is_ipv4() == dst.is_ipv4()
    {
        sock.bind(&SocketAddr::new(ip, 0).into())?;
    }
    let tcp = TcpSocket::from_std_stream(std::net::TcpStream::from(sock));
    tcp.connect(dst).await
}

/// The destination a connection had before an iptables REDIRECT sent it to us (`SO_ORIGINAL_DST`); `local` is
/// the connection's local address, which picks the IPv4 or IPv6 lookup (see [`original_and_local`]).
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

/// A captured connection's original destination and its (canonical) local address, in that order: the two a
/// capture listener compares to tell a redirected connection from one addressed to the listener itself. One
/// `getsockname` and one `SO_ORIGINAL_DST` lookup per connection.
pub fn original_and_local(stream: &TcpStream) -> io::Result<(SocketAddr, SocketAddr)> {
    let local = canonical(stream.local_addr()?);
    Ok((original_dst(stream, local)?, local))
}

/// The address with an IPv4-mapped IPv6 address (`::ffff:a.b.c.d`, as a dual-stack socket reports IPv4 peers)
/// turned back into plain IPv4, so it matches the workload addresses in the state.
pub fn canonical(addr: SocketAddr) -> SocketAddr {
    SocketAddr::new(addr.ip().to_canonical(), addr.port())
}
