//! What can go wrong in a TLS session, from the handshake to the last record.

use std::io;

/// A TLS session's failure.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The transport failed.
    #[error("transport: {0}")]
    Io(#[from] io::Error),
    /// rustls refused the handshake or a post-handshake message (certificate, protocol, alert).
    #[error("TLS: {0}")]
    Tls(#[from] rustls::Error),
    /// The peer closed the transport before the handshake finished.
    #[error("the peer closed the connection during the TLS handshake")]
    HandshakeEof,
    /// The session negotiated a suite the record layer does not implement (only AES-GCM is offered).
    #[error("negotiated cipher suite is not supported by the record layer")]
    UnsupportedSuite,
    /// A record failed authentication: altered, truncated, or protected with another key.
    #[error("TLS record failed authentication (bad_record_mac)")]
    BadRecordMac,
    /// A record longer than TLS 1.3 allows.
    #[error("TLS record too long (record_overflow)")]
    RecordOverflow,
    /// A record or message that is not allowed where it came (`unexpected_message`).
    #[error("unexpected TLS message: {0}")]
    UnexpectedMessage(&'static str),
    /// A message that does not parse (`decode_error`).
    #[error("malformed TLS message (decode_error): {0}")]
    DecodeError(&'static str),
    /// A message that parses but carries a value out of its range (`illegal_parameter`).
    #[error("TLS message with an illegal parameter (illegal_parameter): {0}")]
    IllegalParameter(&'static str),
    /// The peer sent a fatal alert.
    #[error("peer sent TLS alert {0}")]
    PeerAlert(u8),
    /// A key reached the end of its sequence numbers without being replaced: sealing or opening more under it
    /// would reuse a nonce.
    #[error("TLS traffic key used up (sequence number limit)")]
    KeyExhausted,
    /// The AEAD refused to seal (never expected with valid lengths).
    #[error("TLS record encryption failed")]
    Crypto,
}

impl From<Error> for io::Error {
    fn from(e: Error) -> Self {
        match e {
            Error::Io(e) => e,
            Error::HandshakeEof => io::Error::new(io::ErrorKind::UnexpectedEof, e),
            other => io::Error::new(io::ErrorKind::InvalidData, other),
        }
    }
}
