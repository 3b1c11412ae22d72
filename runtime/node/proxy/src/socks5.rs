//! A minimal SOCKS5 front (RFC 1928, CONNECT only, no authentication) for apps that are not captured: the reply is
//! sent once the upstream (HBONE or TCP) is really established.

use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
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

async fn reply<S: AsyncWrite + Unpin>(s: &mut S, code: u8) -> std::io::Result<()> {
    s.write_all(&[VER, code, 0, 1, 0, 0, 0, 0, 0, 0]).await
}

/// Read the greeting and the request; returns the destination, or `None` after replying with an error.
pub(crate) async fn read_request<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
) -> std::io::Result<Option<SocketAddr>> {
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
    #[allow(clippy::manual_async_fn)] // an `async fn` would hold its arguments twice, for the connection's life
    pub(crate) fn handle_socks5(
        self: Arc<Self>,
        mut client: TcpStream,
        src: SocketAddr,
    ) -> impl Future<Output = ()> + Send {
        async move {
            let dst =
                match tokio::time::timeout(self.cfg.connect_timeout, read_request(&mut client))
                    .await
                {
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
            // Boxed, as for a captured connection: the relay's task keeps nothing of the setup.
            match Box::pin(self.establish_outbound(src, dst, None)).await {
                Ok(est) => {
                    if reply(&mut client, REP_OK).await.is_ok() {
                        self.run_outbound(client, est).await;
                    }
                }
                Err(e) => {
                    let code = match e {
                        OutboundError::Denied { .. } => REP_NOT_ALLOWED,
                        OutboundError::Unroutable(_) => REP_HOST_UNREACHABLE,
                        OutboundError::Connect { .. } => REP_REFUSED,
                        OutboundError::Identity(_) | OutboundError::Client(_) => REP_FAILURE,
                    };
                    let _ = reply(&mut client, code).await;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test code: a panic fails the test

    use super::*;

    /// Feed `input` to the parser as a client would, and return what it decided and everything it wrote back.
    async fn parse(input: &[u8]) -> (std::io::Result<Option<SocketAddr>>, Vec<u8>) {
        let (mut client, mut server) = tokio::io::duplex(1024);
        client.write_all(input).await.unwrap();
        // The client is done sending: a parser that wants more bytes sees EOF.
        client.shutdown().await.unwrap();
        let r = read_request(&mut server).await;
        drop(server);
        let mut out = Vec::new();
        client.read_to_end(&mut out).await.unwrap();
        (r, out)
    }

    const HELLO: [u8; 3] = [5, 1, 0];

    fn request(atyp_and_addr: &[u8], port: u16, cmd: u8) -> Vec<u8> {
        let mut v = HELLO.to_vec();
        v.extend([5, cmd, 0]);
        v.extend(atyp_and_addr);
        v.extend(port.to_be_bytes());
        v
    }

    #[tokio::test]
    async fn ipv4_connect() {
        let (r, out) = parse(&request(&[1, 10, 0, 0, 7], 8080, 1)).await;
        assert_eq!(r.unwrap(), Some("10.0.0.7:8080".parse().unwrap()));
        assert_eq!(
            out,
            [5, 0],
            "method selection only: the reply waits for the upstream"
        );
    }

    #[tokio::test]
    async fn ipv6_connect() {
        let mut addr = vec![4];
        addr.extend("fd00::2".parse::<Ipv6Addr>().unwrap().octets());
        let (r, _) = parse(&request(&addr, 443, 1)).await;
        assert_eq!(r.unwrap(), Some("[fd00::2]:443".parse().unwrap()));
    }

    #[tokio::test]
    async fn a_literal_ip_as_a_domain_name_is_accepted() {
        let name = b"10.1.2.3";
        let mut addr = vec![3, u8::try_from(name.len()).unwrap()];
        addr.extend(name);
        let (r, _) = parse(&request(&addr, 80, 1)).await;
        assert_eq!(r.unwrap(), Some("10.1.2.3:80".parse().unwrap()));
    }

    #[tokio::test]
    async fn a_hostname_is_refused_with_atyp_unsupported() {
        let name = b"echo.default.svc";
        let mut addr = vec![3, u8::try_from(name.len()).unwrap()];
        addr.extend(name);
        let (r, out) = parse(&request(&addr, 80, 1)).await;
        assert_eq!(r.unwrap(), None);
        assert_eq!(out[..2], [5, 0]);
        assert_eq!(out[2..4], [VER, REP_ATYP_UNSUPPORTED]);
    }

    #[tokio::test]
    async fn an_unknown_address_type_is_refused() {
        let (r, out) = parse(&request(&[9, 1, 2, 3, 4], 80, 1)).await;
        assert_eq!(r.unwrap(), None);
        assert_eq!(out[2..4], [VER, REP_ATYP_UNSUPPORTED]);
    }

    #[tokio::test]
    async fn bind_and_udp_are_refused_with_command_unsupported() {
        for cmd in [2, 3] {
            let (r, out) = parse(&request(&[1, 10, 0, 0, 7], 80, cmd)).await;
            assert_eq!(r.unwrap(), None);
            assert_eq!(out[2..4], [VER, REP_CMD_UNSUPPORTED], "command {cmd}");
        }
    }

    #[tokio::test]
    async fn a_client_without_the_no_auth_method_is_refused() {
        let (r, out) = parse(&[5, 1, 2]).await;
        assert_eq!(r.unwrap(), None);
        assert_eq!(out, [5, 0xff]);
    }

    #[tokio::test]
    async fn other_protocol_versions_are_dropped_without_reply() {
        let (r, out) = parse(&[4, 1, 0, 80, 10, 0, 0, 7, 0]).await;
        assert_eq!(r.unwrap(), None);
        assert!(out.is_empty());
        // SOCKS5 greeting, then a request with another version.
        let (r, out) = parse(&[5, 1, 0, 4, 1, 0, 1, 10, 0, 0, 7, 0, 80]).await;
        assert_eq!(r.unwrap(), None);
        assert_eq!(out, [5, 0]);
    }

    #[tokio::test]
    async fn truncated_requests_are_errors() {
        let full = request(&[1, 10, 0, 0, 7], 8080, 1);
        for cut in 1..full.len() {
            let (r, _) = parse(&full[..cut]).await;
            assert_eq!(
                r.unwrap_err().kind(),
                std::io::ErrorKind::UnexpectedEof,
                "cut at {cut}"
            );
        }
    }
}
