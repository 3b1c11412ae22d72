//! The write side of a [`TlsStream`]: records sealed from the caller's buffers into reusable output chunks, key
//! updates, and the vectored writes that send them.

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite};

use super::{
    CHUNK, Chunk, GATHER_BELOW, QUIET_FLUSHES, SMALL_WRITE, SPARE_CHUNKS, Sticky, TlsStream,
    WRITE_SLICES,
};
use crate::Error;
use crate::record::{APPLICATION_DATA, HANDSHAKE, MAX_PLAINTEXT, SealKeys, record_len};

impl<IO: AsyncRead + AsyncWrite + Unpin> TlsStream<IO> {
    /// Seal one record of `content_type` from `data` at the back of the output queue, after a `KeyUpdate` if the
    /// sending key is about to reach its limit (for every record: data, alerts, `close_notify`). `hint` is how
    /// many more bytes this write is about to seal: it decides between a reusable chunk and a buffer just large
    /// enough.
    pub(crate) fn seal_record(
        &mut self,
        content_type: u8,
        data: &[u8],
        hint: usize,
    ) -> Result<(), Error> {
        if self.tx.seq + 1 >= self.tx_limit {
            let request = self.key_update.take().unwrap_or(false);
            self.send_key_update(request)?;
        }
        self.seal_one(content_type, data, hint)
    }

    /// Seal one record under the current key, as is.
    fn seal_one(&mut self, content_type: u8, data: &[u8], hint: usize) -> Result<(), Error> {
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

    /// Send the pending `KeyUpdate` (ours, or the answer to the peer's request), if any.
    pub(super) fn maybe_update_keys(&mut self) -> Result<(), Error> {
        match self.key_update.take() {
            Some(request) => self.send_key_update(request),
            None => Ok(()),
        }
    }

    /// Seal a `KeyUpdate` (the last record under the current key) and move to the next sending key.
    fn send_key_update(&mut self, request: bool) -> Result<(), Error> {
        self.seal_one(HANDSHAKE, &[24, 0, 0, 1, u8::from(request)], 0)?;
        let (seq, secrets) = self.kernel.update_tx()?;
        self.tx = SealKeys::new(seq, secrets)?;
        Ok(())
    }

    /// Seal up to `limit` bytes from `bufs` as application data; returns how many were taken.
    ///
    /// A record is sealed where its bytes are whenever they lie in one slice. Where a slice ends inside a record,
    /// a long slice's end is sealed as a shorter record of its own, so no bulk payload is copied before sealing;
    /// only pieces shorter than [`GATHER_BELOW`] (an HTTP/2 frame's head, say) are gathered with what follows, up
    /// to the next long slice, which starts a record of its own.
    pub(super) fn seal_from(&mut self, bufs: &[IoSlice<'_>], limit: usize) -> Result<usize, Error> {
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
                let rest = bufs[i].len() - off;
                if rest >= n.min(GATHER_BELOW) {
                    let k = rest.min(n);
                    self.seal_record(APPLICATION_DATA, &bufs[i][off..off + k], total - taken)?;
                    off += k;
                    taken += k;
                    continue;
                }
                gather.clear();
                while gather.len() < n {
                    if bufs[i].len() == off {
                        i += 1;
                        off = 0;
                        continue;
                    }
                    let (avail, want) = (bufs[i].len() - off, n - gather.len());
                    if !gather.is_empty() && avail >= GATHER_BELOW && want >= GATHER_BELOW {
                        break;
                    }
                    let k = avail.min(want);
                    gather.extend_from_slice(&bufs[i][off..off + k]);
                    off += k;
                }
                self.seal_record(APPLICATION_DATA, &gather, total - taken)?;
                taken += gather.len();
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
    pub(super) fn poll_write_out(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut progressed = false;
        while self.queued > 0 {
            let mut slices = [IoSlice::new(&[]); WRITE_SLICES];
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
            self.gather = Vec::new();
        }
        self.burst = 0;
        Poll::Ready(Ok(()))
    }

    pub(super) fn retire_front(&mut self) {
        if let Some(c) = self.out.pop_front()
            && c.buf.len() == CHUNK
            && self.spare.len() < SPARE_CHUNKS
        {
            self.spare.push(c.buf);
        }
    }

    /// Close the write side at once (after the peer's fatal alert): what is queued is dropped, and nothing more is
    /// sealed.
    pub(super) fn close_write(&mut self) {
        self.write_closed = true;
        self.key_update = None;
        self.out.clear();
        self.queued = 0;
    }

    pub(super) fn check_write(&self) -> io::Result<()> {
        match &self.write_error {
            Some(e) => Err(e.io()),
            None => Ok(()),
        }
    }

    pub(super) fn fail_write(&mut self, e: io::Error) -> io::Error {
        self.write_error = Some(Sticky::of(&e));
        e
    }

    /// Write everything queued, then flush the transport.
    pub(super) fn poll_flush_all(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.queued > 0 {
            if let Err(e) = ready!(self.poll_write_out(cx)) {
                return Poll::Ready(Err(self.fail_write(e)));
            }
        }
        Pin::new(&mut self.io).poll_flush(cx)
    }
}
