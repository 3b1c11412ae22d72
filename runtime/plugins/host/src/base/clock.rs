//! The host's clock: weft-hooks' (shared with the node), re-exported where the layers below take it from.

pub use weft_hooks::clock::{Clock, ManualClock, SystemClock};
