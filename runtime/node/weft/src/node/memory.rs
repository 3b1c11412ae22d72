//! How `weft run`'s background threads give memory back: the allocator's hook for a thread that is about to go
//! idle, set once by the binary that chose the allocator (`main.rs`: jemalloc's `thread.idle`).
//!
//! A thread that allocates in bursts and then waits (the control runtime's thread between events, the plugin
//! host's apply and refill threads after a load) keeps what it freed in its allocator cache until it allocates
//! again, which an idle thread never does: on an idle node that is most of a megabyte across those threads. The
//! data path's threads do not call it (their caches are what makes their allocations cheap).

use std::sync::OnceLock;

static RELEASE_THREAD_MEMORY: OnceLock<fn()> = OnceLock::new();

/// Sets the hook (once, before `weft run` starts its threads); false if one was already set.
pub fn set_release_thread_memory(hook: fn()) -> bool {
    RELEASE_THREAD_MEMORY.set(hook).is_ok()
}

/// The hook, if the binary set one (a test or a library user running a node in-process has none).
pub fn release_thread_memory() -> Option<fn()> {
    RELEASE_THREAD_MEMORY.get().copied()
}
