//! Copying bytes both ways between two streams: half-close passed through, byte counts kept live, idle timeout,
//! and prompt cancellation (drain, policy re-check).
//!
//! Bytes move as owned chunks ([`Bytes`]): a chunk read from an HBONE stream is the DATA frame h2 decoded, written
//! to the socket as is, and a chunk read from a socket is handed to h2 without another copy. Read buffers are not
//! zeroed and start small, growing only while reads fill them; a socket read reserves its buffer only once the
//! socket is readable, and a small connection drops it after a short read, so an idle connection holds none.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::Poll;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::AsyncWriteExt;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::time::Instant;
use weft_hbone::{H2RecvHalf, H2SendHalf};

use crate::tracker::ConnControl;

/// Smallest and largest read: reads grow (×4) while they fill the buffer, so short-lived and idle connections stay
/// cheap and bulk transfers use large reads. A read from a socket becomes one DATA frame (h2's frame size is 1 MiB),
/// so 1 MiB reads let a bulk flow go out in large frames, each sealed and written at once (see
/// [`weft_tls::SEND_BUFFER`] for what that measured).
const MIN_BUF: usize = 4 * 1024;
const MAX_BUF: usize = 1024 * 1024;

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
    /// Waits until the socket is readable before it reserves room, so a connection waiting for bytes holds no
    /// read buffer (what 10,000 idle connections cost is then the kernel's, not ours).
    ///
    /// The read goes through `AsyncRead` (polled once, with this task's context), not `try_read`: tokio's
    /// `poll_read` clears the socket's readiness after a short read, so the next wait goes straight to epoll instead
    /// of through a read that finds nothing (one `EAGAIN` system call less per exchange, on both nodes). A pending
    /// read (a spurious readiness, or the task's cooperative budget used up: then tokio holds reads back though the
    /// socket is readable) gives the room back and yields before waiting again; looping straight back to the
    /// readiness wait, which does not count against the budget, would spin.
    async fn read_chunk(&mut self, buf: &mut BytesMut, want: usize) -> io::Result<Option<Bytes>> {
        loop {
            self.readable().await?;
            buf.reserve(want);
            let polled = std::future::poll_fn(|cx| {
                Poll::Ready(
                    match tokio_util::io::poll_read_buf(Pin::new(&mut *self), cx, buf) {
                        Poll::Ready(r) => Some(r),
                        Poll::Pending => None,
                    },
                )
            })
            .await;
            match polled {
                Some(Ok(n)) => return Ok((n > 0).then(|| buf.split().freeze())),
                Some(Err(e)) => return Err(e),
                None => {
                    *buf = BytesMut::new();
                    tokio::task::yield_now().await;
                }
            }
        }
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

/// Byte counters and last activity of one connection, readable while it runs. Times come from tokio's clock, so
/// the idle timeout follows a paused test clock.
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

/// One direction: `r` to `w` until EOF (then half-close `w`) or an error.
///
/// Built as a plain function around an `async move` block, not an `async fn`: an `async fn` keeps its arguments
/// twice in its state (once as passed, once moved into its body), and this state is held for the connection's whole
/// life.
#[allow(clippy::manual_async_fn)] // an `async fn` would hold its arguments twice (see above)
fn copy_half<'a, R, W>(
    mut r: R,
    mut w: W,
    count: &'a AtomicU64,
    counters: &'a Counters,
) -> impl Future<Output = io::Result<()>> + Send + 'a
where
    R: RelayRead + 'a,
    W: RelayWrite + 'a,
{
    async move {
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
            } else if want == MIN_BUF {
                // A short read at the smallest size: the socket is drained and the connection is likely to wait,
                // so do not keep the buffer through the wait (the next read allocates once the socket is
                // readable).
                buf = BytesMut::new();
            }
        }
    }
}

pin_project_lite::pin_project! {
    /// A running relay: both directions, the idle timer and the cancel, each stored once. (An `async` body that
    /// built the two directions and then pinned them would hold each twice, and the relay's state lives as long as
    /// the connection.)
    #[must_use = "a relay does nothing unless awaited"]
    pub struct Relay<B, I, C> {
        #[pin]
        both: B,
        #[pin]
        idle: I,
        #[pin]
        cancelled: C,
    }
}

impl<B, I, C> Future for Relay<B, I, C>
where
    B: Future<Output = io::Result<((), ())>>,
    I: Future<Output = ()>,
    C: Future<Output = ()>,
{
    type Output = RelayEnd;

    /// A cancel is looked at first, so a drain or a denying re-check ends a busy connection as promptly as an idle
    /// one; then the copying; then the idle timer.
    fn poll(self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<RelayEnd> {
        let this = self.project();
        if this.cancelled.poll(cx).is_ready() {
            return Poll::Ready(RelayEnd::Cancelled);
        }
        if let Poll::Ready(r) = this.both.poll(cx) {
            return Poll::Ready(match r {
                Ok(_) => RelayEnd::Done,
                Err(e) => RelayEnd::Error(e.to_string()),
            });
        }
        match this.idle.poll(cx) {
            Poll::Ready(()) => Poll::Ready(RelayEnd::Idle),
            Poll::Pending => Poll::Pending,
        }
    }
}

/// Copy `src` ⇄ `dst` (each given as read and write halves) until both directions finish, one fails, the
/// connection idles out, or `ctl` cancels it. Either direction failing ends the connection; a clean EOF lets the
/// other direction finish.
///
/// The future is built here, not in an `async fn`: its parts are moved into it once (see [`Relay`]).
#[allow(clippy::too_many_arguments)]
pub fn relay<'a, SR, SW, DR, DW>(
    src_r: SR,
    src_w: SW,
    dst_r: DR,
    dst_w: DW,
    counters: &'a Counters,
    ctl: &'a ConnControl,
    idle_timeout: Duration,
) -> impl Future<Output = RelayEnd> + Send + 'a
where
    SR: RelayRead + 'a,
    SW: RelayWrite + 'a,
    DR: RelayRead + 'a,
    DW: RelayWrite + 'a,
{
    counters.touch();
    let up = copy_half(src_r, dst_w, &counters.sent, counters);
    let down = copy_half(dst_r, src_w, &counters.received, counters);
    let idle = async move {
        loop {
            let idle_for = counters.idle_for();
            if idle_for >= idle_timeout {
                return;
            }
            tokio::time::sleep(idle_timeout - idle_for).await;
        }
    };
    Relay {
        both: futures_util::future::try_join(up, down),
        idle,
        cancelled: ctl.cancelled(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test code: a panic fails the test

    use std::sync::Arc;

    use tokio::io::AsyncReadExt;
    use tokio::net::TcpStream;

    use super::*;

    /// client ⇄ [relay] ⇄ server; returns the client, the server and the running relay.
    async fn relayed(
        idle: Duration,
        ctl: Arc<ConnControl>,
    ) -> (
        TcpStream,
        TcpStream,
        Arc<Counters>,
        tokio::task::JoinHandle<RelayEnd>,
    ) {
        let (client, src) = crate::testkit::tcp_pair().await;
        let (server, dst) = crate::testkit::tcp_pair().await;
        let counters = Arc::new(Counters::default());
        let c = counters.clone();
        let task = tokio::spawn(async move {
            let (sr, sw) = src.into_split();
            let (dr, dw) = dst.into_split();
            relay(sr, sw, dr, dw, &c, &ctl, idle).await
        });
        (client, server, counters, task)
    }

    /// A bulk transfer in both directions at once goes through: reads that tokio's cooperative budget holds back
    /// (a read polled after the task used up its turn is pending, though the socket is readable) make the relay
    /// yield, not spin. (A relay that looped straight back to its readiness wait spun here forever.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn bulk_both_ways_completes() {
        const BYTES: usize = 64 << 20;
        let (client, server, counters, task) =
            relayed(Duration::from_secs(60), Arc::default()).await;
        let pump = |s: TcpStream| async move {
            let (mut r, mut w) = s.into_split();
            let send = async move {
                let chunk = vec![7u8; 1 << 20];
                for _ in 0..BYTES / chunk.len() {
                    w.write_all(&chunk).await.unwrap();
                }
                w.shutdown().await.unwrap();
            };
            let recv = async move {
                let mut buf = vec![0u8; 1 << 20];
                let mut n = 0;
                loop {
                    match r.read(&mut buf).await.unwrap() {
                        0 => return n,
                        k => n += k,
                    }
                }
            };
            tokio::join!(send, recv).1
        };
        // A guard against a hang only (this is no timing test): the transfer takes well under a second.
        let both = tokio::time::timeout(Duration::from_secs(120), async {
            tokio::join!(tokio::spawn(pump(client)), tokio::spawn(pump(server)))
        })
        .await
        .expect("the relay stalled");
        assert_eq!(both.0.unwrap(), BYTES);
        assert_eq!(both.1.unwrap(), BYTES);
        assert_eq!(task.await.unwrap(), RelayEnd::Done);
        assert_eq!(counters.sent.load(Ordering::Relaxed), BYTES as u64);
        assert_eq!(counters.received.load(Ordering::Relaxed), BYTES as u64);
    }

    #[tokio::test]
    async fn half_close_passes_through_and_the_other_way_keeps_working() {
        let (mut client, mut server, counters, task) =
            relayed(Duration::from_secs(60), Arc::default()).await;
        client.write_all(b"request").await.unwrap();
        client.shutdown().await.unwrap();
        // The server sees the bytes, then EOF (the client's FIN passed through)...
        let mut got = Vec::new();
        server.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"request");
        // ... and can still answer on its open half.
        server.write_all(b"response after EOF").await.unwrap();
        server.shutdown().await.unwrap();
        let mut back = Vec::new();
        client.read_to_end(&mut back).await.unwrap();
        assert_eq!(back, b"response after EOF");
        assert_eq!(task.await.unwrap(), RelayEnd::Done);
        assert_eq!(counters.sent.load(Ordering::Relaxed), 7);
        assert_eq!(counters.received.load(Ordering::Relaxed), 18);
    }

    #[tokio::test]
    async fn large_transfers_arrive_intact() {
        let (mut client, mut server, counters, task) =
            relayed(Duration::from_secs(60), Arc::default()).await;
        let data: Vec<u8> = (0..3 * MAX_BUF).map(|i| (i % 251) as u8).collect();
        let expect = data.clone();
        let writer = tokio::spawn(async move {
            client.write_all(&data).await.unwrap();
            client.shutdown().await.unwrap();
            client
        });
        let mut got = Vec::new();
        server.read_to_end(&mut got).await.unwrap();
        assert!(got == expect, "payload changed in transit");
        drop(server);
        drop(writer.await.unwrap());
        assert_eq!(task.await.unwrap(), RelayEnd::Done);
        assert_eq!(counters.sent.load(Ordering::Relaxed), expect.len() as u64);
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_connection_is_closed_and_traffic_resets_the_timer() {
        let idle = Duration::from_secs(60);
        let start = tokio::time::Instant::now();
        let (mut client, mut server, _, task) = relayed(idle, Arc::default()).await;
        // At 40 s one byte goes through: the timer restarts from there.
        tokio::time::sleep(Duration::from_secs(40)).await;
        client.write_all(b"x").await.unwrap();
        let mut one = [0u8; 1];
        server.read_exact(&mut one).await.unwrap();
        // 60 s after the start the connection is not idle (only 20 s since the byte).
        tokio::time::sleep_until(start + Duration::from_secs(90)).await;
        assert!(!task.is_finished());
        assert_eq!(task.await.unwrap(), RelayEnd::Idle);
        let ended = start.elapsed();
        assert!(
            ended >= Duration::from_secs(100),
            "closed after {ended:?}, before 60 s of silence"
        );
        // Both ends see the connection closed.
        let mut rest = Vec::new();
        assert_eq!(client.read_to_end(&mut rest).await.unwrap(), 0);
    }

    #[tokio::test]
    async fn cancelling_ends_the_relay() {
        let ctl = Arc::new(ConnControl::default());
        let (mut client, _server, _, task) = relayed(Duration::from_secs(60), ctl.clone()).await;
        ctl.cancel();
        assert_eq!(task.await.unwrap(), RelayEnd::Cancelled);
        let mut rest = Vec::new();
        assert_eq!(client.read_to_end(&mut rest).await.unwrap(), 0);
    }
}
