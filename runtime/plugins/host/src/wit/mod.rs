//! The WIT side: the bindings generated from `sdk/wit`, the conversions of connection records and policies into WIT
//! values, and telemetry batches in their WIT form. Uses only the leaves.

pub(crate) mod batch;
pub mod bindings;
pub(crate) mod convert;
