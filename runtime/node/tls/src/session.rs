//! The record layer an operator picks (`--tls-record-layer`): weft's own ([`TlsStream`]) or rustls's (through
//! tokio-rustls), behind one stream type. The handshake is rustls's either way; only who seals and opens the
//! records after it differs.

use std::fmt;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::str::FromStr;
use std::sync::Arc;
use std::task::{Context, Poll};

use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, ServerConfig};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::{Error, TlsStream};

/// Who protects the records after the handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RecordLayer {
    /// weft's record layer: records sealed from and opened into the caller's buffers (see the crate docs).
    #[default]
    Weft,
    /// rustls's own record layer (its buffered connection, through tokio-rustls), as ztunnel runs it.
    Rustls,
}

impl RecordLayer {
    /// The name the flag takes.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Weft => "weft",
            Self::Rustls => "rustls",
        }
    }
}

impl fmt::Display for RecordLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for RecordLayer {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "weft" => Ok(Self::Weft),
            "rustls" => Ok(Self::Rustls),
            other => Err(format!(
                "unknown TLS record layer {other:?} (expected \"weft\" or \"rustls\")"
            )),
        }
    }
}

/// A TLS 1.3 session after its handshake, on the record layer it was opened with.
pub enum Session<IO> {
    /// weft's record layer.
    Weft(Box<TlsStream<IO>>),
    /// rustls's record layer.
    Rustls(Box<tokio_rustls::TlsStream<IO>>),
}

impl<IO> fmt::Debug for Session<IO> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Weft(s) => s.fmt(f),
            Self::Rustls(_) => f.write_str("Session::Rustls"),
        }
    }
}

/// Open a TLS 1.3 session to `name` over `io` as a client, on `layer`. The caller bounds the time it may take.
pub async fn connect_on<IO>(
    layer: RecordLayer,
    config: Arc<ClientConfig>,
    name: ServerName<'static>,
    io: IO,
) -> Result<Session<IO>, Error>
where
    IO: AsyncRead + AsyncWrite + Unpin,
{
    Ok(match layer {
        RecordLayer::Weft => Session::Weft(Box::new(crate::connect(config, name, io).await?)),
        RecordLayer::Rustls => {
            let s = tokio_rustls::TlsConnector::from(config)
                .connect(name, io)
                .await
                .map_err(handshake_error)?;
            let mut s = tokio_rustls::TlsStream::from(s);
            buffer_like_weft(&mut s);
            Session::Rustls(Box::new(s))
        }
    })
}

/// Accept a TLS 1.3 session over `io` as a server, on `layer`. The caller bounds the time it may take.
pub async fn accept_on<IO>(
    layer: RecordLayer,
    config: Arc<ServerConfig>,
    io: IO,
) -> Result<Session<IO>, Error>
where
    IO: AsyncRead + AsyncWrite + Unpin,
{
    Ok(match layer {
        RecordLayer::Weft => Session::Weft(Box::new(crate::accept(config, io).await?)),
        RecordLayer::Rustls => {
            let s = tokio_rustls::TlsAcceptor::from(config)
                .accept(io)
                .await
                .map_err(handshake_error)?;
            let mut s = tokio_rustls::TlsStream::from(s);
            buffer_like_weft(&mut s);
            Session::Rustls(Box::new(s))
        }
    })
}

/// rustls queues 64 KiB of sealed output by default; weft's layer queues [`SEND_BUFFER`](crate::SEND_BUFFER)
/// (a whole 1 MiB HTTP/2 DATA frame per write), and so does rustls's here, so the two differ in who seals, not in
/// how much a write may take.
fn buffer_like_weft<IO>(s: &mut tokio_rustls::TlsStream<IO>) {
    match s {
        tokio_rustls::TlsStream::Client(c) => {
            c.get_mut().1.set_buffer_limit(Some(crate::SEND_BUFFER))
        }
        tokio_rustls::TlsStream::Server(c) => {
            c.get_mut().1.set_buffer_limit(Some(crate::SEND_BUFFER))
        }
    }
}

/// tokio-rustls reports rustls's refusals as an io error wrapping the rustls error: give them back their kind.
fn handshake_error(e: io::Error) -> Error {
    if e.kind() == io::ErrorKind::UnexpectedEof {
        return Error::HandshakeEof;
    }
    match e.into_inner() {
        Some(inner) => match inner.downcast::<rustls::Error>() {
            Ok(tls) => Error::Tls(*tls),
            Err(other) => Error::Io(io::Error::other(other)),
        },
        None => Error::Io(io::Error::other("TLS handshake failed")),
    }
}

impl<IO> Session<IO> {
    /// The record layer this session runs on.
    pub fn record_layer(&self) -> RecordLayer {
        match self {
            Self::Weft(_) => RecordLayer::Weft,
            Self::Rustls(_) => RecordLayer::Rustls,
        }
    }

    /// The peer's certificate chain, leaf first, as the handshake verified it.
    pub fn peer_certificates(&self) -> Option<&[CertificateDer<'static>]> {
        match self {
            Self::Weft(s) => s.peer_certificates(),
            Self::Rustls(s) => s.get_ref().1.peer_certificates(),
        }
    }

    /// The ALPN protocol agreed in the handshake.
    pub fn alpn_protocol(&self) -> Option<&[u8]> {
        match self {
            Self::Weft(s) => s.alpn_protocol(),
            Self::Rustls(s) => s.get_ref().1.alpn_protocol(),
        }
    }

    /// The transport.
    pub fn get_ref(&self) -> &IO {
        match self {
            Self::Weft(s) => s.get_ref(),
            Self::Rustls(s) => s.get_ref().0,
        }
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncRead for Session<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Weft(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
            Self::Rustls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncWrite for Session<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Weft(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
            Self::Rustls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Weft(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
            Self::Rustls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Self::Weft(s) => s.is_write_vectored(),
            Self::Rustls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Weft(s) => Pin::new(s.as_mut()).poll_flush(cx),
            Self::Rustls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Weft(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
            Self::Rustls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}
