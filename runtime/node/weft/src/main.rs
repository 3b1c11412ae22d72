//! The `weft` binary: parse the command line and hand over.

use clap::Parser;

/// jemalloc, not glibc's malloc: under bulk traffic glibc kept handing the relay's and h2's large buffers back to
/// the kernel and faulting them in again (page faults were the biggest difference between weft's and ztunnel's
/// CPU profiles; the figures are in docs/performance.md).
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's options, read when it starts: a background thread gives freed pages back to the kernel after a
/// second unused (`dirty_decay_ms`; at once from there, `muzzy_decay_ms:0`), so an idle node does not keep the
/// memory of a past burst, and no transparent huge pages (they would inflate RSS). One arena per CPU
/// (`percpu_arena`), not jemalloc's default of four per CPU handed out per thread: weft's dozen threads otherwise
/// spread their small allocations over eight arenas on two cores, each keeping partly used slabs and its own
/// background purge, and a data thread allocates from the arena of the CPU it runs on (where the CPUs the
/// process may use are not all the machine's, a restricted cpuset, jemalloc says "Number of CPUs detected is not
/// deterministic" on stderr and keeps its default arenas). `tests/allocator.rs` checks they are in effect. (A C
/// `const char *malloc_conf`: a slice's first word is its pointer.)
#[allow(unsafe_code)] // `export_name`: jemalloc looks this symbol up by name
#[unsafe(export_name = "_rjem_malloc_conf")]
pub static MALLOC_CONF: &[u8] =
    b"background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:0,thp:never,percpu_arena:percpu\0";

/// jemalloc's `thread.idle` for the calling thread: its cache of freed blocks goes back to the arena (whose unused
/// pages the background thread then returns to the kernel), for the threads that go idle after a burst
/// (`weft::node::memory`).
fn release_thread_memory() {
    // SAFETY: `thread.idle` takes no input or output (all pointers null, length 0), is documented as safe to call
    // from any thread at any time, and only acts on the calling thread's cache. A failure (an unknown name on a
    // jemalloc without it) changes nothing, so its status is not needed.
    #[allow(unsafe_code)]
    unsafe {
        tikv_jemalloc_sys::mallctl(
            c"thread.idle".as_ptr(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            0,
        );
    }
}

fn main() -> anyhow::Result<()> {
    weft::node::memory::set_release_thread_memory(release_thread_memory);
    let cli = weft::cli::Cli::parse();
    weft::dispatch(cli)
}
