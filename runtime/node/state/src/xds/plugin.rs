//! Plugins over xDS (Envoy's ECDS convention), proto → model: a `TypedExtensionConfig` (name = plugin name) whose `typed_config` is a
//! `weft.plugin.v1.WeftPlugin`, Envoy's network Wasm filter (`envoy.extensions.filters.network.wasm.v3.Wasm`,
//! what istiod sends for a NETWORK WasmPlugin) or a bare `envoy.extensions.wasm.v3.PluginConfig`, decoded into a
//! [`PluginResource`]: the code to fetch (inline bytes, or a remote URI with its sha256), the string `configure()`
//! gets, the failure policy, and what Envoy's message lacks (from the WeftPlugin; the kind otherwise comes from
//! the component's exported world). Every refusal names the field. The reverse is [`super::encode::plugin`]; the
//! round trip is in `tests/xds_roundtrip.rs`. Fetching the code is the plugin platform's (`weft-plugin-xds`), which
//! also checks a remote URI as its fetcher will read it ([`decode_with`]'s `check_uri`).

use std::sync::Arc;
use std::time::Duration;

use crate::{
    FailurePolicy, PluginDirections, PluginKind, PluginRollout, PluginShadow, PluginSource,
    PluginSpec, WorkloadSelector,
};
use weft_proto::envoy::config::core::v3::{self as core, TypedExtensionConfig};
use weft_proto::envoy::extensions::filters::network::wasm::v3::Wasm;
use weft_proto::envoy::extensions::wasm::v3::{FailurePolicy as EnvoyFailure, PluginConfig};
use weft_proto::type_url;
use weft_proto::weft::plugin::v1 as weft;

/// Istio's key for the image pull secret in `vm_config.environment_variables` (istiod puts the docker
/// config.json there: pkg/model/wasm.go).
pub const ISTIO_PULL_SECRET_ENV: &str = "ISTIO_META_WASM_IMAGE_PULL_SECRET";

/// Why a resource was refused: the field, and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct ConvertError {
    /// The field path in the resource (`typed_config.config.vm_config.code`, ...).
    pub field: String,
    /// What is wrong.
    pub reason: String,
}

fn err(field: impl Into<String>, reason: impl Into<String>) -> ConvertError {
    ConvertError {
        field: field.into(),
        reason: reason.into(),
    }
}

/// Where the code is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Code {
    /// In the resource.
    Inline(Arc<Vec<u8>>),
    /// To fetch (https:// or oci://), with the resource's own limits and pull secret.
    Remote(RemoteCode),
}

/// Remote code as the resource names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteCode {
    /// The URI.
    pub uri: String,
    /// `http_uri.timeout`.
    pub timeout: Option<Duration>,
    /// `retry_policy.num_retries`.
    pub retries: Option<u32>,
    /// `retry_policy.retry_back_off`.
    pub backoff: Option<RetryBackoff>,
    /// Istio's pull secret (a docker config.json) from `vm_config.environment_variables`.
    pub pull_secret: Option<Vec<u8>>,
}

/// `retry_policy.retry_back_off`: the delays between fetch attempts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryBackoff {
    /// The first delay.
    pub base: Duration,
    /// The largest delay.
    pub max: Duration,
}

/// A decoded plugin resource, before its code is fetched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginResource {
    /// The plugin name (the resource name).
    pub name: String,
    /// `PluginConfig.root_id` (Istio's `pluginName`): carried for peers that read it; weft's host does not.
    pub root_id: String,
    /// The code.
    pub code: Code,
    /// Expected sha256 of the code (lowercase hex), if the resource pins it.
    pub sha256: Option<String>,
    /// What `configure()` gets.
    pub config: String,
    /// Failure policy.
    pub failure_policy: FailurePolicy,
    /// From the WeftPlugin; `None`: from the component's exported world.
    pub kind: Option<PluginKind>,
    /// Chain order.
    pub priority: i32,
    /// Which workloads.
    pub selector: WorkloadSelector,
    /// Which directions.
    pub directions: PluginDirections,
    /// Re-check live connections on change.
    pub recheck: bool,
    /// Probation; `None`: the node's defaults.
    pub rollout: Option<PluginRollout>,
    /// A shadow version (policy plugins only), from the WeftPlugin's `shadow`.
    pub shadow: Option<ShadowResource>,
}

/// The shadow version of a plugin resource, before its code is fetched: code and configuration; the rest is the
/// serving version's. A remote shadow's pull secret is the serving `vm_config`'s.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShadowResource {
    /// The shadow's code.
    pub code: Code,
    /// Expected sha256 of the shadow's code (lowercase hex), if the resource pins it.
    pub sha256: Option<String>,
    /// What the shadow's `configure()` gets.
    pub config: String,
}

/// The field a shadow's refusals are under.
pub const SHADOW_FIELD: &str = "typed_config.shadow";

impl PluginResource {
    /// The spec for verified code `bytes` (sha256 `sha256`) of kind `kind` (the resource's, else the component's),
    /// with the shadow's verified code `shadow` (its bytes and sha256) when the resource has a shadow. Refused: a
    /// shadow on a telemetry plugin (only policy verdicts are compared), a shadow without its code.
    pub fn into_spec(
        self,
        bytes: Arc<Vec<u8>>,
        sha256: String,
        kind: PluginKind,
        shadow: Option<(Arc<Vec<u8>>, String)>,
    ) -> Result<PluginSpec, ConvertError> {
        let shadow = match (self.shadow, shadow) {
            (None, None) => None,
            (None, Some(_)) => {
                return Err(err(
                    SHADOW_FIELD,
                    "shadow code given for a resource without a shadow",
                ));
            }
            (Some(_), None) => return Err(err(format!("{SHADOW_FIELD}.code"), "not fetched")),
            (Some(s), Some((bytes, sha))) => Some(Arc::new(PluginShadow {
                source: PluginSource::Inline(bytes),
                sha256: Some(sha),
                config: s.config,
            })),
        };
        Ok(PluginSpec {
            name: self.name,
            kind,
            source: PluginSource::Inline(bytes),
            sha256: Some(sha256),
            config: self.config,
            failure_policy: self.failure_policy,
            priority: self.priority,
            selector: self.selector,
            directions: self.directions,
            recheck: self.recheck,
            rollout: self.rollout,
            shadow,
        })
    }
}

/// Decodes the resource `name` (a `TypedExtensionConfig` in an `Any`); `check_uri` refuses a remote URI the
/// fetcher could not read (its reason goes into the refusal, under the URI's field).
pub fn decode_resource_with(
    name: &str,
    resource: &prost_types::Any,
    check_uri: &dyn Fn(&str) -> Result<(), String>,
) -> Result<PluginResource, ConvertError> {
    let tec: TypedExtensionConfig = weft_proto::from_any(type_url::EXTENSION_CONFIG, resource)
        .map_err(|e| err("resource", e.to_string()))?;
    decode_with(name, &tec, check_uri)
}

/// Decodes a `TypedExtensionConfig` delivered under resource name `name` (see [`decode_resource_with`]).
pub fn decode_with(
    name: &str,
    tec: &TypedExtensionConfig,
    check_uri: &dyn Fn(&str) -> Result<(), String>,
) -> Result<PluginResource, ConvertError> {
    if name.is_empty() {
        return Err(err("name", "empty resource name"));
    }
    if !tec.name.is_empty() && tec.name != name {
        return Err(err(
            "name",
            format!("{:?} differs from the resource name {name:?}", tec.name),
        ));
    }
    let any = tec
        .typed_config
        .as_ref()
        .ok_or_else(|| err("typed_config", "missing"))?;
    let decode_err = |e: prost::DecodeError| err("typed_config", format!("cannot decode: {e}"));
    let (config, extra, prefix): (PluginConfig, Option<weft::WeftPlugin>, &str) = match any
        .type_url
        .as_str()
    {
        type_url::WEFT_PLUGIN => {
            let wp = <weft::WeftPlugin as prost::Message>::decode(any.value.as_slice())
                .map_err(decode_err)?;
            let config = wp
                .config
                .clone()
                .ok_or_else(|| err("typed_config.config", "missing"))?;
            (config, Some(wp), "typed_config.config")
        }
        type_url::WASM_NETWORK_FILTER => {
            let w = <Wasm as prost::Message>::decode(any.value.as_slice()).map_err(decode_err)?;
            let config = w
                .config
                .ok_or_else(|| err("typed_config.config", "missing"))?;
            (config, None, "typed_config.config")
        }
        type_url::WASM_PLUGIN_CONFIG => (
            <PluginConfig as prost::Message>::decode(any.value.as_slice()).map_err(decode_err)?,
            None,
            "typed_config",
        ),
        other => {
            return Err(err(
                "typed_config.type_url",
                format!(
                    "{other:?} is not a plugin (expected {}, {} or {})",
                    type_url::WEFT_PLUGIN,
                    type_url::WASM_NETWORK_FILTER,
                    type_url::WASM_PLUGIN_CONFIG
                ),
            ));
        }
    };
    let (code, sha256) = code(&config, prefix, check_uri)?;
    let pull_secret = pull_secret(&config);
    let plugin_config = configuration(
        config.configuration.as_ref(),
        &format!("{prefix}.configuration"),
    )?;
    let failure_policy = failure_policy(&config, prefix)?;
    let mut r = PluginResource {
        name: name.to_string(),
        root_id: config.root_id.clone(),
        code,
        sha256,
        config: plugin_config,
        failure_policy,
        kind: None,
        priority: 0,
        selector: WorkloadSelector::default(),
        directions: PluginDirections::default(),
        recheck: true,
        rollout: None,
        shadow: None,
    };
    if let Some(wp) = extra {
        weft_fields(&wp, &mut r)?;
        if let Some(sh) = &wp.shadow {
            let (code, sha256) = code_source(
                sh.code.as_ref(),
                &format!("{SHADOW_FIELD}.code"),
                pull_secret,
                check_uri,
            )?;
            let config = configuration(
                sh.configuration.as_ref(),
                &format!("{SHADOW_FIELD}.configuration"),
            )?;
            r.shadow = Some(ShadowResource {
                code,
                sha256,
                config,
            });
        }
    }
    Ok(r)
}

/// Istio's pull secret from `vm_config.environment_variables`.
fn pull_secret(config: &PluginConfig) -> Option<Vec<u8>> {
    use weft_proto::envoy::extensions::wasm::v3::plugin_config::Vm;
    let Some(Vm::VmConfig(vm)) = &config.vm else {
        return None;
    };
    vm.environment_variables
        .as_ref()
        .and_then(|e| e.key_values.get(ISTIO_PULL_SECRET_ENV))
        .filter(|s| !s.is_empty())
        .map(|s| s.as_bytes().to_vec())
}

fn code(
    config: &PluginConfig,
    prefix: &str,
    check_uri: &dyn Fn(&str) -> Result<(), String>,
) -> Result<(Code, Option<String>), ConvertError> {
    use weft_proto::envoy::extensions::wasm::v3::plugin_config::Vm;
    let vm = match &config.vm {
        Some(Vm::VmConfig(vm)) => vm,
        None => return Err(err(format!("{prefix}.vm_config"), "missing")),
    };
    code_source(
        vm.code.as_ref(),
        &format!("{prefix}.vm_config.code"),
        pull_secret(config),
        check_uri,
    )
}

/// An `AsyncDataSource` (at `field`) as code; `pull_secret` goes with remote code.
fn code_source(
    code: Option<&core::AsyncDataSource>,
    field: &str,
    pull_secret: Option<Vec<u8>>,
    check_uri: &dyn Fn(&str) -> Result<(), String>,
) -> Result<(Code, Option<String>), ConvertError> {
    use core::async_data_source::Specifier as Async;
    use core::data_source::Specifier as Local;
    let source = code.and_then(|c| c.specifier.as_ref()).ok_or_else(|| {
        err(
            field,
            "missing (inline bytes or a remote https:// / oci:// URI)",
        )
    })?;
    match source {
        Async::Local(local) => match &local.specifier {
            Some(Local::InlineBytes(b)) if !b.is_empty() => {
                Ok((Code::Inline(Arc::new(b.clone())), None))
            }
            Some(Local::InlineString(s)) if !s.is_empty() => {
                Ok((Code::Inline(Arc::new(s.as_bytes().to_vec())), None))
            }
            Some(Local::InlineBytes(_) | Local::InlineString(_)) | None => {
                Err(err(format!("{field}.local"), "empty"))
            }
            Some(Local::Filename(f)) => Err(err(
                format!("{field}.local.filename"),
                format!(
                    "{f:?}: a control plane may not name files on the node (send the bytes or a URI)"
                ),
            )),
            Some(Local::EnvironmentVariable(_)) => Err(err(
                format!("{field}.local.environment_variable"),
                "a control plane may not read the node's environment",
            )),
        },
        Async::Remote(remote) => {
            let f = format!("{field}.remote");
            let http = remote
                .http_uri
                .as_ref()
                .ok_or_else(|| err(format!("{f}.http_uri"), "missing"))?;
            if http.uri.trim().is_empty() {
                return Err(err(format!("{f}.http_uri.uri"), "empty"));
            }
            check_uri(http.uri.trim()).map_err(|e| err(format!("{f}.http_uri.uri"), e))?;
            let sha256 = match remote.sha256.trim() {
                "" => None,
                s => {
                    let s = s.strip_prefix("sha256:").unwrap_or(s).to_ascii_lowercase();
                    if s.len() != 64 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
                        return Err(err(
                            format!("{f}.sha256"),
                            format!("{s:?} is not 64 hex digits"),
                        ));
                    }
                    Some(s)
                }
            };
            let timeout = http
                .timeout
                .as_ref()
                .map(|d| duration(d, &format!("{f}.http_uri.timeout")))
                .transpose()?;
            let (retries, backoff) = match &remote.retry_policy {
                None => (None, None),
                Some(p) => {
                    let backoff = match &p.retry_back_off {
                        None => None,
                        Some(b) => {
                            let base = b
                                .base_interval
                                .as_ref()
                                .map(|d| {
                                    duration(
                                        d,
                                        &format!("{f}.retry_policy.retry_back_off.base_interval"),
                                    )
                                })
                                .transpose()?
                                .ok_or_else(|| {
                                    err(
                                        format!("{f}.retry_policy.retry_back_off.base_interval"),
                                        "missing",
                                    )
                                })?;
                            let max = b
                                .max_interval
                                .as_ref()
                                .map(|d| {
                                    duration(
                                        d,
                                        &format!("{f}.retry_policy.retry_back_off.max_interval"),
                                    )
                                })
                                .transpose()?
                                .unwrap_or(base * 10);
                            if max < base {
                                return Err(err(
                                    format!("{f}.retry_policy.retry_back_off.max_interval"),
                                    "shorter than base_interval",
                                ));
                            }
                            Some(RetryBackoff { base, max })
                        }
                    };
                    (p.num_retries.map(|n| n.min(10)), backoff)
                }
            };
            Ok((
                Code::Remote(RemoteCode {
                    uri: http.uri.trim().to_string(),
                    timeout,
                    retries,
                    backoff,
                    pull_secret,
                }),
                sha256,
            ))
        }
    }
}

fn duration(d: &prost_types::Duration, field: &str) -> Result<Duration, ConvertError> {
    if d.seconds < 0 || d.nanos < 0 || d.nanos >= 1_000_000_000 {
        return Err(err(field, "not a non-negative duration"));
    }
    Ok(Duration::new(d.seconds as u64, d.nanos as u32))
}

/// The string `configure()` gets: a StringValue as is (istiod's JSON), a BytesValue as UTF-8, a Struct as JSON;
/// unset: empty.
fn configuration(any: Option<&prost_types::Any>, field: &str) -> Result<String, ConvertError> {
    let Some(any) = any else {
        return Ok(String::new());
    };
    let decode_err = |e: prost::DecodeError| err(field, format!("cannot decode: {e}"));
    match any.type_url.as_str() {
        type_url::STRING_VALUE => {
            let v: String = prost::Message::decode(any.value.as_slice()).map_err(decode_err)?;
            Ok(v)
        }
        type_url::BYTES_VALUE => {
            let v: Vec<u8> = prost::Message::decode(any.value.as_slice()).map_err(decode_err)?;
            String::from_utf8(v).map_err(|_| {
                err(
                    field,
                    "BytesValue is not UTF-8 (configure() takes a string)",
                )
            })
        }
        type_url::STRUCT => {
            let s: prost_types::Struct =
                prost::Message::decode(any.value.as_slice()).map_err(decode_err)?;
            serde_json::to_string(&struct_json(&s)).map_err(|e| err(field, e.to_string()))
        }
        other => Err(err(
            field,
            format!("{other:?}: expected a google.protobuf.StringValue, BytesValue or Struct"),
        )),
    }
}

fn struct_json(s: &prost_types::Struct) -> serde_json::Value {
    serde_json::Value::Object(
        s.fields
            .iter()
            .map(|(k, v)| (k.clone(), value_json(v)))
            .collect(),
    )
}

fn value_json(v: &prost_types::Value) -> serde_json::Value {
    use prost_types::value::Kind;
    match &v.kind {
        None | Some(Kind::NullValue(_)) => serde_json::Value::Null,
        Some(Kind::NumberValue(n)) => serde_json::Number::from_f64(*n)
            .map_or(serde_json::Value::Null, serde_json::Value::Number),
        Some(Kind::StringValue(s)) => serde_json::Value::String(s.clone()),
        Some(Kind::BoolValue(b)) => serde_json::Value::Bool(*b),
        Some(Kind::StructValue(s)) => struct_json(s),
        Some(Kind::ListValue(l)) => {
            serde_json::Value::Array(l.values.iter().map(value_json).collect())
        }
    }
}

fn failure_policy(config: &PluginConfig, prefix: &str) -> Result<FailurePolicy, ConvertError> {
    match EnvoyFailure::try_from(config.failure_policy) {
        Ok(EnvoyFailure::FailOpen) => Ok(FailurePolicy::FailOpen),
        // Envoy's reload is a new VM after a failure: weft always uses a fresh instance, so it is fail closed.
        Ok(EnvoyFailure::FailClosed | EnvoyFailure::FailReload) => Ok(FailurePolicy::FailClosed),
        Ok(EnvoyFailure::Unspecified) if config.fail_open => Ok(FailurePolicy::FailOpen),
        Ok(EnvoyFailure::Unspecified) => Ok(FailurePolicy::FailClosed),
        Err(_) => Err(err(
            format!("{prefix}.failure_policy"),
            format!("unknown value {}", config.failure_policy),
        )),
    }
}

fn weft_fields(wp: &weft::WeftPlugin, r: &mut PluginResource) -> Result<(), ConvertError> {
    r.kind = match weft::Kind::try_from(wp.kind) {
        Ok(weft::Kind::Unspecified) => None,
        Ok(weft::Kind::Policy) => Some(PluginKind::Policy),
        Ok(weft::Kind::Telemetry) => Some(PluginKind::Telemetry),
        Err(_) => {
            return Err(err(
                "typed_config.kind",
                format!("unknown value {}", wp.kind),
            ));
        }
    };
    r.priority = wp.priority;
    if let Some(sel) = &wp.selector {
        for (list, field) in [
            (&sel.namespaces, "namespaces"),
            (&sel.workloads, "workloads"),
        ] {
            if let Some(i) = list.iter().position(|s| s.trim().is_empty()) {
                return Err(err(format!("typed_config.selector.{field}[{i}]"), "empty"));
            }
        }
        r.selector = WorkloadSelector {
            namespaces: sel.namespaces.clone(),
            workloads: sel.workloads.clone(),
        };
    }
    if let Some(d) = &wp.directions {
        if !d.inbound && !d.outbound {
            return Err(err(
                "typed_config.directions",
                "neither inbound nor outbound (leave it unset for inbound only)",
            ));
        }
        r.directions = PluginDirections {
            inbound: d.inbound,
            outbound: d.outbound,
        };
    }
    if let Some(rec) = wp.recheck {
        r.recheck = rec;
    }
    if let Some(ro) = &wp.rollout {
        let window = match &ro.window {
            Some(w) => duration(w, "typed_config.rollout.window")?,
            None if ro.disabled => Duration::ZERO,
            None => {
                return Err(err(
                    "typed_config.rollout.window",
                    "missing (or set disabled)",
                ));
            }
        };
        if !ro.disabled && window.is_zero() {
            return Err(err(
                "typed_config.rollout.window",
                "zero (set disabled to turn probation off)",
            ));
        }
        if !(0.0..=1.0).contains(&ro.max_failure_ratio) {
            return Err(err(
                "typed_config.rollout.max_failure_ratio",
                format!("{} is not within 0..1", ro.max_failure_ratio),
            ));
        }
        r.rollout = Some(PluginRollout {
            window,
            max_failure_ppm: PluginRollout::ppm(ro.max_failure_ratio),
            min_calls: ro.min_calls.max(1),
            disabled: ro.disabled,
        });
    }
    Ok(())
}
