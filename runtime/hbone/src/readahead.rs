//! A read-ahead buffer under a TLS session: one socket read serves many of the TLS library's small reads.
//!
//! rustls asks its transport for at most 4 KiB per read, so a 16 KiB TLS record costs four `recvfrom`
//! calls (and as many trips through the reactor). Under a bulk transfer that is a large share of the
//! proxy's CPU. [`ReadAhead`] sits between the socket and the TLS session. Reads go straight into
//! the caller's buffer until one fills it (more is likely waiting); then the next reads up to
//! [`READ_AHEAD`] bytes from the socket at once and hands them out from memory, for as long as the
//! socket has more than the caller asks for. Small messages so cost no allocation and no copy, and a
//! caller that asks for at least [`READ_AHEAD`] always reads the socket directly. Writes pass straight
//! through.
//!
//! A read ahead asks for up to 1 MiB, so a bulk transfer drains its socket in few reads and the
//! receiving node opens its peer's TCP window sooner. In the mesh bench (one flow through two
//! nodes, 6 rounds of 2 GiB, twice, the build before as `weft-base`), reading ahead 1 MiB against
//! 64 KiB: 1.11× and 1.15× the throughput at 0.97× and 0.94× the CPU per GiB, the machine 16–17 %
//! idle instead of 24 % (the sending node waits less for its window). A read ahead that grew from
//! 64 KiB to 1 MiB while reads filled it came out at 0.96–0.98× a fixed 1 MiB.
//!
//! The buffer is allocated (not zeroed) for each socket read that needs it and given back once it has
//! been handed out entirely, so an idle connection holds none; a busy one holds at most
//! [`READ_AHEAD`] bytes here while it is reading ahead.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, ReadBuf};
use tokio_util::io::poll_read_buf;

/// Bytes asked of the socket by one read ahead.
pub const READ_AHEAD: usize = 1024 * 1024;

/// A byte stream with a read-ahead buffer (see this module's documentation).
#[derive(Debug)]
pub struct ReadAhead<S> {
    io: S,
    /// Bytes read from `io` and not yet handed out; `None` while there are none.
    buf: Option<BytesMut>,
    /// The last socket read filled all the room it had: more is likely waiting, so the next read
    /// goes through the buffer.
    ahead: bool,
}

impl<S> ReadAhead<S> {
    /// Wrap `io`; no buffer is allocated until reads show bytes are coming faster than asked for.
    pub fn new(io: S) -> Self {
        Self {
            io,
            buf: None,
            ahead: false,
        }
    }

    /// The wrapped stream.
    pub fn get_ref(&self) -> &S {
        &self.io
    }

    /// The wrapped stream, mutably. Reading from it directly skips what is buffered.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.io
    }

    /// Bytes read from the stream and not yet handed out.
    pub fn buffered(&self) -> usize {
        self.buf.as_ref().map_or(0, BytesMut::len)
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for ReadAhead<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let want = out.remaining();
        let mut buf = match this.buf.take() {
            Some(b) => b,
            None if !this.ahead || want >= READ_AHEAD => {
                // Small messages (nothing more waiting) and large reads gain nothing from the
                // buffer: straight into the caller's, with no allocation and no copy.
                let before = out.filled().len();
                ready!(Pin::new(&mut this.io).poll_read(cx, out))?;
                let n = out.filled().len() - before;
                this.ahead = n == want && want > 0 && want < READ_AHEAD;
                return Poll::Ready(Ok(()));
            }
            None => {
                // Not zeroed: `poll_read_buf` fills the spare capacity it is given.
                let mut b = BytesMut::with_capacity(READ_AHEAD);
                let n = ready!(poll_read_buf(Pin::new(&mut this.io), cx, &mut b))?;
                // Keep reading ahead only while the socket has more than the caller asks for.
                this.ahead = n > want;
                if n == 0 {
                    return Poll::Ready(Ok(()));
                }
                b
            }
        };
        let n = want.min(buf.len());
        out.put_slice(&buf[..n]);
        buf.advance(n);
        if !buf.is_empty() {
            this.buf = Some(buf);
        }
        // Handed out entirely: the buffer is given back, so a connection that waits holds none.
        Poll::Ready(Ok(()))
    }
}

write_through!(ReadAhead);

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A stream that serves scripted chunks, one per read (cut to the caller's space), and counts reads.
    struct Script {
        chunks: VecDeque<Vec<u8>>,
        reads: usize,
        asked: Vec<usize>,
    }

    impl AsyncRead for Script {
        fn poll_read(
            mut self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
            out: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            self.reads += 1;
            let room = out.remaining();
            self.asked.push(room);
            if let Some(mut c) = self.chunks.pop_front() {
                if c.len() > room {
                    let rest = c.split_off(room);
                    self.chunks.push_front(rest);
                }
                out.put_slice(&c);
            }
            Poll::Ready(Ok(()))
        }
    }

    fn script(chunks: Vec<Vec<u8>>) -> Script {
        Script {
            chunks: chunks.into(),
            reads: 0,
            asked: Vec::new(),
        }
    }

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31) ^ seed)
            .collect()
    }

    #[tokio::test]
    async fn small_reads_are_served_from_one_socket_read() {
        let data = pattern(READ_AHEAD, 7);
        let mut ra = ReadAhead::new(script(vec![data.clone()]));
        let mut got = Vec::new();
        let mut chunk = [0u8; 4096];
        while got.len() < data.len() {
            let n = ra.read(&mut chunk).await.unwrap();
            assert!(n > 0);
            got.extend_from_slice(&chunk[..n]);
        }
        assert_eq!(got, data);
        assert_eq!(
            ra.get_ref().reads,
            2,
            "256 reads of 4 KiB: the first straight from the socket, the other 255 from one read ahead"
        );
        assert_eq!(ra.get_ref().asked, vec![4096, READ_AHEAD]);
        assert!(ra.buf.is_none(), "a drained buffer is given back");
    }

    #[tokio::test]
    async fn bytes_arrive_in_order_across_short_and_full_socket_reads() {
        let chunks = vec![
            pattern(100, 1),
            pattern(READ_AHEAD + 5000, 2),
            pattern(1, 3),
            pattern(9000, 4),
        ];
        let all: Vec<u8> = chunks.concat();
        let mut ra = ReadAhead::new(script(chunks));
        let mut got = Vec::new();
        let mut chunk = [0u8; 3000];
        loop {
            let n = ra.read(&mut chunk).await.unwrap();
            if n == 0 {
                break;
            }
            got.extend_from_slice(&chunk[..n]);
        }
        assert_eq!(got, all);
        assert!(ra.buf.is_none(), "end of stream gives the buffer back");
    }

    #[tokio::test]
    async fn a_drained_short_read_frees_the_buffer_and_a_large_read_bypasses_it() {
        let mut ra = ReadAhead::new(script(vec![pattern(10, 1), pattern(READ_AHEAD * 2, 2)]));
        let mut small = [0u8; 4096];
        assert_eq!(ra.read(&mut small).await.unwrap(), 10);
        assert!(ra.buf.is_none(), "an idle connection holds no buffer");
        assert_eq!(ra.buffered(), 0);
        let mut big = vec![0u8; READ_AHEAD * 2];
        let n = ra.read(&mut big).await.unwrap();
        assert_eq!(n, READ_AHEAD * 2);
        assert_eq!(big, pattern(READ_AHEAD * 2, 2));
        assert_eq!(
            ra.get_ref().asked,
            vec![4096, READ_AHEAD * 2],
            "both reads went straight to the socket"
        );
        assert!(ra.buf.is_none());
    }

    #[tokio::test]
    async fn small_messages_are_read_straight_into_the_callers_buffer() {
        let chunks: Vec<Vec<u8>> = (0..20).map(|i| pattern(100 + i, i as u8)).collect();
        let all = chunks.concat();
        let mut ra = ReadAhead::new(script(chunks));
        let mut got = Vec::new();
        let mut chunk = [0u8; 4096];
        for _ in 0..20 {
            let n = ra.read(&mut chunk).await.unwrap();
            got.extend_from_slice(&chunk[..n]);
            assert!(ra.buf.is_none() && !ra.ahead, "no buffer for a short read");
        }
        assert_eq!(got, all);
        assert_eq!(
            ra.get_ref().asked,
            vec![4096; 20],
            "every read was the caller's own"
        );
    }

    #[tokio::test]
    async fn reading_ahead_stops_once_the_socket_has_no_more_than_asked() {
        // 4 KiB fills the first read; a full read ahead; then a short one ends reading ahead.
        let chunks = vec![
            pattern(4096, 1),
            pattern(READ_AHEAD, 2),
            pattern(3000, 3),
            pattern(50, 4),
        ];
        let all = chunks.concat();
        let mut ra = ReadAhead::new(script(chunks));
        let mut got = Vec::new();
        let mut chunk = [0u8; 4096];
        while got.len() < all.len() {
            let n = ra.read(&mut chunk).await.unwrap();
            got.extend_from_slice(&chunk[..n]);
        }
        assert_eq!(got, all);
        assert_eq!(
            ra.get_ref().asked,
            vec![4096, READ_AHEAD, READ_AHEAD, 4096],
            "direct, ahead, ahead (short: stop), direct"
        );
        assert!(!ra.ahead && ra.buf.is_none());
    }

    #[tokio::test]
    async fn reads_and_writes_through_a_real_socket_pair() {
        let (a, b) = tokio::io::duplex(1 << 20);
        let mut ra = ReadAhead::new(a);
        let mut b = b;
        let sent = pattern(200_000, 9);
        let writer = {
            let sent = sent.clone();
            tokio::spawn(async move {
                b.write_all(&sent).await.unwrap();
                b.shutdown().await.unwrap();
                let mut back = Vec::new();
                b.read_to_end(&mut back).await.unwrap();
                back
            })
        };
        let mut got = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            let n = ra.read(&mut chunk).await.unwrap();
            if n == 0 {
                break;
            }
            got.extend_from_slice(&chunk[..n]);
        }
        assert_eq!(got, sent);
        ra.write_all(b"thanks").await.unwrap();
        ra.shutdown().await.unwrap();
        assert_eq!(writer.await.unwrap(), b"thanks");
    }
}
