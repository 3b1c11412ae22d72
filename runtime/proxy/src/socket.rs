//! Socket helpers: listeners, outgoing connections with `SO_MARK` and a chosen source IP, and the original
//! destination of a REDIRECTed connection.

use std::io;
use std::net::{IpAddr, SocketAddr};

use socket2::{Domain, Protocol, SockRef, Socket, Type};
use tokio::net::{TcpListener, TcpSocket, TcpStream};

/// Bind a listener with `SO_REUSEADDR` (and `IP_FREEBIND`-free semantics: the address must exist).
pub fn listen(addr: SocketAddr) -> io::Result<TcpListener> {
    let sock = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    sock.set_reuse_address(true)?;
    sock.set_nonblocking(true)?;
    sock.bind(&addr.into())?;
    sock.listen(1024)?;
    TcpListener::from_std(std::net::TcpListener::from(sock))
}

/// Connect to `dst`, marking the socket (so capture rules skip it) and binding the source IP when asked.
pub async fn connect(
    dst: SocketAddr,
    mark: Option<u32>,
    src_ip: Option<IpAddr>,
) -> io::Result<TcpStream> {
    let sock = Socket::new(Domain::for_address(dst), Type::STREAM, Some(Protocol::TCP))?;
    sock.set_nonblocking(true)?;
    if let Some(m) = mark {
        sock.set_mark(m)?;
    }
    if let Some(ip) = src_ip
        && ip.is_ipv4() == dst.is_ipv4()
    {
        sock.bind(&SocketAddr::new(ip, 0).into())?;
    }
    let tcp = TcpSocket::from_std_stream(std::net::TcpStream::from(sock));
    let stream = tcp.connect(dst).await?;
    stream.set_nodelay(true)?;
    Ok(stream)
}

/// The destination a connection had before an iptables REDIRECT sent it to us (`SO_ORIGINAL_DST`).
pub fn original_dst(stream: &TcpStream) -> io::Result<SocketAddr> {
    let sock = SockRef::from(stream);
    let local = stream.local_addr()?;
    let orig = if local.is_ipv4() {
        sock.original_dst_v4()?
    } else {
        sock.original_dst_v6()?
    };
    orig.as_socket().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            "original destination is not an IP address",
        )
    })
}
