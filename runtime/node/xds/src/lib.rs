//! weft's Delta ADS client (`envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources`), as
//! ztunnel speaks it to istiod: TLS with a configured root, a bearer token re-read from its file on every connect,
//! ztunnel's node id and metadata, wildcard subscriptions, per-resource ACK/NACK, reconnect with backoff and
//! `initial_resource_versions`. It knows nothing of what the resources mean: a [`Handler`] per type URL applies them
//! (weft's node converts them into `weft-state`'s model) and returns what it refused.
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
pub mod node;
mod pending;
pub mod status;
#[cfg(feature = "testing")]
pub mod testing;

pub use client::{AdsClient, NackSent, XdsHandle};
pub use config::SourceConfig;
pub use error::Error;
pub use handler::{Delta, Handler, NACK_CODE, Rejection, Upsert, nack_message};
pub use node::NodeInfo;
pub use status::{SourceStatus, Terminations, TypeStatus};
