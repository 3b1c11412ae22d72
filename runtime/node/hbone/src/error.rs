//! The error type of every fallible operation in this crate.

use std::sync::Arc;

use http::StatusCode;

/// A boxed error as returned by a caller-provided connect function, shared so that every caller
/// waiting on the same connection attempt can be handed the same cause.
pub type SharedError = Arc<dyn std::error::Error + Send + Sync + 'static>;

/// Errors from HBONE clients, servers and pools.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An I/O error on the underlying transport or a stream.
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    /// An HTTP/2 protocol, stream or connection error (including GOAWAY and RST_STREAM).
    #[error("http/2: {0}")]
    H2(#[from] h2::Error),
    /// The peer answered the CONNECT with a status other than 200.
    #[error("CONNECT answered with status {0}")]
    Status(StatusCode),
    /// A CONNECT authority that is not a literal `ip:port` (or `[ipv6]:port`).
    #[error("bad authority {0:?}: expected ip:port")]
    BadAuthority(String),
    /// The request or response could not be built (bad header name, status, ...).
    #[error("invalid http message: {0}")]
    Http(#[from] http::Error),
    /// The caller-provided connect function of a [`Pool`](crate::Pool) failed, for this caller or
    /// for the attempt it was waiting on.
    #[error("connect failed: {0}")]
    ConnectFailed(#[source] SharedError),
    /// No keepalive PING acknowledgement arrived in time; the connection was torn down.
    #[error("keepalive timed out")]
    KeepaliveTimeout,
    /// The connection is closed (or going away) and cannot open new streams.
    #[error("connection closed")]
    ConnectionClosed,
    /// Server side: the peer did not send the HTTP/2 client preface and its first SETTINGS frame
    /// within [`H2Config::handshake_timeout`](crate::H2Config::handshake_timeout); the
    /// connection was closed.
    #[error("no HTTP/2 preface and SETTINGS from the peer within {0:?}")]
    HandshakeTimeout(std::time::Duration),
    /// Client side: the server did not answer the CONNECT within
    /// [`H2Config::connect_response_timeout`](crate::H2Config::connect_response_timeout); the
    /// stream was cancelled, the connection is left as it was.
    #[error("no response to CONNECT within {0:?}")]
    ResponseTimeout(std::time::Duration),
}

impl Error {
    /// Whether a CONNECT that failed with this error may be retried on another connection
    /// without the peer having seen it: the connection was going away, closed, or refused the
    /// stream before processing it.
    ///
    /// A bare `CONNECT` is retried after any GOAWAY or I/O error of its connection: at worst the
    /// peer dialled once for nothing. One that carried
    /// [`early data`](crate::ConnectRequest::early_data) is retried only when the peer cannot
    /// have delivered those bytes, since sending them again would duplicate them: the stream was
    /// refused (`REFUSED_STREAM` means no processing happened), or the peer's graceful GOAWAY
    /// (`NO_ERROR`) failed it (h2 then fails only the streams above the GOAWAY's last processed
    /// one). A GOAWAY with an error code or an I/O error fails processed streams as well.
    pub fn is_retryable_on_new_connection(&self, sent_early_data: bool) -> bool {
        match self {
            Error::ConnectionClosed => true,
            Error::H2(e) if e.reason() == Some(h2::Reason::REFUSED_STREAM) => true,
            Error::H2(e) if sent_early_data => {
                e.is_go_away() && e.is_remote() && e.reason() == Some(h2::Reason::NO_ERROR)
            }
            Error::H2(e) => e.is_go_away() || e.is_io(),
            _ => false,
        }
    }
}
