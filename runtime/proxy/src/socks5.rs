//! A minimal SOCKS5 front (RFC 1928, CONNECT only, no authentication) for apps that are not captured: the reply is
//! sent once the upstream (HBONE or TCP) is really established.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::Inner;
use crate::outbound::OutboundError;

const VER: u8 = 5;
const REP_OK: u8 = 0;
const REP_FAILURE: u8 = 1;
const REP_NOT_ALLOWED: u8 = 2;
const REP_HOST_UNREACHABLE: u8 = 4;
const REP_REFUSED: u8 = 5;
const REP_CMD_UNSUPPORTED: u8 = 7;
const REP_ATYP_UNSUPPORTED: u8 = 8;

async fn reply(s: &mut TcpStream, code: u8) -> std::io::Result<()> {
    s.write_all(&[VER, code, 0, 1, 0, 0, 0, 0, 0, 0]).await
}

/// Read the greeting and the request; returns the destination, or `None` after replying with an error.
async fn read_request(s: &mut TcpStream) -> std::io::Result<Option<SocketAddr>> {
    let mut head = [0u8; 2];
    s.read_exact(&mut head).await?;
    if head[0] != VER {
        return Ok(None);
    }
    let mut methods = vec![0u8; usize::from(head[1])];
    s.read_exact(&mut methods).await?;
    if !methods.contains(&0) {
        s.write_all(&[VER, 0xff]).await?;
        return Ok(None);
    }
    s.write_all(&[VER, 0]).await?;
    let mut req = [0u8; 4];
    s.read_exact(&mut req).await?;
    if req[0] != VER {
        return Ok(None);
    }
    let ip = match req[3] {
        1 => {
            let mut b = [0u8; 4];
            s.read_exact(&mut b).await?;
            IpAddr::V4(Ipv4Addr::from(b))
        }
        4 => {
            let mut b = [0u8; 16];
            s.read_exact(&mut b).await?;
            IpAddr::V6(Ipv6Addr::from(b))
        }
        3 => {
            // A hostname: weft routes by IP only (DNS is the DNS proxy's job); a literal IP as a name is fine.
            let mut len = [0u8; 1];
            s.read_exact(&mut len).await?;
            let mut name = vec![0u8; usize::from(len[0])];
            s.read_exact(&mut name).await?;
            match std::str::from_utf8(&name)
                .ok()
                .and_then(|n| n.parse::<IpAddr>().ok())
            {
                Some(ip) => ip,
                None => {
                    let mut port = [0u8; 2];
                    s.read_exact(&mut port).await?;
                    reply(s, REP_ATYP_UNSUPPORTED).await?;
                    return Ok(None);
                }
            }
        }
        _ => {
            reply(s, REP_ATYP_UNSUPPORTED).await?;
            return Ok(None);
        }
    };
    let mut port = [0u8; 2];
    s.read_exact(&mut port).await?;
    if req[1] != 1 {
        reply(s, REP_CMD_UNSUPPORTED).await?;
        return Ok(None);
    }
    Ok(Some(SocketAddr::new(ip, u16::from_be_bytes(port))))
}

impl Inner {
    /// Serve one SOCKS5 client.
    pub(crate) async fn handle_socks5(self: Arc<Self>, mut client: TcpStream, src: SocketAddr) {
        let dst =
            match tokio::time::timeout(self.cfg.connect_timeout, read_request(&mut client)).await {
                Ok(Ok(Some(d))) => d,
                Ok(Ok(None)) => {
                    self.metrics.fail("outbound", "socks5_request");
                    return;
                }
                Ok(Err(e)) => {
                    tracing::debug!(%src, error = %e, "SOCKS5 handshake failed");
                    self.metrics.fail("outbound", "socks5_request");
                    return;
                }
                Err(_) => {
                    self.metrics.fail("outbound", "socks5_request");
                    return;
                }
            };
        match self.establish_outbound(src, dst).await {
            Ok(est) => {
                if reply(&mut client, REP_OK).await.is_ok() {
                    self.run_outbound(client, est).await;
                }
            }
            Err(e) => {
                let code = match e {
                    OutboundError::Denied { .. } => REP_NOT_ALLOWED,
                    OutboundError::Unroutable(_) => REP_HOST_UNREACHABLE,
                    OutboundError::Connect(_) => REP_REFUSED,
                    OutboundError::Identity(_) => REP_FAILURE,
                };
                let _ = reply(&mut client, code).await;
            }
        }
    }
}
