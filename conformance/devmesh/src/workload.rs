//! Workloads for a local mesh: the echo server and the client round trip, from the shared test kit.

pub use weft_testkit::echo::{echo_server, round_trip};
