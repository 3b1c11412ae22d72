//! What the plugin platform adds to weft-state's ECDS conversion (`weft_state::xds::plugin`): a remote URI must
//! be one the fetcher can read (else the resource is refused, naming the field), and a decoded resource's remote
//! code becomes a fetch request.

use weft_proto::envoy::config::core::v3::TypedExtensionConfig;
use weft_state::xds::plugin::{self as model, Code, ConvertError, PluginResource};

/// The check weft-state's decoder runs on a remote URI: the fetcher's own parser.
fn check_uri(uri: &str) -> Result<(), String> {
    weft_fetch::Source::parse(uri)
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// Decodes the resource `name` (a `TypedExtensionConfig` in an `Any`).
pub fn decode_resource(
    name: &str,
    resource: &prost_types::Any,
) -> Result<PluginResource, ConvertError> {
    model::decode_resource_with(name, resource, &check_uri)
}

/// Decodes a `TypedExtensionConfig` delivered under resource name `name`.
pub fn decode(name: &str, tec: &TypedExtensionConfig) -> Result<PluginResource, ConvertError> {
    model::decode_with(name, tec, &check_uri)
}

/// The fetch request for a resource's remote code (`None`: the code is inline).
pub fn fetch_request(r: &PluginResource) -> Option<weft_fetch::Request> {
    request(&r.code, r.sha256.as_ref())
}

/// The fetch request for a resource's remote shadow code (`None`: no shadow, or its code is inline).
pub fn shadow_fetch_request(r: &PluginResource) -> Option<weft_fetch::Request> {
    let s = r.shadow.as_ref()?;
    request(&s.code, s.sha256.as_ref())
}

fn request(code: &Code, sha256: Option<&String>) -> Option<weft_fetch::Request> {
    let Code::Remote(remote) = code else {
        return None;
    };
    Some(weft_fetch::Request {
        uri: remote.uri.clone(),
        sha256: sha256.cloned(),
        timeout: remote.timeout,
        retries: remote.retries,
        backoff: remote.backoff.map(|b| weft_fetch::Backoff {
            base: b.base,
            max: b.max,
        }),
        pull_secret: remote.pull_secret.clone(),
    })
}
