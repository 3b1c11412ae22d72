//! Shards: single-threaded runtimes that each carry whole connections, so a connection's tasks and its HBONE
//! connection never wake each other across threads.
//!
//! On a multi-threaded runtime one connection's relay task and the HTTP/2 connection task it sends through may run
//! on different workers: every hand-off between them is a cross-thread wake-up (a futex or eventfd write and a
//! context switch), h2's stream state lock is taken from both threads, and idle workers are woken to steal work.
//! With shards, every shard accepts on each short-lived-connection listener (capture, SOCKS5, inbound plaintext:
//! the shards poll one shared socket, whichever is free takes the next connection and keeps it, so no thread hands
//! a connection to another), while an inbound HBONE listener's connections, few and long-lived, are dealt to the
//! shards in turn so they spread evenly. Everything a connection spawns stays on its shard, and each shard has its
//! own HBONE pool (see [`current`]), so its outbound streams go over connections driven by the same thread.

use std::cell::Cell;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};

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

/// The shards' runtime handles; connections are spread over them in turn.
#[derive(Debug)]
pub struct Shards {
    handles: Vec<Handle>,
    next: AtomicUsize,
}

impl Shards {
    /// Shards on these runtimes (each a current-thread runtime driven by its own thread, which has called
    /// [`enter`] with its index in `handles`). At least one.
    pub fn new(handles: Vec<Handle>) -> Option<Self> {
        (!handles.is_empty()).then_some(Self {
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

    /// Runs `fut` on shard `index` (modulo the number of shards).
    pub fn spawn_on<F>(&self, index: usize, fut: F) -> JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.handles[index % self.handles.len()].spawn(fut)
    }

    /// The index of the next shard in turn (any value: [`Shards::spawn_on`] takes it modulo the count).
    pub fn next_index(&self) -> usize {
        self.next.fetch_add(1, Ordering::Relaxed)
    }

    /// Runs `fut` on the next shard in turn.
    pub fn spawn<F>(&self, fut: F) -> JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.spawn_on(self.next_index(), fut)
    }
}
