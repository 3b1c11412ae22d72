//! The Delta ADS server (binary `weft-control`) (`envoy.service.discovery.v3.AggregatedDiscoveryService`) for weft nodes, and
//! for ztunnel, which speaks the same protocol. It serves workloads and services (`istio.workload.Address`) and
//! policies (`istio.security.Authorization`) from a watched mesh file in ztunnel's local-config format, and plugins
//! (`envoy.config.core.v3.TypedExtensionConfig` carrying a `weft.plugin.v1.WeftPlugin`) from a watched directory
//! of `WeftPlugin` files modelled on Istio's WasmPlugin, with staged rollout to chosen nodes. Changes go out as
//! deltas; every ACK and NACK is recorded per node (log, metrics, status endpoint); callers are authenticated by
//! bearer token over TLS.
//!
//! The protocol's per-stream state (subscriptions, what each node has, ACK/NACK matching, the deltas) is
//! `weft_xds::server`'s; this crate holds what is served and to whom ([`resources`], [`publish`]), the records
//! ([`registry`], [`metrics`], [`status`]), authentication ([`service`]), and the glue of one stream ([`stream`]).

pub mod cli;
pub mod counts;
pub mod mesh;
pub mod metrics;
pub mod plugin_dir;
pub mod plugin_file;
pub mod publish;
pub mod registry;
pub mod resources;
pub mod server;
pub mod service;
pub mod shadow;
pub mod status;
pub mod stream;

pub use server::{ControlConfig, Error, Running, start};
pub use service::NodeAccount;
