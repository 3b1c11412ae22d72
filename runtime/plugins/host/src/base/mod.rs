//! Leaves: the host's config, the clock probations are measured on, the errors, and where code is compiled. They use
//! nothing else in the crate.

pub(crate) mod clock;
pub(crate) mod compiler;
pub(crate) mod config;
pub(crate) mod error;
