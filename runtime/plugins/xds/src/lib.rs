//! Plugins over xDS, Envoy's extension config discovery (ECDS) convention: each plugin is a
//! `TypedExtensionConfig` resource named after it. The conversion to and from the model is weft-state's
//! (`weft_state::xds::plugin`, `weft_state::xds::encode::plugin`); [`convert`] adds what only the plugin
//! platform knows: whether the fetcher can read a remote URI, and the fetch request;
//! [`handler`] is the node's handler for `type_url::EXTENSION_CONFIG`: it fetches and verifies remote code, hands
//! the specs to the state, and ACKs only after the plugin host reports that it serves them; [`report`] turns the
//! host's automatic rollbacks into NACKs carrying a `weft.plugin.v1.RollbackReport`; [`mod@shadow_report`] sends the
//! shadow figures that changed as reports carrying a `weft.plugin.v1.ShadowReport` per plugin, and
//! [`mod@counts_report`] the call counts that changed, a `weft.plugin.v1.PluginCounts` per plugin.

pub mod convert;
pub mod counts_report;
pub mod handler;
pub mod report;
pub mod shadow_report;

pub use convert::{decode, decode_resource, fetch_request, shadow_fetch_request};
pub use counts_report::{plugin_counts, spawn_counts_reporter};
pub use handler::{EcdsHandler, PluginSink, Refused, Resource};
pub use report::{Nack, rollback_report, spawn_rollback_reporter};
pub use shadow_report::{SendReport, shadow_figures, shadow_report, spawn_shadow_reporter};
pub use weft_state::xds::plugin::{
    Code, ConvertError, ISTIO_PULL_SECRET_ENV, PluginResource, RemoteCode, RetryBackoff,
    ShadowResource,
};
