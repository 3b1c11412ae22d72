//! Plugins over xDS, Envoy's extension config discovery (ECDS) convention: each plugin is a
//! `TypedExtensionConfig` resource named after it. [`convert`] decodes one into a [`PluginResource`] (its code
//! inline or remote, its configuration, failure policy, kind, priority, selector, directions and rollout);
//! [`handler`] is the node's handler for `type_url::EXTENSION_CONFIG`: it fetches and verifies remote code, hands
//! the specs to the state, and ACKs only after the plugin host reports that it serves them; [`report`] turns the
//! host's automatic rollbacks into NACKs carrying a `weft.plugin.v1.RollbackReport`.

pub mod convert;
pub mod handler;
pub mod report;

pub use convert::{
    Code, ConvertError, ISTIO_PULL_SECRET_ENV, PluginResource, RemoteCode, decode, decode_resource,
};
pub use handler::{EcdsHandler, PluginSink, Refused, Resource};
pub use report::{Nack, rollback_report, spawn_rollback_reporter};
