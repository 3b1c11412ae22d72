//! `H2Stream`: one HBONE tunnel (an HTTP/2 CONNECT stream) as `AsyncRead + AsyncWrite`.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::{Buf, Bytes};
use h2::{Reason, RecvStream, SendStream};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::counter::StreamDropGuard;

/// Unreleased received bytes are handed back to the peer's flow-control window in batches of at
/// least this size (or when a received chunk is fully consumed), not on every small read.
const RELEASE_BATCH: usize = 128 * 1024;

/// Converts an h2 error into an `io::Error`, keeping the h2 error as the inner source so callers
/// can recover the reset reason with `get_ref()` and `downcast_ref::<h2::Error>()`.
pub(crate) fn h2_to_io(e: h2::Error) -> io::Error {
    if e.is_io() {
        return match e.into_io() {
            Some(io) => io,
            None => io::Error::other("h2 transport error"),
        };
    }
    let kind = if e.is_reset() {
        io::ErrorKind::ConnectionReset
    } else if e.is_go_away() {
        io::ErrorKind::ConnectionAborted
    } else {
        io::ErrorKind::Other
    };
    io::Error::new(kind, e)
}

/// The `io::Error` for a stream reset with `reason` (as reported by `poll_reset`).
fn reset_to_io(reason: Reason) -> io::Error {
    io::Error::new(io::ErrorKind::ConnectionReset, h2::Error::from(reason))
}

/// The receiving half of an [`H2Stream`]: DATA frames from the peer, EOF on its END_STREAM.
pub struct H2RecvHalf {
    recv: RecvStream,
    /// The chunk being read from; bytes are copied out of it and never reallocated.
    buf: Bytes,
    /// Bytes consumed by the reader but not yet released to the peer's window.
    unreleased: usize,
    eof: bool,
    _guard: Option<Arc<StreamDropGuard>>,
}

/// The sending half of an [`H2Stream`]: DATA frames to the peer; shutdown sends END_STREAM.
///
/// Dropping it sends nothing by itself (unlike tokio's `OwnedWriteHalf`, it does not
/// half-close): shut it down first. Once both halves are gone, a stream not ended in both
/// directions is reset.
pub struct H2SendHalf {
    send: SendStream<Bytes>,
    chunk: usize,
    shutdown: bool,
    _guard: Option<Arc<StreamDropGuard>>,
}

/// An open HBONE tunnel: the body of an accepted HTTP/2 CONNECT, as a bidirectional byte
/// stream.
///
/// - Reading yields the peer's DATA frames and returns EOF (`Ok` with nothing read) on the peer's
///   END_STREAM. Flow-control capacity is released as the reader consumes the bytes, so a slow
///   reader back-pressures the peer. A RST_STREAM or a dead connection is an `io::Error`
///   (`ConnectionReset` for resets, with the `h2::Error` as its inner error).
/// - Writing reserves HTTP/2 send capacity and waits for it (`poll_capacity`), so at most
///   `H2Config::max_send_buffer_size` (server) or `client_max_send_buffer_size` (client) bytes
///   queue per stream; each write sends at most one
///   chunk of `min(len, capacity, max_frame_size)` bytes.
/// - `poll_shutdown` sends END_STREAM: a half-close; reading keeps working until the peer closes
///   its side too. `poll_flush` is a no-op: the connection task writes queued frames.
/// - Dropping the stream aborts it unless both sides have ended: RST_STREAM `CANCEL` (and
///   DATA not yet flushed is discarded), or `NO_ERROR` from a server that already sent
///   END_STREAM (its queued DATA is still delivered). Shut down, and read to EOF, before
///   dropping to deliver everything.
pub struct H2Stream {
    recv: H2RecvHalf,
    send: H2SendHalf,
}

impl H2Stream {
    pub(crate) fn new(
        send: SendStream<Bytes>,
        recv: RecvStream,
        guard: Option<StreamDropGuard>,
        chunk: usize,
    ) -> Self {
        let guard = guard.map(Arc::new);
        Self {
            recv: H2RecvHalf {
                recv,
                buf: Bytes::new(),
                unreleased: 0,
                eof: false,
                _guard: guard.clone(),
            },
            send: H2SendHalf {
                send,
                chunk: chunk.max(1),
                shutdown: false,
                _guard: guard,
            },
        }
    }

    /// Splits into independently owned halves (no lock between them, unlike `tokio::io::split`).
    pub fn into_split(self) -> (H2RecvHalf, H2SendHalf) {
        (self.recv, self.send)
    }

    /// The HTTP/2 stream id.
    pub fn stream_id(&self) -> u32 {
        self.send.stream_id()
    }

    /// Aborts the stream with RST_STREAM `reason` (for example when the proxied TCP connection was
    /// reset). Both directions end; further reads and writes fail.
    pub fn reset(&mut self, reason: Reason) {
        self.send.reset(reason);
    }

    /// Next chunk of received bytes without copying, or `None` at EOF. See
    /// [`H2RecvHalf::poll_read_chunk`].
    pub fn poll_read_chunk(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<Option<Bytes>>> {
        self.recv.poll_read_chunk(cx)
    }
}

impl H2RecvHalf {
    /// Next chunk of received bytes without copying, or `None` at EOF. The chunk's flow-control
    /// capacity is released at once: the caller takes ownership of the bytes.
    pub fn poll_read_chunk(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<Option<Bytes>>> {
        if self.buf.is_empty() {
            ready!(self.poll_fill(cx))?;
        }
        if self.buf.is_empty() {
            return Poll::Ready(Ok(None));
        }
        let chunk = std::mem::take(&mut self.buf);
        self.consumed(chunk.len());
        Poll::Ready(Ok(Some(chunk)))
    }

    /// Async form of [`poll_read_chunk`](Self::poll_read_chunk).
    pub async fn read_chunk(&mut self) -> io::Result<Option<Bytes>> {
        std::future::poll_fn(|cx| self.poll_read_chunk(cx)).await
    }

    /// Waits until `self.buf` holds bytes or EOF/error is reached.
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.buf.is_empty() && !self.eof {
            match ready!(self.recv.poll_data(cx)) {
                Some(Ok(chunk)) => self.buf = chunk,
                Some(Err(e)) => {
                    self.flush_release();
                    return Poll::Ready(Err(h2_to_io(e)));
                }
                None => {
                    self.eof = true;
                    self.flush_release();
                }
            }
        }
        Poll::Ready(Ok(()))
    }

    fn consumed(&mut self, n: usize) {
        self.unreleased += n;
        if self.buf.is_empty() || self.unreleased >= RELEASE_BATCH {
            self.flush_release();
        }
    }

    fn flush_release(&mut self) {
        if self.unreleased > 0 {
            // Fails only once the stream is gone, when the capacity no longer matters.
            let _ = self.recv.flow_control().release_capacity(self.unreleased);
            self.unreleased = 0;
        }
    }
}

impl Drop for H2RecvHalf {
    fn drop(&mut self) {
        // Return the window of everything received but not yet released (read or not), so the
        // connection window does not shrink while the send half lives on.
        self.unreleased += self.buf.len();
        self.buf = Bytes::new();
        self.flush_release();
    }
}

impl AsyncRead for H2RecvHalf {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if out.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        ready!(this.poll_fill(cx))?;
        let n = out.remaining().min(this.buf.len());
        if n > 0 {
            out.put_slice(&this.buf[..n]);
            this.buf.advance(n);
            this.consumed(n);
        }
        Poll::Ready(Ok(()))
    }
}

impl H2SendHalf {
    /// The HTTP/2 stream id.
    pub fn stream_id(&self) -> u32 {
        self.send.stream_id().as_u32()
    }

    /// Aborts the stream with RST_STREAM `reason`.
    pub fn reset(&mut self, reason: Reason) {
        self.shutdown = true;
        self.send.send_reset(reason);
    }

    /// Sends a prefix of `data` without copying it, as much as flow control allows now (at most
    /// one chunk), advancing `data` past what was sent.
    pub fn poll_send_bytes(
        &mut self,
        cx: &mut Context<'_>,
        data: &mut Bytes,
    ) -> Poll<io::Result<usize>> {
        let n = ready!(self.poll_reserve(cx, data.len()))?;
        if n == 0 {
            return Poll::Ready(Ok(0));
        }
        let chunk = data.split_to(n);
        Poll::Ready(self.send_chunk(cx, chunk))
    }

    /// Sends all of `data` without copying it, waiting for flow-control capacity as needed.
    pub async fn send_bytes(&mut self, mut data: Bytes) -> io::Result<()> {
        while !data.is_empty() {
            std::future::poll_fn(|cx| self.poll_send_bytes(cx, &mut data)).await?;
        }
        Ok(())
    }

    /// Waits for send capacity for up to `len` bytes; returns how many may be sent now (> 0
    /// unless `len` is 0).
    fn poll_reserve(&mut self, cx: &mut Context<'_>, len: usize) -> Poll<io::Result<usize>> {
        if self.shutdown {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "hbone stream already shut down for writing",
            )));
        }
        if len == 0 {
            return Poll::Ready(Ok(0));
        }
        let want = len.min(self.chunk);
        // Total requested capacity is `want` beyond what is already buffered in h2.
        self.send.reserve_capacity(want);
        loop {
            let cap = self.send.capacity();
            if cap > 0 {
                return Poll::Ready(Ok(cap.min(want)));
            }
            // Edge-triggered: Ready once capacity was assigned since the last call.
            match ready!(self.send.poll_capacity(cx)) {
                Some(Ok(_)) => continue,
                Some(Err(e)) => return self.poll_write_error(cx, Some(e)),
                None => return self.poll_write_error(cx, None),
            }
        }
    }

    fn send_chunk(&mut self, cx: &mut Context<'_>, chunk: Bytes) -> io::Result<usize> {
        let n = chunk.len();
        match self.send.send_data(chunk, false) {
            Ok(()) => Ok(n),
            Err(e) => match self.poll_write_error::<()>(cx, Some(e)) {
                Poll::Ready(Err(e)) => Err(e),
                _ => Err(io::ErrorKind::BrokenPipe.into()),
            },
        }
    }

    /// The error to report once the send side is unusable: the peer's reset reason if any.
    fn poll_write_error<T>(
        &mut self,
        cx: &mut Context<'_>,
        e: Option<h2::Error>,
    ) -> Poll<io::Result<T>> {
        let err = match self.send.poll_reset(cx) {
            Poll::Ready(Ok(reason)) => reset_to_io(reason),
            Poll::Ready(Err(e)) => h2_to_io(e),
            Poll::Pending => match e {
                Some(e) => h2_to_io(e),
                None => io::Error::new(io::ErrorKind::BrokenPipe, "hbone stream closed"),
            },
        };
        Poll::Ready(Err(err))
    }
}

impl AsyncWrite for H2SendHalf {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let n = ready!(this.poll_reserve(cx, buf.len()))?;
        if n == 0 {
            return Poll::Ready(Ok(0));
        }
        Poll::Ready(this.send_chunk(cx, Bytes::copy_from_slice(&buf[..n])))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.shutdown {
            return Poll::Ready(Ok(()));
        }
        match this.send.send_data(Bytes::new(), true) {
            Ok(()) => {
                this.shutdown = true;
                Poll::Ready(Ok(()))
            }
            Err(e) => match this.send.poll_reset(cx) {
                // The peer already ended the stream cleanly: nothing left to close.
                Poll::Ready(Ok(Reason::NO_ERROR)) => {
                    this.shutdown = true;
                    Poll::Ready(Ok(()))
                }
                Poll::Ready(Ok(reason)) => Poll::Ready(Err(reset_to_io(reason))),
                Poll::Ready(Err(e)) => Poll::Ready(Err(h2_to_io(e))),
                Poll::Pending => Poll::Ready(Err(h2_to_io(e))),
            },
        }
    }
}

impl AsyncRead for H2Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().recv).poll_read(cx, out)
    }
}

impl AsyncWrite for H2Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().send).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().send).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().send).poll_shutdown(cx)
    }
}

impl std::fmt::Debug for H2RecvHalf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("H2RecvHalf")
            .field("stream_id", &self.recv.stream_id().as_u32())
            .field("buffered", &self.buf.len())
            .field("eof", &self.eof)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for H2SendHalf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("H2SendHalf")
            .field("stream_id", &self.stream_id())
            .field("shutdown", &self.shutdown)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for H2Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("H2Stream")
            .field("stream_id", &self.stream_id())
            .finish_non_exhaustive()
    }
}
