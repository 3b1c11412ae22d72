//! HBONE client: one HTTP/2 connection on which CONNECT tunnels are opened.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use h2::client::{Connection, SendRequest};
use http::header::{HeaderName, HeaderValue};
use http::{HeaderMap, Method, Request, StatusCode, Uri, Version};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::config::H2Config;
use crate::counter::{StreamCounter, StreamDropGuard};
use crate::stream::H2Stream;
use crate::{Error, keepalive};

static NEXT_CONN_ID: AtomicU64 = AtomicU64::new(1);

/// What to ask the HBONE server for: a tunnel to `authority`, with extra request headers.
#[derive(Debug, Clone, Default)]
pub struct ConnectRequest {
    /// The CONNECT target, `ip:port` (IPv6 as `[ip]:port`); sent as `:authority`.
    pub authority: String,
    /// Extra request headers (for example `baggage` or `traceparent`).
    pub headers: HeaderMap,
    /// Bytes of the tunnelled connection to send right behind the `CONNECT`, before its response
    /// (empty: none). They save the client a round trip; if the `CONNECT` is refused they are
    /// dropped with the stream. A request that carries them is retried on another connection only
    /// when the peer cannot have seen them (see [`Error::is_retryable_on_new_connection`]).
    pub early_data: Bytes,
}

impl ConnectRequest {
    /// A request for `authority` with no extra headers.
    pub fn new(authority: impl Into<String>) -> Self {
        Self {
            authority: authority.into(),
            headers: HeaderMap::new(),
            early_data: Bytes::new(),
        }
    }

    /// A request for the socket address `addr`, formatted `ip:port` / `[ipv6]:port`.
    pub fn to_addr(addr: SocketAddr) -> Self {
        Self::new(addr.to_string())
    }

    /// Adds a request header (builder style).
    pub fn with_header(mut self, name: HeaderName, value: HeaderValue) -> Self {
        self.headers.append(name, value);
        self
    }

    /// Sets the bytes sent behind the `CONNECT` (builder style; see [`ConnectRequest::early_data`]).
    pub fn with_early_data(mut self, data: Bytes) -> Self {
        self.early_data = data;
        self
    }

    fn into_request(self) -> Result<Request<()>, Error> {
        let authority = http::uri::Authority::try_from(self.authority.as_str())
            .map_err(|_| Error::BadAuthority(self.authority.clone()))?;
        let mut parts = http::uri::Parts::default();
        parts.authority = Some(authority);
        let uri = Uri::from_parts(parts).map_err(|_| Error::BadAuthority(self.authority))?;
        let mut req = Request::builder()
            .method(Method::CONNECT)
            .uri(uri)
            .version(Version::HTTP_2)
            .body(())?;
        *req.headers_mut() = self.headers;
        Ok(req)
    }
}

/// A client HTTP/2 connection to an HBONE server. Cheap to clone: clones share the connection.
///
/// The connection is driven (and kept alive with PINGs) by a task spawned in [`handshake`]. It
/// closes once every clone and every stream opened on it are dropped, when the peer closes it,
/// or when keepalive fails.
#[derive(Clone)]
pub struct H2Client {
    inner: Arc<Inner>,
}

struct Inner {
    id: u64,
    sender: SendRequest<Bytes>,
    counter: Arc<StreamCounter>,
    closed: CancellationToken,
    chunk: usize,
    response_timeout: Duration,
}

impl std::fmt::Debug for H2Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("H2Client")
            .field("id", &self.inner.id)
            .field("active_streams", &self.active_streams())
            .field("closed", &self.is_closed())
            .finish()
    }
}

/// Performs the HTTP/2 client handshake on `io` (already TLS-wrapped by the caller) and spawns
/// the task that drives the connection and its keepalive. Must run inside a tokio runtime.
pub async fn handshake<IO>(io: IO, cfg: &H2Config) -> Result<H2Client, Error>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (sender, mut conn) = cfg.client_builder().handshake::<_, Bytes>(io).await?;
    let id = NEXT_CONN_ID.fetch_add(1, Ordering::Relaxed);
    let closed = CancellationToken::new();
    let ping = conn.ping_pong();
    let keepalive = keepalive::run(ping, cfg.keepalive_interval, cfg.keepalive_timeout);
    let span = tracing::debug_span!("hbone_client", conn = id);
    tokio::spawn(drive(conn, keepalive, closed.clone()).instrument(span));
    tracing::debug!(conn = id, "hbone client connection established");
    Ok(H2Client {
        inner: Arc::new(Inner {
            id,
            sender,
            counter: Arc::new(StreamCounter::new()),
            closed,
            chunk: cfg.write_chunk(),
            response_timeout: cfg.connect_response_timeout,
        }),
    })
}

async fn drive<IO>(
    conn: Connection<IO, Bytes>,
    keepalive: impl Future<Output = Error>,
    closed: CancellationToken,
) where
    IO: AsyncRead + AsyncWrite + Unpin,
{
    tokio::select! {
        res = conn => match res {
            Ok(()) => tracing::debug!("hbone client connection closed"),
            Err(e) => tracing::debug!(error = %e, "hbone client connection failed"),
        },
        e = keepalive => tracing::warn!(error = %e, "hbone client keepalive failed, closing"),
    }
    closed.cancel();
}

/// Bytes for a tunnel that arrive while its `CONNECT` waits for the response: each chunk offered
/// is sent at once behind the `CONNECT` (early data), saving the round trip to the response.
/// Used through [`H2Client::connect_with_early`] and [`Pool::connect_with_early`](crate::Pool::connect_with_early).
/// A chunk is taken once: until the response comes, the client keeps it, so that a retry on
/// another connection can send it again.
pub trait EarlyData: Send {
    /// The next chunk to send now (`Pending`: none yet, the waker is called when there may be),
    /// or `Ready(None)`: nothing more will be offered (the source ended, failed or reached its
    /// limit; it keeps whatever it has to say about that).
    fn poll_early(&mut self, cx: &mut Context<'_>) -> Poll<Option<Bytes>>;
}

impl H2Client {
    /// Opens a tunnel: sends `CONNECT` and waits for the response. A 200 yields the stream and
    /// the response headers; any other status is [`Error::Status`].
    ///
    /// If the peer's concurrent-stream limit is reached, h2 queues the request until a stream
    /// slot frees up. Waiting for the slot and the response together is bounded by
    /// [`H2Config::connect_response_timeout`]: then the stream is cancelled and this fails with
    /// [`Error::ResponseTimeout`], leaving the connection to its other streams.
    pub async fn connect(&self, req: ConnectRequest) -> Result<(H2Stream, HeaderMap), Error> {
        let guard = self.inner.counter.guard();
        self.connect_with_guard(req, guard, None, &mut Vec::new())
            .await
    }

    /// Like [`connect`](Self::connect), and while the response is awaited, what `early` offers
    /// is sent on the stream as it comes (see [`EarlyData`]).
    pub async fn connect_with_early(
        &self,
        req: ConnectRequest,
        early: &mut dyn EarlyData,
    ) -> Result<(H2Stream, HeaderMap), Error> {
        let guard = self.inner.counter.guard();
        self.connect_with_guard(req, guard, Some(early), &mut Vec::new())
            .await
    }

    /// `taken` holds the chunks `early_source` offered to earlier attempts of this tunnel, in order: they are
    /// sent again first (a retry comes only where the peer cannot have delivered them), and every chunk taken
    /// now is appended.
    pub(crate) async fn connect_with_guard(
        &self,
        mut req: ConnectRequest,
        guard: StreamDropGuard,
        mut early_source: Option<&mut (dyn EarlyData + '_)>,
        taken: &mut Vec<Bytes>,
    ) -> Result<(H2Stream, HeaderMap), Error> {
        let authority = req.authority.clone();
        let early = std::mem::take(&mut req.early_data);
        let request = req.into_request()?;
        if self.is_closed() {
            return Err(Error::ConnectionClosed);
        }
        let exchange = async {
            let mut sender = self.inner.sender.clone().ready().await?;
            let (mut response, mut send) = sender.send_request(request, false)?;
            let offer = |send: &mut h2::SendStream<Bytes>, data: Bytes| {
                if let Err(e) = send.send_data(data, false) {
                    // The stream already ended (the peer answered or reset it at once): the
                    // bytes have nowhere to go, and the response says what happened.
                    tracing::debug!(conn = self.inner.id, %authority, error = %e, "hbone early data not sent");
                }
            };
            if !early.is_empty() {
                offer(&mut send, early);
            }
            for chunk in taken.iter() {
                offer(&mut send, chunk.clone());
            }
            let response = loop {
                let next = std::future::poll_fn(|cx| {
                    if let Poll::Ready(r) = Pin::new(&mut response).poll(cx) {
                        return Poll::Ready(Ok(r));
                    }
                    match early_source.as_deref_mut().map(|e| e.poll_early(cx)) {
                        Some(Poll::Ready(Some(data))) => Poll::Ready(Err(data)),
                        Some(Poll::Ready(None)) => {
                            early_source = None;
                            Poll::Pending
                        }
                        Some(Poll::Pending) | None => Poll::Pending,
                    }
                })
                .await;
                match next {
                    Ok(r) => break r?,
                    Err(data) => {
                        taken.push(data.clone());
                        offer(&mut send, data);
                    }
                }
            };
            Ok::<_, Error>((response, send))
        };
        // On timeout the exchange is dropped with its `SendStream` and `ResponseFuture`, which
        // makes h2 reset the stream (CANCEL).
        let timeout = self.inner.response_timeout;
        let (response, send) = match tokio::time::timeout(timeout, exchange).await {
            Ok(res) => res?,
            Err(_elapsed) => {
                tracing::debug!(conn = self.inner.id, %authority, ?timeout, "hbone CONNECT unanswered, cancelled");
                return Err(Error::ResponseTimeout(timeout));
            }
        };
        let (parts, recv) = response.into_parts();
        if parts.status != StatusCode::OK {
            tracing::debug!(conn = self.inner.id, %authority, status = %parts.status, "hbone CONNECT rejected");
            return Err(Error::Status(parts.status));
        }
        tracing::trace!(conn = self.inner.id, %authority, "hbone tunnel open");
        let stream = H2Stream::new(send, recv, Some(guard), self.inner.chunk);
        Ok((stream, parts.headers))
    }

    /// Streams opened on this connection and not yet fully dropped.
    pub fn active_streams(&self) -> usize {
        self.inner.counter.active()
    }

    /// The stream counter of this connection (shared with its streams' drop guards).
    pub fn stream_counter(&self) -> &Arc<StreamCounter> {
        &self.inner.counter
    }

    /// The peer's current `SETTINGS_MAX_CONCURRENT_STREAMS` (unbounded until its SETTINGS
    /// arrive).
    pub fn peer_max_concurrent_streams(&self) -> usize {
        self.inner.sender.current_max_send_streams()
    }

    /// Whether the connection task has ended; no stream can be opened any more.
    pub fn is_closed(&self) -> bool {
        self.inner.closed.is_cancelled()
    }

    /// Resolves once the connection task has ended.
    pub async fn closed(&self) {
        self.inner.closed.cancelled().await
    }

    /// Whether a new stream may be opened now: not closed, no GOAWAY received, no connection
    /// error.
    pub fn is_ready(&self) -> bool {
        if self.is_closed() {
            return false;
        }
        let mut sender = self.inner.sender.clone();
        let mut cx = Context::from_waker(Waker::noop());
        matches!(sender.poll_ready(&mut cx), Poll::Ready(Ok(())))
    }

    /// A process-unique id of this connection, for logs and the admin page.
    pub fn id(&self) -> u64 {
        self.inner.id
    }

    pub(crate) fn same_connection(&self, other: &H2Client) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_uses_authority_form() {
        let req = ConnectRequest::to_addr("[::1]:15008".parse().expect("addr"))
            .into_request()
            .expect("request");
        assert_eq!(req.method(), Method::CONNECT);
        assert_eq!(
            req.uri().authority().map(|a| a.as_str()),
            Some("[::1]:15008")
        );
        assert!(req.uri().scheme().is_none());
        assert!(ConnectRequest::new("a b:1").into_request().is_err());
    }
}
