//! Guest calls: linking a component for its world, and the typed calls into one sandboxed instance, each under a
//! deadline, with its failures classified.

pub(crate) mod failure;
pub(crate) mod instance;
pub(crate) mod link;
pub(crate) mod workloads;
