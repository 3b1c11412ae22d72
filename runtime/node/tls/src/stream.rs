//! The protected byte stream after the handshake: TLS 1.3 records read, opened and handed out, and written
//! straight from the caller's buffers, over any async transport.
//!
//! Reading: the transport is read into one buffer ([`READ_AHEAD`] at a time while reads bring at least [`FIRST_READ`]),
//! and each record is opened from there straight into the caller's buffer when that has room for it (else in place, its
//! content then copied out); after a few records that deliver nothing (`IDLE_RECORDS_PER_READ`) a read returns or
//! yields, so no peer keeps it busy. Writing: each record is sealed from the caller's buffer directly into a queue of
//! reusable output chunks (no plaintext copy; only short pieces, such as an HTTP/2 frame's head, are gathered with what
//! follows them), and the queue goes out in vectored writes of up to [`SEND_BUFFER`] bytes. Both buffers are given back
//! once a connection stops moving bulk data, so an idle connection holds none.

use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::BytesMut;
use rustls::SupportedCipherSuite;
use rustls::pki_types::CertificateDer;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

mod post_handshake;
mod read;
#[cfg(test)]
mod tests;
mod write;

use read::Opened;

use crate::Error;
use crate::handshake::{Established, Kernel};
use crate::record::{ALERT, MAX_PLAINTEXT, OpenKeys, SealKeys, record_len, seq_limit};

/// Bytes asked of the transport by one read once reads bring at least [`FIRST_READ`] (a bulk transfer); a quiet
/// connection asks for [`FIRST_READ`]. As fast as 1 MiB in the mesh bench, at a quarter of the memory a busy
/// connection holds (docs/performance.md).
pub const READ_AHEAD: usize = 256 * 1024;
/// Bytes asked of the transport by a read while reads do not fill what they are offered.
pub const FIRST_READ: usize = 32 * 1024;
/// Sealed bytes a stream queues before writes wait for the transport. One write seals up to this much, so a
/// 1 MiB HTTP/2 DATA frame (ztunnel's and weft's frame size) is sealed in one call and goes out in one vectored
/// write: faster and cheaper per byte than smaller writes in the mesh bench (docs/performance.md). The cost is
/// memory while a connection moves bulk data (its sealed output and spare chunks, about 1 MiB each); a quiet
/// connection holds none.
pub const SEND_BUFFER: usize = 1024 * 1024;
/// One reusable output chunk: four full records.
const CHUNK: usize = 4 * record_len(MAX_PLAINTEXT);
/// Output chunks kept for reuse while a connection moves bulk data.
const SPARE_CHUNKS: usize = SEND_BUFFER / CHUNK + 2;
/// Chunks one vectored write takes at most: a full queue's worth.
const WRITE_SLICES: usize = SEND_BUFFER / CHUNK + 4;
/// Flushes in a row that wrote less than a chunk before a stream that moved bulk data gives its buffers back.
const QUIET_FLUSHES: u32 = 4;
/// A piece of the caller's slices shorter than this that ends inside a record is copied into that record with
/// what follows it; a longer one ends a shorter record instead (see `seal_from`). An HTTP/2 DATA frame comes as its
/// head with the payload's first bytes (256 together, h2's chaining threshold), then the rest of the payload:
/// gathering a whole record there copied 16 KiB of every frame.
const GATHER_BELOW: usize = 1024;
/// A write smaller than this gets an output buffer of its own size instead of a chunk.
const SMALL_WRITE: usize = 4096;
/// Post-handshake handshake bytes buffered while a message is incomplete.
const MAX_HANDSHAKE_BYTES: usize = 64 * 1024;
/// Key updates accepted in a row without application data in between (rustls and BoringSSL allow 32).
const MAX_KEY_UPDATES_IN_A_ROW: u32 = 32;
/// Empty records accepted in a row (rustls's `ALLOWED_CONSECUTIVE_EMPTY_FRAGMENTS_MAX`): one more is an error.
const MAX_EMPTY_RECORDS_IN_A_ROW: u32 = 32;
/// Warning alerts accepted per connection (rustls's and BoringSSL's limit); in TLS 1.3 only `user_canceled` may be
/// one.
const MAX_WARNING_ALERTS: u32 = 4;
/// `NewSessionTicket`s a client accepts per connection. weft's clients never resume, so tickets are checked and
/// dropped; servers send one or two (rustls, OpenSSL: 2 by default), so more than this is a flood.
const MAX_SESSION_TICKETS: u32 = 16;
/// Records that deliver nothing (empty, alerts, post-handshake messages) one read opens before it gives way: it
/// returns what it has, or wakes itself and returns `Pending`, so a peer streaming such records cannot keep a
/// worker inside one read.
const IDLE_RECORDS_PER_READ: u32 = 16;
/// TLS alert descriptions used here (RFC 8446 §6).
const CLOSE_NOTIFY: u8 = 0;
const USER_CANCELED: u8 = 90;

/// Content of an opened record waiting in the read buffer.
#[derive(Debug, Clone, Copy)]
struct Plain {
    start: usize,
    end: usize,
    record_end: usize,
}

/// Sealed records waiting for the transport.
#[derive(Debug)]
struct Chunk {
    buf: Vec<u8>,
    start: usize,
    end: usize,
}

/// A failure kept to answer every later call in the same direction.
#[derive(Debug, Clone)]
struct Sticky(io::ErrorKind, String);

impl Sticky {
    fn of(e: &io::Error) -> Self {
        Self(e.kind(), e.to_string())
    }
    fn io(&self) -> io::Error {
        io::Error::new(self.0, self.1.clone())
    }
}

/// A TLS 1.3 session over `IO` after its handshake (see the module documentation).
pub struct TlsStream<IO> {
    io: IO,
    kernel: Kernel,
    suite: SupportedCipherSuite,
    peer_certificates: Option<Vec<CertificateDer<'static>>>,
    alpn: Option<Vec<u8>>,
    rx: OpenKeys,
    tx: SealKeys,
    tx_limit: u64,

    /// Ciphertext read and not yet consumed, from the start of a record.
    rbuf: BytesMut,
    plain: Option<Plain>,
    /// Post-handshake handshake messages not yet complete.
    hs: Vec<u8>,
    /// The last read filled all it was offered or brought at least [`FIRST_READ`] bytes: the connection is
    /// moving bulk data, reads ask for [`READ_AHEAD`] bytes and the buffer is kept when drained.
    read_ahead: bool,
    read_closed: bool,
    read_error: Option<Sticky>,
    key_updates_in_a_row: u32,
    /// Empty records received since the last record with content.
    empty_in_a_row: u32,
    /// Warning alerts received on this connection.
    warning_alerts: u32,
    /// `NewSessionTicket`s received on this connection.
    session_tickets: u32,

    out: VecDeque<Chunk>,
    spare: Vec<Vec<u8>>,
    /// Bytes in `out` not yet written.
    queued: usize,
    /// Bytes written since `out` was last empty.
    burst: usize,
    /// Times in a row `out` was emptied after writing less than a chunk: after [`QUIET_FLUSHES`], the output
    /// buffers are given back.
    quiet_flushes: u32,
    gather: Vec<u8>,
    /// A `KeyUpdate` to send before the next record: `Some(true)` also asks the peer to update.
    key_update: Option<bool>,
    write_closed: bool,
    write_error: Option<Sticky>,
}

impl<IO> std::fmt::Debug for TlsStream<IO> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsStream")
            .field("suite", &self.suite.suite())
            .field("rx", &self.rx)
            .field("tx", &self.tx)
            .field("queued", &self.queued)
            .field("read_closed", &self.read_closed)
            .field("write_closed", &self.write_closed)
            .finish_non_exhaustive()
    }
}

impl<IO> TlsStream<IO> {
    pub(crate) fn new(io: IO, hs: Established) -> Result<Self, Error> {
        let Established {
            secrets,
            kernel,
            suite,
            peer_certificates,
            alpn,
            leftover,
        } = hs;
        let limit = match suite {
            SupportedCipherSuite::Tls13(s) => s.common.confidentiality_limit,
            #[allow(unreachable_patterns)]
            _ => return Err(Error::UnsupportedSuite),
        };
        let (tx_seq, tx) = secrets.tx;
        let (rx_seq, rx) = secrets.rx;
        Ok(Self {
            io,
            kernel,
            suite,
            peer_certificates,
            alpn,
            rx: OpenKeys::new(rx_seq, rx)?,
            tx: SealKeys::new(tx_seq, tx)?,
            tx_limit: seq_limit(limit),
            rbuf: BytesMut::from(&leftover[..]),
            plain: None,
            hs: Vec::new(),
            read_ahead: false,
            read_closed: false,
            read_error: None,
            key_updates_in_a_row: 0,
            empty_in_a_row: 0,
            warning_alerts: 0,
            session_tickets: 0,
            out: VecDeque::new(),
            spare: Vec::new(),
            queued: 0,
            burst: 0,
            quiet_flushes: 0,
            gather: Vec::new(),
            key_update: None,
            write_closed: false,
            write_error: None,
        })
    }

    /// The peer's certificate chain, leaf first, as the handshake verified it.
    pub fn peer_certificates(&self) -> Option<&[CertificateDer<'static>]> {
        self.peer_certificates.as_deref()
    }

    /// The ALPN protocol agreed in the handshake.
    pub fn alpn_protocol(&self) -> Option<&[u8]> {
        self.alpn.as_deref()
    }

    /// The cipher suite agreed in the handshake.
    pub fn negotiated_cipher_suite(&self) -> SupportedCipherSuite {
        self.suite
    }

    /// The transport.
    pub fn get_ref(&self) -> &IO {
        &self.io
    }

    #[cfg(feature = "fuzzing")]
    pub(crate) fn transport_mut(&mut self) -> &mut IO {
        &mut self.io
    }

    /// Replace the sending key before the next record (a TLS 1.3 `KeyUpdate`), and ask the peer to replace its own
    /// too if `request_peer`. The stream does this by itself before a key reaches its suite's limit.
    pub fn refresh_traffic_keys(&mut self, request_peer: bool) {
        self.key_update = Some(self.key_update.unwrap_or(false) || request_peer);
    }

    /// Sequence numbers of the next record to send and to receive under the current keys.
    pub fn sequence_numbers(&self) -> (u64, u64) {
        (self.tx.seq, self.rx.seq)
    }

    /// Bytes of buffer memory the stream holds right now (read buffer, queued and spare output), for accounting:
    /// a connection that is not moving data holds none.
    pub fn buffer_capacity(&self) -> usize {
        self.rbuf.capacity()
            + self.hs.capacity()
            + self.gather.capacity()
            + self.out.iter().map(|c| c.buf.len()).sum::<usize>()
            + self.spare.iter().map(Vec::len).sum::<usize>()
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncRead for TlsStream<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = out.filled().len();
        let mut idle = 0;
        loop {
            if out.remaining() == 0 {
                return Poll::Ready(Ok(()));
            }
            if this.hand_out(out) {
                continue;
            }
            let delivered = out.filled().len() > before;
            if this.read_error.is_some() {
                // A fatal alert the transport could not take when the read failed goes out with each later read
                // as well as with writes, so an application that only reads (and then drops the stream) still
                // tells the peer why.
                if this.queued > 0
                    && this.write_error.is_none()
                    && let Poll::Ready(Err(e)) = this.poll_write_out(cx)
                {
                    this.fail_write(e);
                }
                let e = this.read_error.as_ref().map(Sticky::io);
                return Poll::Ready(match e {
                    Some(e) if !delivered => Err(e),
                    _ => Ok(()),
                });
            }
            if this.read_closed {
                return Poll::Ready(Ok(()));
            }
            match this.next_record(out) {
                Ok(Opened::Data) => continue,
                Ok(Opened::Nothing) => {
                    idle += 1;
                    if idle < IDLE_RECORDS_PER_READ || this.read_closed {
                        continue;
                    }
                    // Enough work for one call: give the worker back, and come again at once.
                    if delivered {
                        return Poll::Ready(Ok(()));
                    }
                    cx.waker().wake_by_ref();
                    return Poll::Pending;
                }
                Ok(Opened::Incomplete) => {}
                Err(e) => {
                    this.fail_read(e, cx);
                    continue;
                }
            }
            if delivered {
                return Poll::Ready(Ok(()));
            }
            match ready!(this.poll_fill(cx)) {
                Ok(0) => {
                    let why = if this.rbuf.is_empty() {
                        "peer closed connection without sending TLS close_notify"
                    } else {
                        "peer closed connection in the middle of a TLS record"
                    };
                    let e = io::Error::new(io::ErrorKind::UnexpectedEof, why);
                    this.read_error = Some(Sticky::of(&e));
                }
                Ok(_) => {}
                Err(e) => {
                    this.read_error = Some(Sticky::of(&e));
                    return Poll::Ready(Err(e));
                }
            }
        }
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncWrite for TlsStream<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_write_vectored(cx, &[IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        this.check_write()?;
        if this.write_closed {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "TLS stream already closed for writing",
            )));
        }
        if bufs.iter().all(|b| b.is_empty()) {
            return Poll::Ready(Ok(0));
        }
        while this.queued >= SEND_BUFFER {
            if let Err(e) = ready!(this.poll_write_out(cx)) {
                return Poll::Ready(Err(this.fail_write(e)));
            }
        }
        let budget = (SEND_BUFFER - this.queued).max(MAX_PLAINTEXT);
        let n = match this.seal_from(bufs, budget) {
            Ok(n) => n,
            Err(e) => return Poll::Ready(Err(this.fail_write(e.into()))),
        };
        // Start sending without waiting; a failure shows on the next call.
        if let Poll::Ready(Err(e)) = this.poll_write_out(cx) {
            this.fail_write(e);
        }
        Poll::Ready(Ok(n))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.check_write()?;
        if this.key_update.is_some()
            && !this.write_closed
            && let Err(e) = this.maybe_update_keys()
        {
            return Poll::Ready(Err(this.fail_write(e.into())));
        }
        this.poll_flush_all(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.check_write()?;
        if !this.write_closed {
            let sealed = this
                .maybe_update_keys()
                .and_then(|()| this.seal_record(ALERT, &[1, CLOSE_NOTIFY], 0));
            if let Err(e) = sealed {
                return Poll::Ready(Err(this.fail_write(e.into())));
            }
            this.write_closed = true;
        }
        ready!(this.poll_flush_all(cx))?;
        Pin::new(&mut this.io).poll_shutdown(cx)
    }
}
