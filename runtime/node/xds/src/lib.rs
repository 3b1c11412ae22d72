//! Both ends of Delta ADS (`envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources`),
//! knowing nothing of what the resources mean.
//!
//! The client, as ztunnel speaks it to istiod: TLS with a configured root, a bearer token re-read from its file on
//! every connect, ztunnel's node id and metadata, wildcard subscriptions, per-resource ACK/NACK, reconnect with
//! backoff and `initial_resource_versions`. A [`Handler`] per type URL applies the resources (weft's node converts
//! them into `weft-state`'s model) and returns what it refused.
//!
//! The server's protocol state ([`server`]): per stream and type, the subscription (wildcard or names), what the
//! node has, the responses awaiting ACK or NACK, and the next response (only what changed) from what the server
//! offers; weft control serves its snapshot through it.
//!
//! ```no_run
//! # use std::sync::Arc;
//! # fn f(handler: Arc<dyn weft_xds::Handler>) -> Result<(), weft_xds::Error> {
//! let mut cfg = weft_xds::SourceConfig::new("mesh", "https://istiod.istio-system.svc:15012");
//! cfg.root_cert = Some("/var/run/secrets/istio/root-cert.pem".into());
//! cfg.token_file = Some("/var/run/secrets/tokens/istio-token".into());
//! let handle = weft_xds::AdsClient::new(cfg)
//!     .subscribe(weft_proto::type_url::ADDRESS, handler)
//!     .start()?;
//! # let _ = handle; Ok(()) }
//! ```

mod backoff;
pub mod client;
pub mod config;
mod connect;
pub mod error;
pub mod handler;
pub mod metrics;
pub mod node;
mod pending;
pub mod server;
pub mod status;
#[cfg(feature = "testing")]
pub mod testing;

pub use client::{AdsClient, NackSent, XdsHandle};
pub use config::SourceConfig;
pub use error::Error;
pub use handler::{Delta, Handler, NACK_CODE, Rejection, Upsert, nack_message};
pub use metrics::XdsCollector;
pub use node::NodeInfo;
pub use status::{SourceStatus, Terminations, TypeStatus, pending};
