//! The sandbox: the one engine and its limits, what an instance's store holds (the caps, the host side of the
//! imports, the locked-down WASI), the time budget of a call and the epoch ticker that enforces it.

pub(crate) mod budget;
pub(crate) mod engine;
pub(crate) mod epoch;
pub(crate) mod imports;
pub(crate) mod limiter;
pub(crate) mod store;
pub(crate) mod wasi;
