//! HBONE server: accepts CONNECT streams on one HTTP/2 connection and hands each to a handler.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use h2::RecvStream;
use h2::server::SendResponse;
use http::{HeaderMap, Method, Response, StatusCode, Uri};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::config::H2Config;
use crate::counter::{StreamCounter, StreamDropGuard};
use crate::preface::PrefaceWatch;
use crate::stream::H2Stream;
use crate::{Error, keepalive};

/// Parses a CONNECT authority that must be a literal socket address: `ip:port`, IPv6 as
/// `[ip]:port`. Hostnames, a missing port and port 0 are [`Error::BadAuthority`].
pub fn parse_authority(authority: &str) -> Result<SocketAddr, Error> {
    match authority.parse::<SocketAddr>() {
        Ok(addr) if addr.port() != 0 => Ok(addr),
        _ => Err(Error::BadAuthority(authority.to_owned())),
    }
}

/// One inbound request on an HBONE connection, normally a CONNECT. The handler must answer it
/// with [`accept`](Self::accept) or [`reject`](Self::reject); dropping it unanswered resets the
/// stream.
pub struct InboundRequest {
    parts: http::request::Parts,
    recv: RecvStream,
    respond: SendResponse<Bytes>,
    guard: StreamDropGuard,
    chunk: usize,
}

impl std::fmt::Debug for InboundRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InboundRequest")
            .field("method", &self.parts.method)
            .field("authority", &self.authority())
            .field("headers", &self.parts.headers)
            .finish_non_exhaustive()
    }
}

impl InboundRequest {
    /// The request method (`CONNECT` for HBONE).
    pub fn method(&self) -> &Method {
        &self.parts.method
    }

    /// The raw `:authority`, or `""` if the request had none.
    pub fn authority(&self) -> &str {
        self.parts.uri.authority().map_or("", |a| a.as_str())
    }

    /// The `:authority` as a socket address; see [`parse_authority`].
    pub fn authority_addr(&self) -> Result<SocketAddr, Error> {
        parse_authority(self.authority())
    }

    /// The full request URI as h2 parsed it.
    pub fn uri(&self) -> &Uri {
        &self.parts.uri
    }

    /// The request headers (pseudo-headers excluded).
    pub fn headers(&self) -> &HeaderMap {
        &self.parts.headers
    }

    /// Validation helper for handlers: the CONNECT target, or the status to
    /// [`reject`](Self::reject) with (400 for a non-CONNECT method or an authority that is not
    /// `ip:port`). Policy (401) and upstream failures (503) are the handler's to decide.
    pub fn connect_target(&self) -> Result<SocketAddr, StatusCode> {
        if self.parts.method != Method::CONNECT {
            return Err(StatusCode::BAD_REQUEST);
        }
        self.authority_addr().map_err(|_| StatusCode::BAD_REQUEST)
    }

    /// Answers with `status` (400, 401, 503, ...) and ends the stream; no tunnel is opened.
    pub fn reject(self, status: StatusCode) -> Result<(), Error> {
        self.reject_with_headers(status, HeaderMap::new())
    }

    /// Like [`reject`](Self::reject), with response headers.
    pub fn reject_with_headers(
        mut self,
        status: StatusCode,
        headers: HeaderMap,
    ) -> Result<(), Error> {
        let mut resp = Response::builder().status(status).body(())?;
        *resp.headers_mut() = headers;
        self.respond.send_response(resp, true)?;
        tracing::debug!(authority = self.authority(), %status, "hbone request rejected");
        Ok(())
    }

    /// Answers 200 with `response_headers` and returns the tunnel.
    pub fn accept(mut self, response_headers: HeaderMap) -> Result<H2Stream, Error> {
        let mut resp = Response::builder().status(StatusCode::OK).body(())?;
        *resp.headers_mut() = response_headers;
        let send = self.respond.send_response(resp, false)?;
        Ok(H2Stream::new(send, self.recv, Some(self.guard), self.chunk))
    }
}

/// Serves one HBONE connection on `io` (already TLS-wrapped by the caller) until it closes.
///
/// Each inbound stream becomes an [`InboundRequest`] passed to `handler`, whose future runs on
/// its own spawned task. Method and authority checks are the handler's job (see
/// [`InboundRequest::connect_target`]).
///
/// When `shutdown` is cancelled the server sends GOAWAY (graceful shutdown): the peer stops
/// opening streams, streams it had already sent are still dispatched, and this keeps driving
/// the connection until every open stream has finished, then returns `Ok(())`. To bound the
/// drain, drop this future (for example with `tokio::time::timeout`): that aborts the remaining
/// streams. A `shutdown` cancelled before or during the handshake does not cut the connection:
/// the handshake completes (bounded as below), and a connection that has carried no stream yet
/// sends its GOAWAY once its first stream is dispatched (or at the handshake deadline), so a
/// peer whose connection was accepted just before a drain has the CONNECT it made the
/// connection for served, instead of seeing the connection closed or refused unanswered.
///
/// The peer must send the HTTP/2 client preface and, as its first frame, SETTINGS within
/// [`H2Config::handshake_timeout`]; otherwise the connection is dropped (closed) and this
/// returns [`Error::HandshakeTimeout`]. A first frame other than SETTINGS fails the connection.
///
/// Returns `Ok(())` when the connection closes cleanly and an error for a failed handshake, a
/// connection error (including the peer closing TCP abruptly) or a keepalive timeout.
pub async fn serve_connection<IO, H, Fut>(
    io: IO,
    cfg: &H2Config,
    shutdown: CancellationToken,
    handler: H,
) -> Result<(), Error>
where
    IO: AsyncRead + AsyncWrite + Unpin,
    H: Fn(InboundRequest) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let (io, settings_seen) = PrefaceWatch::new(io);
    let handshake_deadline = tokio::time::Instant::now() + cfg.handshake_timeout;
    let handshake_expired = || {
        tracing::debug!(timeout = ?cfg.handshake_timeout, "hbone peer sent no preface and SETTINGS in time, closing");
        Err(Error::HandshakeTimeout(cfg.handshake_timeout))
    };
    let mut conn = match tokio::time::timeout_at(
        handshake_deadline,
        cfg.server_builder().handshake::<_, Bytes>(io),
    )
    .await
    {
        Ok(res) => res?,
        Err(_elapsed) => return handshake_expired(),
    };
    // The preface is in; its SETTINGS frame is read while the connection is driven below.
    let settings_deadline = tokio::time::sleep_until(handshake_deadline);
    tokio::pin!(settings_deadline);
    let mut awaiting_settings = !settings_seen.load(Ordering::Acquire);
    let keepalive = keepalive::run(
        conn.ping_pong(),
        cfg.keepalive_interval,
        cfg.keepalive_timeout,
    );
    tokio::pin!(keepalive);
    let counter = Arc::new(StreamCounter::new());
    let chunk = cfg.write_chunk();
    // Shutdown is asked (`shutdown_seen`) and GOAWAY sent (`draining`) as two steps: a connection that has not
    // carried a stream yet gets until the handshake deadline to open its first one. A client sends its CONNECT
    // right after its preface, and an h2 client that has read a GOAWAY (even the first, "last stream = max" one)
    // refuses to open any stream: sending GOAWAY at once would fail the very request a client that connected just
    // before a drain made the connection for.
    let mut shutdown_seen = false;
    let mut draining = false;
    let mut dispatched = false;
    let first_stream_grace = tokio::time::sleep_until(handshake_deadline);
    tokio::pin!(first_stream_grace);
    let drain_now = |conn: &mut h2::server::Connection<_, Bytes>, draining: &mut bool| {
        tracing::debug!(
            open_streams = counter.active(),
            "hbone server draining connection"
        );
        conn.graceful_shutdown();
        *draining = true;
    };
    loop {
        tokio::select! {
            () = &mut settings_deadline, if awaiting_settings => {
                if !settings_seen.load(Ordering::Acquire) {
                    return handshake_expired();
                }
                awaiting_settings = false;
            }
            _ = shutdown.cancelled(), if !shutdown_seen => {
                shutdown_seen = true;
                if dispatched {
                    drain_now(&mut conn, &mut draining);
                }
            }
            () = &mut first_stream_grace, if shutdown_seen && !draining => {
                drain_now(&mut conn, &mut draining);
            }
            e = &mut keepalive => {
                tracing::debug!(error = %e, "hbone server keepalive failed, closing");
                conn.abrupt_shutdown(h2::Reason::NO_ERROR);
                return Err(e);
            }
            next = conn.accept() => match next {
                None => {
                    tracing::debug!("hbone server connection closed");
                    return Ok(());
                }
                Some(Err(e)) => return Err(e.into()),
                Some(Ok((request, respond))) => {
                    let (parts, recv) = request.into_parts();
                    let req = InboundRequest {
                        parts,
                        recv,
                        respond,
                        guard: counter.guard(),
                        chunk,
                    };
                    tracing::trace!(?req, "hbone inbound stream");
                    tokio::spawn(handler(req).in_current_span());
                    dispatched = true;
                    if shutdown_seen && !draining {
                        drain_now(&mut conn, &mut draining);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn authority_must_be_ip_and_port() {
        assert_eq!(
            parse_authority("10.0.0.1:8080").ok(),
            Some(SocketAddr::from(([10, 0, 0, 1], 8080)))
        );
        assert!(parse_authority("[fd00::1]:443").is_ok());
        for bad in [
            "example.com:80",
            "10.0.0.1",
            "fd00::1:443",
            "[fd00::1]",
            "10.0.0.1:0",
            "10.0.0.1:99999",
            "",
            "user@10.0.0.1:80",
        ] {
            assert!(
                matches!(parse_authority(bad), Err(Error::BadAuthority(_))),
                "{bad} accepted"
            );
        }
    }
}
