//! Copying bytes both ways between two streams: half-close passed through, byte counts kept live, idle timeout,
//! and prompt cancellation (drain, policy re-check).

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::tracker::ConnControl;

/// Smallest and largest copy buffer: buffers grow when reads fill them, so idle connections stay cheap and
/// bulk transfers use large reads.
const MIN_BUF: usize = 16 * 1024;
const MAX_BUF: usize = 256 * 1024;

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
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; MIN_BUF];
    loop {
        let n = r.read(&mut buf).await?;
        if n == 0 {
            w.shutdown().await?;
            return Ok(());
        }
        counters.touch();
        w.write_all(&buf[..n]).await?;
        w.flush().await?;
        count.fetch_add(n as u64, Ordering::Relaxed);
        if n == buf.len() && buf.len() < MAX_BUF {
            buf.resize((buf.len() * 4).min(MAX_BUF), 0);
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
    SR: AsyncRead + Unpin,
    SW: AsyncWrite + Unpin,
    DR: AsyncRead + Unpin,
    DW: AsyncWrite + Unpin,
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
