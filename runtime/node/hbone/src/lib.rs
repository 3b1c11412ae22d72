//! HBONE: HTTP/2 CONNECT tunnels (client, server, connection pool) over any async byte stream.
//!
//! HBONE is Istio ambient's tunnel protocol: each proxied TCP connection is one HTTP/2
//! `CONNECT` stream (`:authority` = `ip:port`, IPv6 as `[ip]:port`) over a mutual-TLS
//! connection to port 15008; a 200 response opens the tunnel, DATA frames carry the bytes and
//! END_STREAM half-closes. This crate is wire-compatible with ztunnel and knows nothing of TLS,
//! xDS or policy: callers hand in an already established (TLS) byte stream.
//!
//! - [`handshake`] turns a stream into an [`H2Client`]; [`H2Client::connect`] opens tunnels.
//! - [`serve_connection`] serves one inbound connection, handing each stream to a handler as
//!   an [`InboundRequest`], which it [`accept`](InboundRequest::accept)s or
//!   [`reject`](InboundRequest::reject)s.
//! - [`Pool`] reuses client connections per key.
//! - [`H2Stream`] is the tunnel: `AsyncRead + AsyncWrite`, with half-close.
//! - [`H2Config`] holds the HTTP/2 settings (ztunnel's defaults).

/// `AsyncWrite` for a wrapper that only watches or buffers what is read (`$wrapper<T>`, its transport in the field
/// `io`): every write goes straight through to the transport.
macro_rules! write_through {
    ($wrapper:ident) => {
        impl<T: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for $wrapper<T> {
            fn poll_write(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
                buf: &[u8],
            ) -> std::task::Poll<std::io::Result<usize>> {
                std::pin::Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
            }

            fn poll_write_vectored(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
                bufs: &[std::io::IoSlice<'_>],
            ) -> std::task::Poll<std::io::Result<usize>> {
                std::pin::Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
            }

            fn is_write_vectored(&self) -> bool {
                self.io.is_write_vectored()
            }

            fn poll_flush(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<std::io::Result<()>> {
                std::pin::Pin::new(&mut self.get_mut().io).poll_flush(cx)
            }

            fn poll_shutdown(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<std::io::Result<()>> {
                std::pin::Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
            }
        }
    };
}

pub mod client;
pub mod config;
pub mod counter;
pub mod error;
mod keepalive;
pub mod pool;
mod preface;
pub mod server;
pub mod stream;

pub use client::{ConnectRequest, EarlyData, H2Client, handshake};
pub use config::H2Config;
pub use counter::{StreamCounter, StreamDropGuard};
pub use error::{Error, SharedError};
pub use pool::{Pool, PoolConfig};
pub use server::{InboundRequest, parse_authority, serve_connection};
pub use stream::{H2RecvHalf, H2SendHalf, H2Stream};

/// The HBONE port, as used by ztunnel.
pub const HBONE_PORT: u16 = 15008;
