//! A running node, started step by step on the caller's runtime: the state sources (mesh file, xDS, plugins),
//! identity, the admin servers and the data path ([`start`]), and its drain ([`NodeHandle::shutdown`]). `weft
//! run` ([`crate::run`]) starts one on runtimes of its own ([`runtimes`]); a test starts one in-process.

mod data_path;
mod handle;
mod identity;
pub mod memory;
pub mod runtimes;
mod sources;
mod start;

pub use handle::NodeHandle;
pub(crate) use sources::Sources;
pub use start::start;
pub(crate) use start::{Threads, start_on};
