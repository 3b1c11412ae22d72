//! A plugin resource weft-control serves is what a node reads back: model → ECDS (`xds::encode::plugin`,
//! weft-control's side) → model (`xds::plugin`, the node's side), field for field, for inline and remote code and
//! every optional field set and unset.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use weft_state::xds::encode::plugin::extension_config;
use weft_state::xds::plugin::{
    Code, PluginResource, RemoteCode, RetryBackoff, ShadowResource, decode_resource_with,
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
        shadow: None,
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
        shadow: None,
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
fn an_inline_shadow_reads_back_the_same() {
    let mut r = inline();
    r.kind = Some(PluginKind::Policy);
    r.shadow = Some(ShadowResource {
        code: Code::Inline(Arc::new(b"\0asm the shadow's bytes".to_vec())),
        sha256: None,
        config: r#"{"ports":[]}"#.into(),
    });
    assert_eq!(round_trip(&r), r);
    // Without a configuration too.
    r.shadow = Some(ShadowResource {
        code: Code::Inline(Arc::new(b"\0asm".to_vec())),
        sha256: None,
        config: String::new(),
    });
    assert_eq!(round_trip(&r), r);
}

#[test]
fn a_remote_shadow_beside_remote_code_reads_back_the_same() {
    let mut r = remote();
    r.kind = None;
    let Code::Remote(serving) = &r.code else {
        unreachable!()
    };
    r.shadow = Some(ShadowResource {
        code: Code::Remote(RemoteCode {
            uri: "oci://registry.example/wasm/authz:v3".into(),
            // The VM's pull secret is the serving code's and the shadow's.
            pull_secret: serving.pull_secret.clone(),
            timeout: Some(Duration::from_secs(9)),
            retries: None,
            backoff: None,
        }),
        sha256: Some("cd".repeat(32)),
        config: r#"{"ports":[9090]}"#.into(),
    });
    assert_eq!(round_trip(&r), r);
}

#[test]
fn a_remote_shadow_beside_inline_code_keeps_its_pull_secret() {
    let mut r = inline();
    r.shadow = Some(ShadowResource {
        code: Code::Remote(RemoteCode {
            uri: "https://plugins.example/allowlist-v2.wasm".into(),
            timeout: None,
            retries: Some(2),
            backoff: None,
            pull_secret: Some(b"secret".to_vec()),
        }),
        sha256: Some("ef".repeat(32)),
        config: String::new(),
    });
    assert_eq!(round_trip(&r), r);
}

#[test]
fn a_shadow_on_a_telemetry_plugin_round_trips_into_its_spec() {
    let mut r = remote();
    r.shadow = Some(ShadowResource {
        code: Code::Inline(Arc::new(b"\0asm".to_vec())),
        sha256: None,
        config: "{\"prefix\": \"next\"}".into(),
    });
    assert_eq!(round_trip(&r), r);
    // Kind from the component: taken when the spec is made.
    r.kind = None;
    let spec = round_trip(&r)
        .into_spec(
            Arc::new(b"x".to_vec()),
            "00".repeat(32),
            PluginKind::Telemetry,
            Some((Arc::new(b"y".to_vec()), "11".repeat(32))),
        )
        .unwrap();
    let shadow = spec.shadow.unwrap();
    assert_eq!(shadow.sha256.as_deref(), Some("11".repeat(32).as_str()));
    assert_eq!(shadow.config, "{\"prefix\": \"next\"}");
}

#[test]
fn a_shadow_is_carried_into_the_spec() {
    let mut r = inline();
    r.shadow = Some(ShadowResource {
        code: Code::Inline(Arc::new(b"\0asm v2".to_vec())),
        sha256: None,
        config: "deny all".into(),
    });
    let spec = round_trip(&r)
        .into_spec(
            Arc::new(b"\0asm component bytes".to_vec()),
            "00".repeat(32),
            PluginKind::Policy,
            Some((Arc::new(b"\0asm v2".to_vec()), "22".repeat(32))),
        )
        .unwrap();
    let shadow = spec.shadow.unwrap();
    assert_eq!(shadow.sha256.as_deref(), Some("22".repeat(32).as_str()));
    assert_eq!(shadow.config, "deny all");
    assert_eq!(
        shadow.source,
        weft_state::PluginSource::Inline(Arc::new(b"\0asm v2".to_vec()))
    );
}

#[test]
fn a_shadow_without_code_is_refused_naming_the_field() {
    let mut r = inline();
    r.kind = Some(PluginKind::Policy);
    let mut tec = extension_config(&r);
    let any = tec.typed_config.as_mut().unwrap();
    let mut wp: weft_proto::weft::plugin::v1::WeftPlugin =
        prost::Message::decode(any.value.as_slice()).unwrap();
    wp.shadow = Some(weft_proto::weft::plugin::v1::Shadow::default());
    any.value = prost::Message::encode_to_vec(&wp);
    let e = weft_state::xds::plugin::decode_with(&r.name, &tec, &|_| Ok(())).unwrap_err();
    assert_eq!(e.field, "typed_config.shadow.code");
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
