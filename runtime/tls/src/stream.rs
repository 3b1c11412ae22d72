//! The protected byte stream after the handshake: TLS 1.3 records read, opened and handed out, and written
//! straight from the caller's buffers, over any async transport.
//!
//! Reading: the transport is read into one buffer ([`READ_AHEAD`] at a time while reads bring at least
//! [`FIRST_READ`]), each record is opened in place there, and its content is copied once, into the caller's
//! buffer. Writing: each record is sealed from the caller's buffer directly into a queue of reusable output chunks
//! (no plaintext copy; only a record that spans two of the caller's slices, such as an HTTP/2 frame header and its
//! payload, is first gathered), and the queue goes out in vectored writes of up to [`SEND_BUFFER`] bytes. Both
//! buffers are given back once a connection stops moving bulk data, so an idle connection holds none.

use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Buf, BytesMut};
use rustls::SupportedCipherSuite;
use rustls::pki_types::CertificateDer;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_util::io::poll_read_buf;

use crate::Error;
use crate::handshake::{Established, Kernel};
use crate::record::{
    ALERT, APPLICATION_DATA, HANDSHAKE, HEADER_LEN, Keys, MAX_PLAINTEXT, parse_header, record_len,
    seq_limit,
};

/// Bytes asked of the transport by one read once reads bring at least [`FIRST_READ`] (a bulk transfer); a quiet
/// connection asks for [`FIRST_READ`]. In the mesh bench (one flow, 6 rounds of 2 GiB each way, twice, against the
/// same build reading 1 MiB): 1.03× and 0.98× the throughput up, 1.01× and 0.97× down, so no difference this
/// machine can see, at a quarter of the memory a busy connection holds. (Under rustls's record layer, which took 4
/// KiB per read from a read-ahead buffer, 1 MiB against 64 KiB had made 1.11× and 1.15×: the receiving node drains
/// its socket in few reads and opens its peer's window sooner.)
pub const READ_AHEAD: usize = 256 * 1024;
/// Bytes asked of the transport by a read while reads do not fill what they are offered.
pub const FIRST_READ: usize = 32 * 1024;
/// Sealed bytes a stream queues before writes wait for the transport. One write seals up to this much, so a
/// 1 MiB HTTP/2 DATA frame goes out in a few large vectored writes. Measured with rustls's buffered writer before
/// this record layer (its `set_buffer_limit`): 256 KiB against 64 KiB, 1.08× and 1.07× the one-flow throughput.
pub const SEND_BUFFER: usize = 256 * 1024;
/// One reusable output chunk: four full records.
const CHUNK: usize = 4 * record_len(MAX_PLAINTEXT);
/// Output chunks kept for reuse while a connection moves bulk data.
const SPARE_CHUNKS: usize = SEND_BUFFER / CHUNK + 2;
/// Flushes in a row that wrote less than a chunk before a stream that moved bulk data gives its buffers back.
const QUIET_FLUSHES: u32 = 4;
/// A write smaller than this gets an output buffer of its own size instead of a chunk.
const SMALL_WRITE: usize = 4096;
/// Post-handshake handshake bytes buffered while a message is incomplete.
const MAX_HANDSHAKE_BYTES: usize = 64 * 1024;
/// Key updates accepted in a row without application data in between (rustls and BoringSSL allow 32).
const MAX_KEY_UPDATES_IN_A_ROW: u32 = 32;
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
    rx: Keys,
    tx: Keys,
    tx_limit: u64,

    /// Ciphertext read and not yet consumed, from the start of a record.
    rbuf: BytesMut,
    plain: Option<Plain>,
    /// Application data rustls decrypted during the handshake.
    early: BytesMut,
    /// Post-handshake handshake messages not yet complete.
    hs: Vec<u8>,
    /// The last read filled all it was offered or brought at least [`FIRST_READ`] bytes: the connection is
    /// moving bulk data, reads ask for [`READ_AHEAD`] bytes and the buffer is kept when drained.
    read_ahead: bool,
    read_closed: bool,
    read_error: Option<Sticky>,
    key_updates_in_a_row: u32,

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
            early_plaintext,
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
            rx: Keys::new(rx_seq, rx)?,
            tx: Keys::new(tx_seq, tx)?,
            tx_limit: seq_limit(limit),
            rbuf: BytesMut::from(&leftover[..]),
            plain: None,
            early: BytesMut::from(&early_plaintext[..]),
            hs: Vec::new(),
            read_ahead: false,
            read_closed: false,
            read_error: None,
            key_updates_in_a_row: 0,
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
            + self.early.capacity()
            + self.hs.capacity()
            + self.gather.capacity()
            + self.out.iter().map(|c| c.buf.len()).sum::<usize>()
            + self.spare.iter().map(Vec::len).sum::<usize>()
    }
}

// Reading.
impl<IO: AsyncRead + AsyncWrite + Unpin> TlsStream<IO> {
    /// Copy what is decrypted and waiting into `out`; false if nothing was waiting.
    fn hand_out(&mut self, out: &mut ReadBuf<'_>) -> bool {
        if !self.early.is_empty() {
            let n = out.remaining().min(self.early.len());
            out.put_slice(&self.early[..n]);
            self.early.advance(n);
            if self.early.is_empty() {
                self.early = BytesMut::new();
            }
            return true;
        }
        let Some(p) = self.plain.as_mut() else {
            return false;
        };
        let n = out.remaining().min(p.end - p.start);
        out.put_slice(&self.rbuf[p.start..p.start + n]);
        p.start += n;
        if p.start == p.end {
            let end = p.record_end;
            self.plain = None;
            self.consume(end);
        }
        true
    }

    fn consume(&mut self, n: usize) {
        self.rbuf.advance(n);
        if self.rbuf.is_empty() && !self.read_ahead {
            // Give the buffer back: a quiet connection holds none. (A busy one keeps it: its next read reuses it.)
            self.rbuf = BytesMut::new();
        }
    }

    /// Open the next record if it is all in the buffer; false if more bytes are needed.
    fn next_record(&mut self) -> Result<bool, Error> {
        let Some(h) = self.rbuf.get(..HEADER_LEN) else {
            return Ok(false);
        };
        let mut header = [0u8; HEADER_LEN];
        header.copy_from_slice(h);
        let end = HEADER_LEN + parse_header(header)?;
        let Some(body) = self.rbuf.get_mut(HEADER_LEN..end) else {
            return Ok(false);
        };
        let (content_type, n) = self.rx.open(header, body)?;
        if content_type != HANDSHAKE && !self.hs.is_empty() {
            return Err(Error::UnexpectedMessage(
                "a record inside a fragmented handshake message",
            ));
        }
        match content_type {
            APPLICATION_DATA => {
                self.key_updates_in_a_row = 0;
                if n == 0 {
                    self.consume(end);
                } else {
                    self.plain = Some(Plain {
                        start: HEADER_LEN,
                        end: HEADER_LEN + n,
                        record_end: end,
                    });
                }
            }
            HANDSHAKE => {
                if n == 0 {
                    return Err(Error::UnexpectedMessage("an empty handshake record"));
                }
                if self.hs.len() + n > MAX_HANDSHAKE_BYTES {
                    return Err(Error::UnexpectedMessage(
                        "a post-handshake message too large",
                    ));
                }
                self.hs
                    .extend_from_slice(&self.rbuf[HEADER_LEN..HEADER_LEN + n]);
                self.consume(end);
                self.handle_handshake()?;
            }
            ALERT => {
                let alert = (n == 2).then(|| self.rbuf[HEADER_LEN + 1]);
                self.consume(end);
                match alert {
                    None => return Err(Error::UnexpectedMessage("a malformed alert")),
                    Some(CLOSE_NOTIFY) => self.read_closed = true,
                    Some(USER_CANCELED) => {}
                    Some(d) => return Err(Error::PeerAlert(d)),
                }
            }
            _ => {
                return Err(Error::UnexpectedMessage(
                    "a record of an unknown content type",
                ));
            }
        }
        Ok(true)
    }

    /// Act on the complete post-handshake messages buffered: session tickets and key updates.
    fn handle_handshake(&mut self) -> Result<(), Error> {
        while let [typ, a, b, c, ..] = self.hs[..] {
            let len = usize::from(a) << 16 | usize::from(b) << 8 | usize::from(c);
            let Some(body) = self.hs.get(4..4 + len) else {
                if 4 + len > MAX_HANDSHAKE_BYTES {
                    return Err(Error::UnexpectedMessage(
                        "a post-handshake message too large",
                    ));
                }
                return Ok(());
            };
            match typ {
                // new_session_ticket
                4 => self.kernel.new_session_ticket(body)?,
                // key_update
                24 => {
                    let request = match body {
                        [0] => false,
                        [1] => true,
                        _ => return Err(Error::UnexpectedMessage("a malformed KeyUpdate")),
                    };
                    if self.hs.len() != 5 {
                        // RFC 8446 §5.1: handshake messages must not span a key change.
                        return Err(Error::UnexpectedMessage(
                            "a KeyUpdate not at the end of its record",
                        ));
                    }
                    self.key_updates_in_a_row += 1;
                    if self.key_updates_in_a_row > MAX_KEY_UPDATES_IN_A_ROW {
                        return Err(Error::UnexpectedMessage("too many KeyUpdates without data"));
                    }
                    let (seq, secrets) = self.kernel.update_rx()?;
                    self.rx = Keys::new(seq, secrets)?;
                    if request {
                        // Answered before our next record (RFC 8446 §4.6.3).
                        self.key_update.get_or_insert(false);
                    }
                }
                _ => {
                    return Err(Error::UnexpectedMessage(
                        "a handshake message after the handshake",
                    ));
                }
            }
            self.hs.drain(..4 + len);
        }
        if self.hs.is_empty() {
            self.hs = Vec::new();
        }
        Ok(())
    }

    /// Read more ciphertext; 0 at the transport's end.
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        let want = if self.read_ahead {
            READ_AHEAD
        } else {
            FIRST_READ
        };
        let record_rest = self.rbuf.get(..HEADER_LEN).map_or(0, |h| {
            usize::from(u16::from_be_bytes([h[3], h[4]])) + HEADER_LEN
        });
        let spare = self.rbuf.capacity() - self.rbuf.len();
        if spare < want / 4 || self.rbuf.len() + spare < record_rest {
            self.rbuf.reserve(want.max(record_rest));
        }
        let offered = self.rbuf.capacity() - self.rbuf.len();
        let n = ready!(poll_read_buf(Pin::new(&mut self.io), cx, &mut self.rbuf))?;
        self.read_ahead = n == offered || n >= FIRST_READ;
        Poll::Ready(Ok(n))
    }

    /// A fatal error on the read side: keep it, and tell the peer with an alert if we still may write.
    fn fail_read(&mut self, e: Error, cx: &mut Context<'_>) {
        let alert = match &e {
            Error::BadRecordMac => Some(20),
            Error::RecordOverflow => Some(22),
            Error::UnexpectedMessage(_) => Some(10),
            Error::Tls(_) | Error::Crypto | Error::UnsupportedSuite => Some(80),
            Error::Io(_) | Error::HandshakeEof | Error::PeerAlert(_) => None,
        };
        let e = io::Error::from(e);
        self.read_error = Some(Sticky::of(&e));
        if let Some(desc) = alert
            && !self.write_closed
            && self.write_error.is_none()
            && self.seal_record(ALERT, &[2, desc], 0).is_ok()
        {
            self.write_closed = true;
            let _ = self.poll_write_out(cx);
        }
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
        loop {
            if out.remaining() == 0 {
                return Poll::Ready(Ok(()));
            }
            if this.hand_out(out) {
                continue;
            }
            let delivered = out.filled().len() > before;
            if let Some(e) = &this.read_error {
                return Poll::Ready(if delivered { Ok(()) } else { Err(e.io()) });
            }
            if this.read_closed {
                return Poll::Ready(Ok(()));
            }
            match this.next_record() {
                Ok(true) => continue,
                Ok(false) => {}
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

// Writing.
impl<IO: AsyncRead + AsyncWrite + Unpin> TlsStream<IO> {
    /// Seal one record of `content_type` from `data` at the back of the output queue. `hint` is how many more
    /// bytes this write is about to seal: it decides between a reusable chunk and a buffer just large enough.
    fn seal_record(&mut self, content_type: u8, data: &[u8], hint: usize) -> Result<(), Error> {
        let len = record_len(data.len());
        if self.out.back().is_none_or(|c| c.buf.len() - c.end < len) {
            let buf = if hint + len > SMALL_WRITE || len > SMALL_WRITE {
                self.spare.pop().unwrap_or_else(|| vec![0u8; CHUNK])
            } else {
                vec![0u8; (hint + len + 64).min(SMALL_WRITE)]
            };
            self.out.push_back(Chunk {
                buf,
                start: 0,
                end: 0,
            });
        }
        let Some(chunk) = self.out.back_mut() else {
            return Err(Error::Crypto);
        };
        self.tx.seal(
            content_type,
            data,
            &mut chunk.buf[chunk.end..chunk.end + len],
        )?;
        chunk.end += len;
        self.queued += len;
        Ok(())
    }

    /// Seal one record as is and queue it (the fuzz target's peer).
    pub(crate) fn queue_raw(&mut self, content_type: u8, content: &[u8]) -> Result<(), Error> {
        self.seal_record(content_type, content, 0)
    }

    /// Send the pending `KeyUpdate`, or one of our own if the sending key is about to reach its limit.
    fn maybe_update_keys(&mut self) -> Result<(), Error> {
        let request = match self.key_update {
            Some(r) => r,
            None if self.tx.seq + 1 >= self.tx_limit => false,
            None => return Ok(()),
        };
        self.seal_record(HANDSHAKE, &[24, 0, 0, 1, u8::from(request)], 0)?;
        self.key_update = None;
        let (seq, secrets) = self.kernel.update_tx()?;
        self.tx = Keys::new(seq, secrets)?;
        Ok(())
    }

    /// Seal up to `limit` bytes from `bufs` as application data; returns how many were taken.
    fn seal_from(&mut self, bufs: &[IoSlice<'_>], limit: usize) -> Result<usize, Error> {
        let total = bufs.iter().map(|b| b.len()).sum::<usize>().min(limit);
        let (mut i, mut off, mut taken) = (0, 0, 0);
        let mut gather = std::mem::take(&mut self.gather);
        let r = (|| {
            while taken < total {
                self.maybe_update_keys()?;
                let n = MAX_PLAINTEXT.min(total - taken);
                while bufs[i].len() == off {
                    i += 1;
                    off = 0;
                }
                if bufs[i].len() - off >= n {
                    self.seal_record(APPLICATION_DATA, &bufs[i][off..off + n], total - taken)?;
                    off += n;
                } else {
                    gather.clear();
                    while gather.len() < n {
                        if bufs[i].len() == off {
                            i += 1;
                            off = 0;
                            continue;
                        }
                        let k = (bufs[i].len() - off).min(n - gather.len());
                        gather.extend_from_slice(&bufs[i][off..off + k]);
                        off += k;
                    }
                    self.seal_record(APPLICATION_DATA, &gather, total - taken)?;
                }
                taken += n;
            }
            Ok(())
        })();
        gather.clear();
        if gather.capacity() <= MAX_PLAINTEXT {
            self.gather = gather;
        }
        r.map(|()| taken)
    }

    /// Write queued records. Ready once everything is written or some progress was made; pending only when the
    /// transport took nothing.
    fn poll_write_out(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut progressed = false;
        while self.queued > 0 {
            let mut slices = [IoSlice::new(&[]); 16];
            let mut k = 0;
            for c in self
                .out
                .iter()
                .filter(|c| c.end > c.start)
                .take(slices.len())
            {
                slices[k] = IoSlice::new(&c.buf[c.start..c.end]);
                k += 1;
            }
            let mut n = match Pin::new(&mut self.io).poll_write_vectored(cx, &slices[..k]) {
                Poll::Pending if progressed => return Poll::Ready(Ok(())),
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Ready(Ok(0)) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Poll::Ready(Ok(n)) => n,
            };
            progressed = true;
            self.queued -= n;
            self.burst += n;
            while n > 0 {
                let Some(front) = self.out.front_mut() else {
                    break;
                };
                let step = n.min(front.end - front.start);
                front.start += step;
                n -= step;
                if front.start == front.end {
                    self.retire_front();
                }
            }
        }
        while self.out.front().is_some_and(|c| c.start == c.end) {
            self.retire_front();
        }
        if self.burst >= CHUNK {
            self.quiet_flushes = 0;
        } else if self.burst > 0 {
            self.quiet_flushes = self.quiet_flushes.saturating_add(1);
        }
        if self.quiet_flushes >= QUIET_FLUSHES || self.spare.is_empty() && self.quiet_flushes > 0 {
            // The connection is not moving bulk data (the end of one DATA frame alone is not enough to say so):
            // keep no buffers.
            self.spare.clear();
            self.out.clear();
            self.gather = Vec::new();
        }
        self.burst = 0;
        Poll::Ready(Ok(()))
    }

    fn retire_front(&mut self) {
        if let Some(c) = self.out.pop_front()
            && c.buf.len() == CHUNK
            && self.spare.len() < SPARE_CHUNKS
        {
            self.spare.push(c.buf);
        }
    }

    fn check_write(&self) -> io::Result<()> {
        match &self.write_error {
            Some(e) => Err(e.io()),
            None => Ok(()),
        }
    }

    fn fail_write(&mut self, e: io::Error) -> io::Error {
        self.write_error = Some(Sticky::of(&e));
        e
    }

    /// Write everything queued, then flush the transport.
    fn poll_flush_all(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.queued > 0 {
            if let Err(e) = ready!(self.poll_write_out(cx)) {
                return Poll::Ready(Err(self.fail_write(e)));
            }
        }
        Pin::new(&mut self.io).poll_flush(cx)
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

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a test panics to fail
mod tests {
    use std::sync::Arc;

    use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    async fn pair() -> (
        TlsStream<tokio::io::DuplexStream>,
        TlsStream<tokio::io::DuplexStream>,
    ) {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["node.test".to_string()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let mut roots = rustls::RootCertStore::empty();
        roots.add(cert.der().clone()).unwrap();
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let mut server = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![cert.der().clone()],
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
            )
            .unwrap();
        server.enable_secret_extraction = true;
        let mut client = rustls::ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        client.enable_secret_extraction = true;
        let (c, s) = tokio::io::duplex(64 * 1024);
        let name = ServerName::try_from("node.test").unwrap();
        let (a, b) = tokio::join!(
            crate::connect(Arc::new(client), name, c),
            crate::accept(Arc::new(server), s)
        );
        (a.unwrap(), b.unwrap())
    }

    #[tokio::test]
    async fn the_sending_key_is_replaced_before_it_reaches_its_limit() {
        let (mut a, mut b) = pair().await;
        a.tx_limit = a.tx.seq + 4;
        let data: Vec<u8> = (0..10 * MAX_PLAINTEXT).map(|i| (i % 253) as u8).collect();
        let mut got = vec![0u8; data.len()];
        let (w, r) = tokio::join!(
            async {
                a.write_all(&data).await?;
                a.flush().await
            },
            b.read_exact(&mut got)
        );
        w.unwrap();
        r.unwrap();
        assert!(got == data);
        // 10 data records under a limit of 4 per key: the key was replaced three times (each KeyUpdate is the
        // last record under its key), and the peer followed every time.
        assert!(a.tx.seq < 4, "{:?}", a.tx);
        assert_eq!(b.rx.seq, a.tx.seq);
    }

    #[tokio::test]
    async fn a_peer_that_floods_key_updates_without_data_is_cut_off() {
        let (mut a, mut b) = pair().await;
        for _ in 0..=MAX_KEY_UPDATES_IN_A_ROW {
            a.refresh_traffic_keys(false);
            a.flush().await.unwrap();
        }
        let err = b.read(&mut [0u8; 16]).await.unwrap_err();
        assert!(err.to_string().contains("too many KeyUpdates"), "{err}");
    }

    #[tokio::test]
    async fn records_after_close_notify_are_ignored() {
        let (mut a, mut b) = pair().await;
        a.write_all(b"before").await.unwrap();
        a.shutdown().await.unwrap();
        let mut got = Vec::new();
        b.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"before");
        assert!(
            a.write_all(b"after").await.is_err(),
            "no data after our close_notify"
        );
    }
}
