//! weft's logging stack: tracing to stderr as text or JSON lines ([`json`]), written off the data path by a thread
//! of its own ([`writer`]), behind a filter that can change at run time ([`subscriber`]).

pub mod json;
pub mod subscriber;
pub mod writer;

mod error;
mod format;

pub use error::LogError;
pub use format::LogFormat;
pub use subscriber::{LogControl, init};
pub use writer::LogFlush;
