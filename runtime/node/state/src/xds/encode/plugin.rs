//! A plugin resource (the model, [`PluginResource`]) → the ECDS resource a node reads: a `TypedExtensionConfig`
//! named after the plugin whose `typed_config` is a `weft.plugin.v1.WeftPlugin` carrying Envoy's Wasm
//! `PluginConfig`, built as istiod builds a WasmPlugin's (code inline or as a remote data source, the
//! configuration as a `StringValue`, the pull secret in the VM's environment). The reverse is
//! [`crate::xds::plugin`].

use std::time::Duration;

use weft_proto::envoy::config::core::v3 as core;
use weft_proto::envoy::extensions::wasm::v3 as wasm;
use weft_proto::type_url;
use weft_proto::weft::plugin::v1 as pb;

use crate::FailurePolicy;
use crate::PluginKind;
use crate::xds::plugin::{Code, ISTIO_PULL_SECRET_ENV, PluginResource, RemoteCode};

fn duration(d: Duration) -> prost_types::Duration {
    prost_types::Duration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
    }
}

fn remote(rc: &RemoteCode, sha256: Option<&str>) -> core::RemoteDataSource {
    let retry_policy = (rc.retries.is_some() || rc.backoff.is_some()).then(|| core::RetryPolicy {
        num_retries: rc.retries,
        retry_back_off: rc.backoff.map(|b| core::BackoffStrategy {
            base_interval: Some(duration(b.base)),
            max_interval: Some(duration(b.max)),
        }),
    });
    core::RemoteDataSource {
        http_uri: Some(core::HttpUri {
            uri: rc.uri.clone(),
            // As istiod: the node fetches the code itself, no Envoy cluster is involved.
            http_upstream_type: Some(core::http_uri::HttpUpstreamType::Cluster("_".into())),
            timeout: rc.timeout.map(duration),
        }),
        sha256: sha256.unwrap_or_default().to_owned(),
        retry_policy,
    }
}

fn source(code: &Code, sha256: Option<&str>) -> core::AsyncDataSource {
    core::AsyncDataSource {
        specifier: Some(match code {
            Code::Inline(bytes) => core::async_data_source::Specifier::Local(core::DataSource {
                specifier: Some(core::data_source::Specifier::InlineBytes(bytes.to_vec())),
            }),
            Code::Remote(rc) => core::async_data_source::Specifier::Remote(remote(rc, sha256)),
        }),
    }
}

fn pull_secret(code: &Code) -> Option<&Vec<u8>> {
    match code {
        Code::Inline(_) => None,
        Code::Remote(rc) => rc.pull_secret.as_ref(),
    }
}

/// The ECDS resource for `r`. The VM's environment carries one pull secret: the serving code's, else a remote
/// shadow's (a node reads it for both).
pub fn extension_config(r: &PluginResource) -> core::TypedExtensionConfig {
    let code = source(&r.code, r.sha256.as_deref());
    let env = pull_secret(&r.code)
        .or_else(|| r.shadow.as_ref().and_then(|s| pull_secret(&s.code)))
        .map(|s| wasm::EnvironmentVariables {
            key_values: [(
                ISTIO_PULL_SECRET_ENV.to_owned(),
                String::from_utf8_lossy(s).into_owned(),
            )]
            .into_iter()
            .collect(),
            ..Default::default()
        });
    let failure_policy = match r.failure_policy {
        FailurePolicy::FailClosed => wasm::FailurePolicy::FailClosed,
        FailurePolicy::FailOpen => wasm::FailurePolicy::FailOpen,
    };
    let config = wasm::PluginConfig {
        name: r.name.clone(),
        root_id: r.root_id.clone(),
        vm: Some(wasm::plugin_config::Vm::VmConfig(wasm::VmConfig {
            code: Some(code),
            environment_variables: env,
            ..Default::default()
        })),
        configuration: (!r.config.is_empty())
            .then(|| weft_proto::to_any(type_url::STRING_VALUE, &r.config)),
        fail_open: r.failure_policy == FailurePolicy::FailOpen,
        failure_policy: failure_policy as i32,
    };
    let plugin = pb::WeftPlugin {
        config: Some(config),
        kind: match r.kind {
            None => pb::Kind::Unspecified,
            Some(PluginKind::Policy) => pb::Kind::Policy,
            Some(PluginKind::Telemetry) => pb::Kind::Telemetry,
        } as i32,
        priority: r.priority,
        selector: Some(pb::WorkloadSelector {
            namespaces: r.selector.namespaces.clone(),
            workloads: r.selector.workloads.clone(),
        }),
        directions: Some(pb::Directions {
            inbound: r.directions.inbound,
            outbound: r.directions.outbound,
        }),
        rollout: r.rollout.map(|ro| pb::Rollout {
            window: Some(duration(ro.window)),
            max_failure_ratio: f64::from(ro.max_failure_ppm) / 1e6,
            min_calls: ro.min_calls,
            disabled: ro.disabled,
        }),
        recheck: Some(r.recheck),
        shadow: r.shadow.as_ref().map(|s| pb::Shadow {
            code: Some(source(&s.code, s.sha256.as_deref())),
            configuration: (!s.config.is_empty())
                .then(|| weft_proto::to_any(type_url::STRING_VALUE, &s.config)),
        }),
    };
    core::TypedExtensionConfig {
        name: r.name.clone(),
        typed_config: Some(weft_proto::to_any(type_url::WEFT_PLUGIN, &plugin)),
    }
}
