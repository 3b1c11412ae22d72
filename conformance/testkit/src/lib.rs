//! What every test of weft shares: waiting for an event instead of sleeping ([`wait`]), echo workloads
//! ([`echo`]), facts about ztunnel the compatibility tests check ([`ztunnel`]) and, with feature `ca`, a
//! development CA ([`ca`]). Test support: only dev-dependencies and
//! `conformance/` use it.

#[cfg(feature = "ca")]
pub mod ca;
pub mod echo;
pub mod wait;
pub mod ztunnel;

pub use echo::{echo_server, round_trip};
pub use wait::{PATIENCE, eventually, eventually_blocking, eventually_within, poll_within, until};
