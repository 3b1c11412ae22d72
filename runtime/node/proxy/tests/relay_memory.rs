//! What an idle relayed connection costs in heap: a counting global allocator measures the bytes live while many
//! TCP⇄TCP relays sit idle after one exchange each, so a relay that keeps a read buffer through the wait fails; and
//! a connection's control (its cancel) costs its one allocation and nothing beside it.
#![allow(clippy::unwrap_used)] // a test panics to fail

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Waker};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use weft_proxy::relay::{Counters, relay};

/// The system allocator, counting the bytes currently allocated by each thread. Per thread, so the tests of this
/// file (each on its own thread, each on a current-thread runtime) do not see each other's allocations.
struct Counting;

thread_local! {
    static LIVE: Cell<isize> = const { Cell::new(0) };
}

fn add(bytes: isize) {
    // `try_with`: the counter may already be gone while a thread is exiting.
    let _ = LIVE.try_with(|live| live.set(live.get() + bytes));
}

fn live() -> isize {
    LIVE.with(Cell::get)
}

// SAFETY: every call is forwarded to the system allocator unchanged; only a counter is updated beside it.
#[allow(unsafe_code)] // a global allocator cannot be written without it
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        add(layout.size() as isize);
        // SAFETY: the caller's contract is passed through.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        add(-(layout.size() as isize));
        // SAFETY: the caller's contract is passed through.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        add(new_size as isize - layout.size() as isize);
        // SAFETY: the caller's contract is passed through.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

const RELAYS: usize = 200;
/// The relay's smallest read buffer is 4 KiB per direction: a relay that held one while idle would cost 8 KiB.
/// What is left per idle relay (its task and future, the counters, the split halves) is well under this: about
/// 1.3 KiB, where a relay future that stored its two directions twice (an `async` body pinning what it captured)
/// made it 2.2 KiB.
const MAX_IDLE_BYTES_PER_RELAY: isize = 2 * 1024;

/// A connected pair: (the end the test drives, the end the relay owns).
async fn pair(lis: &TcpListener) -> (TcpStream, TcpStream) {
    let (a, b) = tokio::join!(TcpStream::connect(lis.local_addr().unwrap()), lis.accept());
    (a.unwrap(), b.unwrap().0)
}

#[tokio::test(flavor = "current_thread")]
async fn an_idle_relay_holds_no_read_buffer() {
    let lis = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let ctl = Arc::new(weft_proxy::tracker::ConnControl::default());
    let mut ends = Vec::with_capacity(RELAYS);
    let mut relayed = Vec::with_capacity(RELAYS);
    let mut tasks = Vec::with_capacity(RELAYS);
    // The sockets are made before counting: what is measured is what the relays themselves hold.
    for _ in 0..RELAYS {
        let (client, src) = pair(&lis).await;
        let (server, dst) = pair(&lis).await;
        ends.push((client, server));
        relayed.push((src, dst));
    }
    let before = live();
    for (src, dst) in relayed {
        let ctl = ctl.clone();
        tasks.push(tokio::spawn(async move {
            let (sr, sw) = src.into_split();
            let (dr, dw) = dst.into_split();
            let counters = Counters::default();
            relay(sr, sw, dr, dw, &counters, &ctl, Duration::from_secs(3600)).await
        }));
    }
    // One exchange each way on every relay, so both directions have read (and, without the fix, keep) a buffer.
    for (client, server) in &mut ends {
        client.write_all(b"ping").await.unwrap();
        let mut got = [0u8; 4];
        server.read_exact(&mut got).await.unwrap();
        server.write_all(b"pong").await.unwrap();
        client.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"pong");
    }
    // Every relay is back waiting for its sockets.
    for _ in 0..4 {
        tokio::task::yield_now().await;
    }
    let grown = live() - before;
    let per_relay = grown / RELAYS as isize;
    assert!(
        per_relay < MAX_IDLE_BYTES_PER_RELAY,
        "each idle relay keeps {per_relay} bytes of heap after one exchange (at most {MAX_IDLE_BYTES_PER_RELAY})"
    );
    println!("heap per idle relay: {per_relay} bytes");
    // The relays still work after the wait.
    let (client, server) = &mut ends[0];
    client.write_all(b"again").await.unwrap();
    let mut got = [0u8; 5];
    server.read_exact(&mut got).await.unwrap();
    assert_eq!(&got, b"again");
    for t in &tasks {
        t.abort();
    }
}

/// A connection's control is one allocation of its own size, and waiting on its cancel allocates nothing: no
/// separate node per connection (as a `CancellationToken` would make), on both nodes of every connection.
#[test]
fn a_connection_control_is_one_allocation() {
    const N: usize = 100;
    let mut ctls = Vec::with_capacity(N);
    let mut waits = Vec::with_capacity(N);
    let before = live();
    for _ in 0..N {
        ctls.push(Arc::new(weft_proxy::tracker::ConnControl::default()));
    }
    for ctl in &ctls {
        waits.push(Box::pin(ctl.cancelled()));
    }
    let wait_size = isize::try_from(std::mem::size_of_val(&*waits[0])).unwrap();
    let mut cx = Context::from_waker(Waker::noop());
    for wait in &mut waits {
        assert!(wait.as_mut().poll(&mut cx).is_pending());
    }
    let per_control = (live() - before) / isize::try_from(N).unwrap() - wait_size;
    let arc_inner =
        std::mem::size_of::<weft_proxy::tracker::ConnControl>() + 2 * std::mem::size_of::<usize>();
    assert_eq!(per_control, isize::try_from(arc_inner).unwrap());
    for ctl in &ctls {
        ctl.cancel();
    }
    for wait in &mut waits {
        assert!(wait.as_mut().poll(&mut cx).is_ready());
    }
}
