//! An in-memory byte stream for the protocol targets: reads come from the fuzz input (in chunks of a chosen size,
//! so partial frames are exercised), then EOF; writes are kept (up to a cap) for the target to check.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Most bytes of output kept; the rest is counted only.
const KEEP: usize = 64 * 1024;

/// Reads `input` (at most `chunk` bytes per read), then EOF; collects what is written.
#[derive(Debug)]
pub struct MemStream {
    input: Vec<u8>,
    pos: usize,
    chunk: usize,
    /// The first bytes written (up to 64 KiB).
    pub written: Vec<u8>,
    /// Total bytes written.
    pub written_total: usize,
}

impl MemStream {
    /// A stream that yields `input` in reads of at most `chunk` (≥ 1) bytes.
    pub fn new(input: Vec<u8>, chunk: usize) -> Self {
        Self {
            input,
            pos: 0,
            chunk: chunk.max(1),
            written: Vec::new(),
            written_total: 0,
        }
    }

    /// Bytes of the input consumed so far.
    pub fn consumed(&self) -> usize {
        self.pos
    }
}

impl AsyncRead for MemStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let n = (self.input.len() - self.pos)
            .min(self.chunk)
            .min(buf.remaining());
        let start = self.pos;
        buf.put_slice(&self.input[start..start + n]);
        self.pos += n;
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for MemStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let keep = KEEP.saturating_sub(self.written.len()).min(buf.len());
        self.written.extend_from_slice(&buf[..keep]);
        self.written_total += buf.len();
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}
