//! A SOCKS5 client (CONNECT to an IP literal, no authentication), optionally bound to a source IP so that a
//! 127.0.0.x address stands for a workload.

use std::net::{IpAddr, SocketAddr};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

/// Why a SOCKS5 CONNECT failed.
#[derive(Debug, thiserror::Error)]
pub enum Socks5Error {
    /// Transport error.
    #[error("socks5 i/o: {0}")]
    Io(#[from] std::io::Error),
    /// The proxy answered with a failure code (2 = not allowed, 4 = unreachable, 5 = refused, ...).
    #[error("socks5 reply code {0}")]
    Reply(u8),
    /// Not a SOCKS5 answer.
    #[error("socks5 protocol error")]
    Protocol,
}

/// Connect to `dst` through the SOCKS5 proxy at `proxy`, from `src_ip` when given.
pub async fn connect(
    proxy: SocketAddr,
    src_ip: Option<IpAddr>,
    dst: SocketAddr,
) -> Result<TcpStream, Socks5Error> {
    let sock = if proxy.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    if let Some(ip) = src_ip {
        sock.bind(SocketAddr::new(ip, 0))?;
    }
    let mut s = sock.connect(proxy).await?;
    s.set_nodelay(true)?;
    s.write_all(&[5, 1, 0]).await?;
    let mut m = [0u8; 2];
    s.read_exact(&mut m).await?;
    if m != [5, 0] {
        return Err(Socks5Error::Protocol);
    }
    let mut req = vec![5, 1, 0];
    match dst.ip() {
        IpAddr::V4(v4) => {
            req.push(1);
            req.extend_from_slice(&v4.octets());
        }
        IpAddr::V6(v6) => {
            req.push(4);
            req.extend_from_slice(&v6.octets());
        }
    }
    req.extend_from_slice(&dst.port().to_be_bytes());
    s.write_all(&req).await?;
    let mut rep = [0u8; 10];
    s.read_exact(&mut rep[..4]).await?;
    if rep[0] != 5 {
        return Err(Socks5Error::Protocol);
    }
    let rest = match rep[3] {
        1 => 6,
        4 => 18,
        _ => return Err(Socks5Error::Protocol),
    };
    let mut tail = vec![0u8; rest];
    s.read_exact(&mut tail).await?;
    if rep[1] != 0 {
        return Err(Socks5Error::Reply(rep[1]));
    }
    Ok(s)
}
