//! How a failed guest call is classified (timeout, memory, stack overflow, oversized output, trap), and the cap on
//! what the host copies out of a guest in one transfer.

use wasmtime::{Store, Trap};

use crate::base::error::{CallError, ErrorKind};
use crate::sandbox::store::StoreData;

/// The most bytes the host copies out of a guest in one transfer (a call's result, such as a deny reason, or the
/// arguments of one import call, such as a log line or metric label values). This is wasmtime's hostcall fuel:
/// it is charged from the length the guest declares *before* anything is copied, so an oversized string is
/// refused without the host ever allocating it. The data-specific caps (deny reason length, log line length,
/// metric label caps) apply afterwards to what was copied; this bound only stops the copy of something absurd.
pub(crate) const MAX_GUEST_TRANSFER: usize = 1 << 20;

/// Whether a failure is wasmtime refusing a guest-to-host transfer over [`MAX_GUEST_TRANSFER`]. wasmtime keeps
/// that error's type private, so it is recognised by its message (pinned by the `oversized_reason_*` tests).
fn transfer_too_large(e: &wasmtime::Error) -> bool {
    e.chain().any(|c| {
        c.to_string()
            .contains("fuel allocated for hostcalls has been exhausted")
    })
}

/// Classifies a failed call.
pub(crate) fn classify(e: wasmtime::Error, store: &Store<StoreData>) -> CallError {
    if store.data().limiter.memory_hit {
        return CallError {
            kind: ErrorKind::Memory,
            message: format!("{e:#}"),
        };
    }
    if transfer_too_large(&e) {
        return CallError {
            kind: ErrorKind::BadOutput,
            message: format!(
                "the plugin handed the host more than {MAX_GUEST_TRANSFER} bytes in one transfer (e.g. a deny \
                 reason); refused before copying"
            ),
        };
    }
    let kind = match e.downcast_ref::<Trap>() {
        Some(Trap::Interrupt) => ErrorKind::Timeout,
        Some(Trap::StackOverflow) => ErrorKind::StackOverflow,
        _ => ErrorKind::Trap,
    };
    let message = match kind {
        ErrorKind::Timeout => "call exceeded its deadline".to_string(),
        _ => {
            let mut m = format!("{e:#}");
            m.truncate(m.char_indices().nth(300).map_or(m.len(), |(i, _)| i));
            m
        }
    };
    CallError { kind, message }
}
