//! weft-tls: TLS 1.3 sessions for HBONE. rustls runs the handshake (certificates, verification, key schedule);
//! weft's own record layer then carries the data, sealing and opening records where the bytes already are.
//!
//! Why not rustls's record layer: a proxy moves every byte through TLS, and rustls's buffered API copies each byte
//! more often than it must (plaintext into a fresh record before sealing; ciphertext into its own buffer, then
//! plaintext through a queue into the caller's). Here a record is sealed from the caller's buffer into the outgoing
//! one by the AEAD itself (aws-lc's out-of-place seal), and a received record is opened by it from the buffer it was
//! read into straight into the caller's (out-of-place open; the caller's room is zeroed first, as the AEAD takes
//! initialised memory). `--tls-record-layer rustls` ([`RecordLayer::Rustls`]) runs rustls's own instead; what each
//! costs is in docs/performance.md.
//!
//! rustls stays in charge of everything that is not record protection: the handshake runs on its unbuffered API
//! (`UnbufferedClientConnection`, `UnbufferedServerConnection`), and after it the session is turned into rustls's
//! [`KernelConnection`](rustls::kernel::KernelConnection) (the interface rustls offers for kernel TLS), which
//! derives the next keys for `KeyUpdate`. rustls sees the handshake's records one at a time and none after the
//! last, so nothing of the session is left half done in rustls at the hand-over. What this crate implements is
//! RFC 8446 §5 and the post-handshake messages: record framing and limits, nonces, inner content types and padding, alerts (`close_notify` ends the
//! read side; a few warning `user_canceled` pass; any other is fatal, closes both sides, and a protocol error sends
//! one), `KeyUpdate` in both directions (answering a peer's request, and updating our own key before the suite's
//! confidentiality limit), and `NewSessionTicket` (checked and dropped: weft's clients never resume, so no key is
//! derived for a ticket and nothing is kept). What a peer can send that delivers nothing is limited (empty records,
//! warnings and key updates as rustls limits them, tickets to a few per connection), and a read gives its worker
//! back after a few such records. Records are sealed with aws-lc's TLS 1.3 record key, as rustls seals them: the
//! AEAD itself refuses a nonce that does not follow the last, and every key (ours and the peer's) stops before its
//! sequence numbers could wrap. Only TLS 1.3 with AES-GCM is spoken (weft's provider offers nothing else).
//!
//! The configuration must allow the secret extraction this needs (`enable_secret_extraction = true` on the rustls
//! client or server config); rustls refuses the hand-over otherwise, and the error says so.
//!
//! What the fuzz target needs to play a peer that breaks the rules (sealing a record of any content type under the
//! session's key, writing to the transport under the session) exists only with the crate feature `fuzzing`, which
//! only `conformance/fuzz` enables: a build of weft has no such door.
#![cfg_attr(
    not(feature = "fuzzing"),
    doc = "```compile_fail\nlet _ = weft_tls::fuzzing::MAX_RAW_CONTENT; // no such module without the feature\n```"
)]

mod error;
mod handshake;
mod record;
mod session;
mod stream;

use std::sync::Arc;

use rustls::client::UnbufferedClientConnection;
use rustls::pki_types::ServerName;
use rustls::server::UnbufferedServerConnection;
use rustls::{ClientConfig, ServerConfig};
use tokio::io::{AsyncRead, AsyncWrite};

pub use error::Error;
pub use session::{RecordLayer, Session, accept_on, connect_on};
pub use stream::{FIRST_READ, READ_AHEAD, SEND_BUFFER, TlsStream};

/// Open a TLS 1.3 session to `name` over `io` as a client. The caller bounds the time it may take.
pub async fn connect<IO>(
    config: Arc<ClientConfig>,
    name: ServerName<'static>,
    mut io: IO,
) -> Result<TlsStream<IO>, Error>
where
    IO: AsyncRead + AsyncWrite + Unpin,
{
    let conn = UnbufferedClientConnection::new(config, name)?;
    let done = handshake::drive(conn, &mut io).await?;
    TlsStream::new(io, done)
}

/// Accept a TLS 1.3 session over `io` as a server. The caller bounds the time it may take.
pub async fn accept<IO>(config: Arc<ServerConfig>, mut io: IO) -> Result<TlsStream<IO>, Error>
where
    IO: AsyncRead + AsyncWrite + Unpin,
{
    let conn = UnbufferedServerConnection::new(config)?;
    let done = handshake::drive(conn, &mut io).await?;
    TlsStream::new(io, done)
}

#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
