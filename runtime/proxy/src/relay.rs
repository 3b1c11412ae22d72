//! Copying bytes both ways between two streams: half-close passed through, byte counts kept live, idle timeout,
//! and prompt cancellation (drain, policy re-check).
//!
//! Bytes move as owned chunks ([`Bytes`]): a chunk read from an HBONE stream is the DATA frame h2 decoded, written
//! to the socket as is, and a chunk read from a socket is handed to h2 without another copy. Read buffers are not
//! zeroed and start small, growing only while reads fill them.

use std::future::Future;
use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use weft_hbone::{H2RecvHalf, H2SendHalf};

use crate::tracker::ConnControl;

/// Smallest and largest read: reads grow (×4) while they fill the buffer, so short-lived and idle connections stay
/// cheap and bulk transfers use large reads.
const MIN_BUF: usize = 4 * 1024;
const MAX_BUF: usize = 256 * 1024;

/// The read side of one end of a relay: yields owned chunks, `None` at EOF.
pub trait RelayRead: Send {
    /// The next chunk, read into `buf` (which has room for at least `want` bytes) or taken without copying from
    /// the stream's own buffers.
    fn read_chunk(
        &mut self,
        buf: &mut BytesMut,
        want: usize,
    ) -> impl Future<Output = io::Result<Option<Bytes>>> + Send;
}

/// The write side of one end of a relay.
pub trait RelayWrite: Send {
    /// Writes all of `data`.
    fn write_chunk(&mut self, data: Bytes) -> impl Future<Output = io::Result<()>> + Send;
    /// Half-closes (FIN, or END_STREAM).
    fn close(&mut self) -> impl Future<Output = io::Result<()>> + Send;
}

impl RelayRead for OwnedReadHalf {
    async fn read_chunk(&mut self, buf: &mut BytesMut, want: usize) -> io::Result<Option<Bytes>> {
        buf.reserve(want);
        let n = self.read_buf(buf).await?;
        Ok((n > 0).then(|| buf.split().freeze()))
    }
}

impl RelayRead for H2RecvHalf {
    async fn read_chunk(&mut self, _buf: &mut BytesMut, _want: usize) -> io::Result<Option<Bytes>> {
        H2RecvHalf::read_chunk(self).await
    }
}

impl RelayWrite for OwnedWriteHalf {
    async fn write_chunk(&mut self, data: Bytes) -> io::Result<()> {
        self.write_all(&data).await
    }

    async fn close(&mut self) -> io::Result<()> {
        self.shutdown().await
    }
}

impl RelayWrite for H2SendHalf {
    async fn write_chunk(&mut self, data: Bytes) -> io::Result<()> {
        self.send_bytes(data).await
    }

    async fn close(&mut self) -> io::Result<()> {
        self.shutdown().await
    }
}

/// Byte counters and last activity of one connection, readable while it runs.
#[derive(Debug)]
pub struct Counters {
    /// Bytes from the source to the destination.
    pub sent: AtomicU64,
    /// Bytes from the destination to the source.
    pub received: AtomicU64,
    start: Instant,
    last_ms: AtomicU64,
}

impl Default for Counters {
    fn default() -> Self {
        Self {
            sent: AtomicU64::new(0),
            received: AtomicU64::new(0),
            start: Instant::now(),
            last_ms: AtomicU64::new(0),
        }
    }
}

impl Counters {
    fn touch(&self) {
        let ms = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.store(ms, Ordering::Relaxed);
    }

    fn idle_for(&self) -> Duration {
        let now = self.start.elapsed();
        now.saturating_sub(Duration::from_millis(self.last_ms.load(Ordering::Relaxed)))
    }

    /// Time since the relay was created.
    pub fn elapsed(&self) -> Duration {
        self.start.elapsed()
    }
}

/// How a relay ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RelayEnd {
    /// Both sides finished (EOF both ways).
    Done,
    /// An I/O error on either side.
    Error(String),
    /// No byte either way for the idle timeout.
    Idle,
    /// Cancelled (drain or policy re-check).
    Cancelled,
}

async fn copy_half<R, W>(
    mut r: R,
    mut w: W,
    count: &AtomicU64,
    counters: &Counters,
) -> io::Result<()>
where
    R: RelayRead,
    W: RelayWrite,
{
    let mut buf = BytesMut::new();
    let mut want = MIN_BUF;
    loop {
        let Some(chunk) = r.read_chunk(&mut buf, want).await? else {
            w.close().await?;
            return Ok(());
        };
        let n = chunk.len();
        counters.touch();
        w.write_chunk(chunk).await?;
        count.fetch_add(n as u64, Ordering::Relaxed);
        if n >= want && want < MAX_BUF {
            want = (want * 4).min(MAX_BUF);
        }
    }
}

/// Copy `src` ⇄ `dst` (each given as read and write halves) until both directions finish, one fails, the
/// connection idles out, or `ctl` cancels it.
#[allow(clippy::too_many_arguments)]
pub async fn relay<SR, SW, DR, DW>(
    src_r: SR,
    src_w: SW,
    dst_r: DR,
    dst_w: DW,
    counters: Arc<Counters>,
    ctl: &ConnControl,
    idle_timeout: Duration,
) -> RelayEnd
where
    SR: RelayRead,
    SW: RelayWrite,
    DR: RelayRead,
    DW: RelayWrite,
{
    counters.touch();
    let up = copy_half(src_r, dst_w, &counters.sent, &counters);
    let down = copy_half(dst_r, src_w, &counters.received, &counters);
    let both = async {
        // Either direction failing ends the connection; a clean EOF lets the other direction finish.
        tokio::pin!(up, down);
        let (mut up_done, mut down_done) = (false, false);
        while !(up_done && down_done) {
            tokio::select! {
                r = &mut up, if !up_done => { r?; up_done = true; }
                r = &mut down, if !down_done => { r?; down_done = true; }
            }
        }
        Ok::<(), io::Error>(())
    };
    let idle = async {
        loop {
            let idle_for = counters.idle_for();
            if idle_for >= idle_timeout {
                return;
            }
            tokio::time::sleep(idle_timeout - idle_for).await;
        }
    };
    tokio::select! {
        r = both => match r {
            Ok(()) => RelayEnd::Done,
            Err(e) => RelayEnd::Error(e.to_string()),
        },
        () = idle => RelayEnd::Idle,
        () = ctl.cancel.cancelled() => RelayEnd::Cancelled,
    }
}
