//! A plugin resource weft-control serves is what a node reads back: model → ECDS (`xds::encode::plugin`,
//! weft-control's side) → model (`xds::plugin`, the node's side), field for field, for inline and remote code and
//! every optional field set and unset.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use weft_state::xds::encode::plugin::extension_config;
use weft_state::xds::plugin::{
    Code, PluginResource, RemoteCode, RetryBackoff, decode_resource_with,
};
use weft_state::{FailurePolicy, PluginDirections, PluginKind, PluginRollout, WorkloadSelector};

fn inline() -> PluginResource {
    PluginResource {
        name: "allowlist".into(),
        root_id: String::new(),
        code: Code::Inline(Arc::new(b"\0asm component bytes".to_vec())),
        sha256: None,
        config: String::new(),
        failure_policy: FailurePolicy::FailClosed,
        kind: None,
        priority: 0,
        selector: WorkloadSelector::default(),
        directions: PluginDirections::default(),
        recheck: true,
        rollout: None,
    }
}

fn remote() -> PluginResource {
    PluginResource {
        name: "istio-system.authz".into(),
        root_id: "authz".into(),
        code: Code::Remote(RemoteCode {
            uri: "oci://registry.example/wasm/authz:v2".into(),
            timeout: Some(Duration::from_millis(2500)),
            retries: Some(4),
            backoff: Some(RetryBackoff {
                base: Duration::from_millis(200),
                max: Duration::from_secs(3),
            }),
            pull_secret: Some(br#"{"auths":{"registry.example":{"auth":"dTpw"}}}"#.to_vec()),
        }),
        sha256: Some("ab".repeat(32)),
        config: r#"{"ports":[8080,9090]}"#.into(),
        failure_policy: FailurePolicy::FailOpen,
        kind: Some(PluginKind::Telemetry),
        priority: -7,
        selector: WorkloadSelector {
            namespaces: vec!["shop".into(), "billing".into()],
            workloads: vec!["cart-1".into()],
        },
        directions: PluginDirections {
            inbound: true,
            outbound: true,
        },
        recheck: false,
        rollout: Some(PluginRollout {
            window: Duration::from_secs(45),
            max_failure_ppm: 125_000,
            min_calls: 20,
            disabled: false,
        }),
    }
}

/// Encode, wrap as the server does, decode as the node does.
fn round_trip(r: &PluginResource) -> PluginResource {
    let any = weft_proto::to_any(weft_proto::type_url::EXTENSION_CONFIG, &extension_config(r));
    decode_resource_with(&r.name, &any, &|_| Ok(())).unwrap()
}

#[test]
fn inline_code_with_defaults_reads_back_the_same() {
    assert_eq!(round_trip(&inline()), inline());
}

#[test]
fn remote_code_with_every_field_set_reads_back_the_same() {
    assert_eq!(round_trip(&remote()), remote());
}

#[test]
fn policy_kind_outbound_only_and_disabled_probation_read_back_the_same() {
    let mut r = inline();
    r.kind = Some(PluginKind::Policy);
    r.directions = PluginDirections {
        inbound: false,
        outbound: true,
    };
    r.rollout = Some(PluginRollout {
        window: Duration::ZERO,
        max_failure_ppm: 0,
        min_calls: 1,
        disabled: true,
    });
    r.config = "plain text, not JSON".into();
    assert_eq!(round_trip(&r), r);
}

#[test]
fn the_uri_check_of_the_decoder_sees_the_encoded_uri() {
    let any = weft_proto::to_any(
        weft_proto::type_url::EXTENSION_CONFIG,
        &extension_config(&remote()),
    );
    let e = decode_resource_with("istio-system.authz", &any, &|u| Err(format!("refused {u}")))
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "typed_config.config.vm_config.code.remote.http_uri.uri: refused oci://registry.example/wasm/authz:v2"
    );
}
