//! Shards: single-threaded runtimes that each carry whole connections, so a connection's tasks and its HBONE
//! connection never wake each other across threads.
//!
//! On a multi-threaded runtime one connection's relay task and the HTTP/2 connection task it sends through may run
//! on different workers: every hand-off between them is a cross-thread wake-up (a futex or eventfd write and a
//! context switch), h2's stream state lock is taken from both threads, and idle workers are woken to steal work.
//! With shards, everything a connection spawns stays on its shard, and each shard has its own HBONE pool (see
//! [`current`]), so its outbound streams go over connections driven by the same thread.
//!
//! Where a connection runs is decided once, at accept ([`Shards::place`]). Each listener of short-lived
//! connections (capture, SOCKS5, inbound plaintext) has one accept loop on a *home* shard (listeners get homes in
//! turn), which keeps a new connection unless it already carries more than [`SPILL_MARGIN`] connections above the
//! least loaded shard; then the connection goes to that shard. A lightly loaded node so runs one connection after
//! another on the same thread: neither a wake-up of several shards per connection (every shard polling the socket)
//! nor connections rotating over threads, which made the scheduler move them between cores and cost a new
//! connection's first byte about a fifth more in the mesh bench. Under load the connections spread by count.
//! An inbound HBONE listener's connections, few and long-lived (one per peer node and shard), are dealt to the
//! shards in turn so they spread evenly.
//!
//! A socket's readiness comes from the reactor of the runtime it was registered with, so a connection accepted on
//! one shard and run on another must be handed over with its socket deregistered ([`adopt`]): otherwise every
//! readiness event of that socket would be seen by the accepting shard's reactor and passed across threads (a
//! wake-up of the running shard per event, and none at all while the accepting shard is busy).

use std::cell::Cell;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};

use tokio::net::TcpStream;
use tokio::runtime::Handle;
use tokio::task::JoinHandle;

thread_local! {
    /// The shard this thread drives; 0 on threads that are not shards.
    static CURRENT: Cell<usize> = const { Cell::new(0) };
}

/// The shard the calling thread drives (0 outside shards): the index of its HBONE pool.
pub fn current() -> usize {
    CURRENT.with(Cell::get)
}

/// Marks the calling thread as the driver of shard `index` (call once, on the shard's own thread).
pub fn enter(index: usize) {
    CURRENT.with(|c| c.set(index));
}

/// How many more live connections than the least loaded shard a listener's home shard may carry and still keep a
/// new connection.
pub const SPILL_MARGIN: usize = 2;

/// One shard's live connection count, alone on its cache line(s).
#[derive(Debug, Default)]
#[repr(align(128))]
struct Live(AtomicUsize);

/// The shards' runtime handles and how many connections each carries.
#[derive(Debug)]
pub struct Shards {
    handles: Vec<Handle>,
    next: AtomicUsize,
    live: Arc<[Live]>,
}

/// Counts one connection on a shard while it lives ([`Shards::count`]).
#[derive(Debug)]
pub struct Counted {
    live: Arc<[Live]>,
    index: usize,
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.live[self.index].0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Shards {
    /// Shards on these runtimes (each a current-thread runtime driven by its own thread, which has called
    /// [`enter`] with its index in `handles`). At least one.
    pub fn new(handles: Vec<Handle>) -> Option<Self> {
        (!handles.is_empty()).then(|| Self {
            live: (0..handles.len()).map(|_| Live::default()).collect(),
            handles,
            next: AtomicUsize::new(0),
        })
    }

    /// How many shards there are.
    pub fn len(&self) -> usize {
        self.handles.len()
    }

    /// Never true: [`Shards::new`] refuses an empty list.
    pub fn is_empty(&self) -> bool {
        self.handles.is_empty()
    }

    /// The index of the next shard in turn.
    pub fn next_index(&self) -> usize {
        self.next.fetch_add(1, Ordering::Relaxed) % self.handles.len()
    }

    /// The connections shard `index` carries now (counted with [`Shards::count`]).
    pub fn live(&self, index: usize) -> usize {
        self.live[index % self.live.len()].0.load(Ordering::Relaxed)
    }

    /// Counts one more connection on shard `index` until the returned guard is dropped.
    pub fn count(&self, index: usize) -> Counted {
        let index = index % self.live.len();
        self.live[index].0.fetch_add(1, Ordering::Relaxed);
        Counted {
            live: self.live.clone(),
            index,
        }
    }

    /// Where a new connection of a listener whose home is shard `home` runs: `home`, unless it carries more than
    /// [`SPILL_MARGIN`] connections above the least loaded shard, then that shard (the lowest index among equals).
    pub fn place(&self, home: usize) -> usize {
        let home = home % self.live.len();
        let at_home = self.live(home);
        if at_home <= SPILL_MARGIN {
            return home;
        }
        let (least, fewest) = (0..self.live.len())
            .map(|i| (i, self.live(i)))
            .min_by_key(|&(_, n)| n)
            .unwrap_or((home, at_home));
        if at_home > fewest + SPILL_MARGIN {
            least
        } else {
            home
        }
    }

    /// Runs `fut` on shard `index` (modulo the number of shards).
    pub fn spawn_on<F>(&self, index: usize, fut: F) -> JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.handles[index % self.handles.len()].spawn(fut)
    }
}

/// Hands an accepted socket to the shard that will run its connection: `make` builds the connection's future from
/// the socket once the returned future first runs, re-registering the socket with the reactor of the runtime that
/// polls it. Fails if the socket cannot leave the current reactor (it is then closed).
pub fn adopt<M, F>(stream: TcpStream, make: M) -> io::Result<Adopt<M, F>>
where
    M: FnOnce(TcpStream) -> F,
    F: Future<Output = ()>,
{
    Ok(Adopt::Start {
        socket: stream.into_std()?,
        make,
    })
}

pin_project_lite::pin_project! {
    /// A connection whose socket joins the reactor of the runtime that runs it ([`adopt`]). One state at a time:
    /// the socket and the constructor until the first poll, then only the connection's future.
    #[project = AdoptProj]
    #[project_replace = AdoptOwned]
    pub enum Adopt<M, F> {
        /// Not polled yet.
        Start { socket: std::net::TcpStream, make: M },
        /// The connection.
        Running { #[pin] conn: F },
        /// Ended without running (the socket could not join this runtime's reactor).
        Failed,
    }
}

impl<M, F> Future for Adopt<M, F>
where
    M: FnOnce(TcpStream) -> F,
    F: Future<Output = ()>,
{
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if let AdoptProj::Start { .. } = self.as_mut().project() {
            // Take the socket and the constructor out (leaving `Failed`), then start the connection.
            if let AdoptOwned::Start { socket, make } = self.as_mut().project_replace(Adopt::Failed)
            {
                match TcpStream::from_std(socket) {
                    Ok(stream) => self.set(Adopt::Running { conn: make(stream) }),
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot register an accepted connection with its shard: closing it");
                    }
                }
            }
        }
        match self.project() {
            AdoptProj::Running { conn } => conn.poll(cx),
            _ => Poll::Ready(()),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test code: a panic fails the test

    use super::*;

    fn shards(n: usize) -> Shards {
        // Handles of a runtime that never runs anything: placement and counting only.
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let s = Shards::new(vec![rt.handle().clone(); n]).unwrap();
        std::mem::forget(rt);
        s
    }

    #[test]
    fn a_home_keeps_its_connections_until_it_carries_more_than_the_margin_above_the_least_loaded() {
        let s = shards(3);
        let mut held = Vec::new();
        // One after another, each ending before the next: always home.
        for _ in 0..10 {
            let i = s.place(1);
            assert_eq!(i, 1);
            drop(s.count(i));
        }
        // Held: home takes SPILL_MARGIN + 1, then the least loaded (lowest index first), and so on by count.
        for _ in 0..=SPILL_MARGIN {
            let i = s.place(1);
            assert_eq!(i, 1);
            held.push(s.count(i));
        }
        let i = s.place(1);
        assert_eq!(i, 0, "home at {} against 0 elsewhere", s.live(1));
        held.push(s.count(i));
        for _ in 0..30 {
            let i = s.place(1);
            held.push(s.count(i));
        }
        let counts: Vec<usize> = (0..3).map(|i| s.live(i)).collect();
        assert_eq!(counts.iter().sum::<usize>(), 34);
        let (min, max) = (counts.iter().min().unwrap(), counts.iter().max().unwrap());
        assert!(max - min <= SPILL_MARGIN + 1, "{counts:?}");
        // Ended connections are no longer counted.
        held.clear();
        assert_eq!((0..3).map(|i| s.live(i)).sum::<usize>(), 0);
        assert_eq!(s.place(2), 2);
    }

    #[test]
    fn an_adopted_socket_is_served_by_its_shard_while_the_accepting_one_stands_still() {
        use std::io::{Read, Write};
        use tokio::io::{AsyncReadExt, AsyncWriteExt};

        // The shard that runs the connection: a current-thread runtime driven by a thread of its own until told
        // to stop.
        let (handle_tx, handle_rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let shard = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            handle_tx.send(rt.handle().clone()).unwrap();
            let _ = rt.block_on(stop_rx);
        });
        let shard_handle = handle_rx.recv().unwrap();

        // The accepting shard: this thread's runtime, which is not driven again once the connection is handed
        // over (this thread then blocks in plain socket calls). A socket left registered with it would never be
        // seen readable.
        let accepting = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let (accepted, mut client) = accepting.block_on(async {
            let lis = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let client = std::net::TcpStream::connect(lis.local_addr().unwrap()).unwrap();
            (lis.accept().await.unwrap().0, client)
        });
        let conn = adopt(accepted, |mut s: TcpStream| async move {
            // Two exchanges. An accepted socket starts out assumed readable, so the first read needs no event;
            // a read that finds nothing clears that before the echo goes back (the client sends its second message
            // only once it has the echo), so the second read waits for the reactor's event.
            for _ in 0..2 {
                let mut buf = [0u8; 4];
                s.read_exact(&mut buf).await.unwrap();
                let nothing = s.try_read(&mut [0u8; 1]);
                assert_eq!(nothing.unwrap_err().kind(), std::io::ErrorKind::WouldBlock);
                s.write_all(&buf).await.unwrap();
            }
        })
        .unwrap();
        let served = shard_handle.spawn(conn);

        // A bound on failure, not a wait: the echo comes back as soon as the shard sees the socket readable.
        client
            .set_read_timeout(Some(std::time::Duration::from_secs(30)))
            .unwrap();
        for msg in [b"ping", b"pong"] {
            client.write_all(msg).unwrap();
            let mut echo = [0u8; 4];
            client
                .read_exact(&mut echo)
                .expect("the shard running the connection must see its socket's readiness");
            assert_eq!(&echo, msg);
        }

        stop_tx.send(()).unwrap();
        shard.join().unwrap();
        drop((served, accepting));
    }

    #[test]
    fn listeners_get_homes_in_turn() {
        let s = shards(2);
        assert_eq!([s.next_index(), s.next_index(), s.next_index()], [0, 1, 0]);
    }
}
