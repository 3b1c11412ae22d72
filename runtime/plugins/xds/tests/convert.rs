//! The ECDS conversion on resources as weft-control and istiod build them: a WeftPlugin, Envoy's network Wasm
//! filter (istiod's NETWORK WasmPlugin, with its pull secret in the VM's environment), a bare PluginConfig; every
//! configuration encoding; and refusals that name the field.
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::time::Duration;

use weft_plugin_xds::{Code, decode_resource, fetch_request};
use weft_proto::envoy::config::core::v3 as core;
use weft_proto::envoy::extensions::filters::network::wasm::v3::Wasm;
use weft_proto::envoy::extensions::wasm::v3::{self as wasm, plugin_config::Vm};
use weft_proto::type_url;
use weft_proto::weft::plugin::v1 as weft;
use weft_state::{FailurePolicy, PluginDirections, PluginKind, PluginRollout};

fn inline(bytes: &[u8]) -> core::AsyncDataSource {
    core::AsyncDataSource {
        specifier: Some(core::async_data_source::Specifier::Local(
            core::DataSource {
                specifier: Some(core::data_source::Specifier::InlineBytes(bytes.to_vec())),
            },
        )),
    }
}

fn remote(uri: &str, sha: &str) -> core::AsyncDataSource {
    core::AsyncDataSource {
        specifier: Some(core::async_data_source::Specifier::Remote(
            core::RemoteDataSource {
                http_uri: Some(core::HttpUri {
                    uri: uri.into(),
                    http_upstream_type: None,
                    timeout: Some(prost_types::Duration {
                        seconds: 7,
                        nanos: 0,
                    }),
                }),
                sha256: sha.into(),
                retry_policy: Some(core::RetryPolicy {
                    retry_back_off: Some(core::BackoffStrategy {
                        base_interval: Some(prost_types::Duration {
                            seconds: 0,
                            nanos: 200_000_000,
                        }),
                        max_interval: Some(prost_types::Duration {
                            seconds: 2,
                            nanos: 0,
                        }),
                    }),
                    num_retries: Some(4),
                }),
            },
        )),
    }
}

fn string_value(s: &str) -> prost_types::Any {
    prost_types::Any {
        type_url: type_url::STRING_VALUE.into(),
        value: prost::Message::encode_to_vec(&s.to_string()),
    }
}

fn plugin_config(
    code: core::AsyncDataSource,
    configuration: Option<prost_types::Any>,
) -> wasm::PluginConfig {
    wasm::PluginConfig {
        name: "ns.authz".into(),
        root_id: String::new(),
        vm: Some(Vm::VmConfig(wasm::VmConfig {
            runtime: "envoy.wasm.runtime.v8".into(),
            code: Some(code),
            ..Default::default()
        })),
        configuration,
        fail_open: false,
        failure_policy: 0,
    }
}

fn tec(name: &str, any: prost_types::Any) -> prost_types::Any {
    weft_proto::to_any(
        type_url::EXTENSION_CONFIG,
        &core::TypedExtensionConfig {
            name: name.into(),
            typed_config: Some(any),
        },
    )
}

#[test]
fn a_weft_plugin_carries_everything() {
    let sha = "ab".repeat(32);
    let wp = weft::WeftPlugin {
        config: Some(wasm::PluginConfig {
            failure_policy: wasm::FailurePolicy::FailOpen as i32,
            ..plugin_config(
                remote(
                    "oci://registry.local:5000/weft/authz:v1",
                    &format!("sha256:{}", sha.to_uppercase()),
                ),
                Some(string_value(r#"{"ports":[80]}"#)),
            )
        }),
        kind: weft::Kind::Policy as i32,
        priority: -5,
        selector: Some(weft::WorkloadSelector {
            namespaces: vec!["shop".into()],
            workloads: vec!["frontend".into()],
        }),
        directions: Some(weft::Directions {
            inbound: true,
            outbound: true,
        }),
        rollout: Some(weft::Rollout {
            window: Some(prost_types::Duration {
                seconds: 30,
                nanos: 0,
            }),
            max_failure_ratio: 0.25,
            min_calls: 8,
            disabled: false,
        }),
        recheck: Some(false),
        shadow: None,
    };
    let r = decode_resource(
        "authz",
        &tec("authz", weft_proto::to_any(type_url::WEFT_PLUGIN, &wp)),
    )
    .unwrap();
    assert_eq!(r.name, "authz");
    assert_eq!(r.sha256.as_deref(), Some(sha.as_str()));
    assert_eq!(r.config, r#"{"ports":[80]}"#);
    assert_eq!(r.failure_policy, FailurePolicy::FailOpen);
    assert_eq!(
        (r.kind, r.priority, r.recheck),
        (Some(PluginKind::Policy), -5, false)
    );
    assert_eq!(r.selector.namespaces, vec!["shop".to_string()]);
    assert_eq!(
        r.directions,
        PluginDirections {
            inbound: true,
            outbound: true
        }
    );
    assert_eq!(
        r.rollout,
        Some(PluginRollout {
            window: Duration::from_secs(30),
            max_failure_ppm: 250_000,
            min_calls: 8,
            disabled: false
        })
    );
    let req = fetch_request(&r).unwrap();
    assert_eq!(req.uri, "oci://registry.local:5000/weft/authz:v1");
    assert_eq!(
        (req.timeout, req.retries),
        (Some(Duration::from_secs(7)), Some(4))
    );
    assert_eq!(
        req.backoff,
        Some(weft_fetch::Backoff {
            base: Duration::from_millis(200),
            max: Duration::from_secs(2)
        })
    );
}

#[test]
fn istiods_network_wasm_filter_with_its_pull_secret() {
    // What istiod emits for a NETWORK WasmPlugin: Envoy's Wasm network filter, the JSON pluginConfig as a
    // StringValue, fail_open from failStrategy, and the image pull secret in the VM's environment.
    let mut config = plugin_config(
        remote("oci://ghcr.io/org/authz:1.0", ""),
        Some(string_value(r#"{"deny":["8080"]}"#)),
    );
    config.fail_open = true;
    if let Some(Vm::VmConfig(vm)) = &mut config.vm {
        vm.environment_variables = Some(wasm::EnvironmentVariables {
            host_env_keys: vec![],
            key_values: HashMap::from([
                (
                    "ISTIO_META_WASM_IMAGE_PULL_SECRET".to_string(),
                    r#"{"auths":{}}"#.to_string(),
                ),
                (
                    "ISTIO_META_WASM_PLUGIN_RESOURCE_VERSION".to_string(),
                    "42".to_string(),
                ),
            ]),
        });
    }
    let any = weft_proto::to_any(
        type_url::WASM_NETWORK_FILTER,
        &Wasm {
            config: Some(config),
        },
    );
    let r = decode_resource("istio-system.authz", &tec("istio-system.authz", any)).unwrap();
    assert_eq!(r.failure_policy, FailurePolicy::FailOpen);
    assert_eq!((r.kind, r.sha256.as_deref()), (None, None));
    assert_eq!(r.directions, PluginDirections::default());
    match &r.code {
        Code::Remote(rc) => assert_eq!(rc.pull_secret.as_deref(), Some(&br#"{"auths":{}}"#[..])),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_bare_plugin_config_with_inline_code_and_every_configuration_encoding() {
    let bytes_value = prost_types::Any {
        type_url: type_url::BYTES_VALUE.into(),
        value: prost::Message::encode_to_vec(&b"raw-config".to_vec()),
    };
    let st = prost_types::Struct {
        fields: [
            (
                "ports".to_string(),
                prost_types::Value {
                    kind: Some(prost_types::value::Kind::ListValue(
                        prost_types::ListValue {
                            values: vec![prost_types::Value {
                                kind: Some(prost_types::value::Kind::NumberValue(80.0)),
                            }],
                        },
                    )),
                },
            ),
            (
                "on".to_string(),
                prost_types::Value {
                    kind: Some(prost_types::value::Kind::BoolValue(true)),
                },
            ),
        ]
        .into_iter()
        .collect(),
    };
    let struct_any = weft_proto::to_any(type_url::STRUCT, &st);
    for (configuration, expected) in [
        (None, String::new()),
        (Some(bytes_value), "raw-config".to_string()),
        (
            Some(struct_any),
            r#"{"on":true,"ports":[80.0]}"#.to_string(),
        ),
    ] {
        let pc = plugin_config(inline(b"\0asm-bytes"), configuration);
        let r = decode_resource(
            "p",
            &tec("", weft_proto::to_any(type_url::WASM_PLUGIN_CONFIG, &pc)),
        )
        .unwrap();
        assert_eq!(
            r.code,
            Code::Inline(std::sync::Arc::new(b"\0asm-bytes".to_vec()))
        );
        assert_eq!(r.failure_policy, FailurePolicy::FailClosed);
        let got: serde_json::Value =
            serde_json::from_str(&r.config).unwrap_or(serde_json::Value::String(r.config.clone()));
        let want: serde_json::Value =
            serde_json::from_str(&expected).unwrap_or(serde_json::Value::String(expected.clone()));
        assert_eq!(got, want);
    }
}

#[test]
fn refusals_name_the_field() {
    let pc = |code| weft_proto::to_any(type_url::WASM_PLUGIN_CONFIG, &plugin_config(code, None));
    let file = core::AsyncDataSource {
        specifier: Some(core::async_data_source::Specifier::Local(
            core::DataSource {
                specifier: Some(core::data_source::Specifier::Filename("/etc/shadow".into())),
            },
        )),
    };
    let wp = |f: &dyn Fn(&mut weft::WeftPlugin)| {
        let mut w = weft::WeftPlugin {
            config: Some(plugin_config(inline(b"x"), None)),
            ..Default::default()
        };
        f(&mut w);
        weft_proto::to_any(type_url::WEFT_PLUGIN, &w)
    };
    let cases: Vec<(&str, prost_types::Any, &str)> = vec![
        ("p", pc(file), "typed_config.vm_config.code.local.filename"),
        (
            "p",
            pc(remote("http://x/p.wasm", "")),
            "typed_config.vm_config.code.remote.http_uri.uri",
        ),
        (
            "p",
            pc(remote("https://x/p.wasm", "1234")),
            "typed_config.vm_config.code.remote.sha256",
        ),
        (
            "p",
            pc(core::AsyncDataSource { specifier: None }),
            "typed_config.vm_config.code",
        ),
        ("p", string_value("x"), "typed_config.type_url"),
        ("p", wp(&|w| w.kind = 9), "typed_config.kind"),
        (
            "p",
            wp(&|w| w.directions = Some(weft::Directions::default())),
            "typed_config.directions",
        ),
        (
            "p",
            wp(&|w| {
                w.selector = Some(weft::WorkloadSelector {
                    namespaces: vec![" ".into()],
                    workloads: vec![],
                })
            }),
            "typed_config.selector.namespaces[0]",
        ),
        (
            "p",
            wp(&|w| {
                w.rollout = Some(weft::Rollout {
                    max_failure_ratio: 1.5,
                    window: Some(prost_types::Duration {
                        seconds: 1,
                        nanos: 0,
                    }),
                    ..Default::default()
                })
            }),
            "typed_config.rollout.max_failure_ratio",
        ),
        (
            "p",
            wp(&|w| w.rollout = Some(weft::Rollout::default())),
            "typed_config.rollout.window",
        ),
        ("p", wp(&|w| w.config = None), "typed_config.config"),
        (
            "p",
            wp(&|w| {
                if let Some(c) = &mut w.config {
                    c.configuration = Some(prost_types::Any {
                        type_url: "type.googleapis.com/google.protobuf.Int32Value".into(),
                        value: vec![],
                    })
                }
            }),
            "typed_config.config.configuration",
        ),
        (
            "p",
            wp(&|w| {
                if let Some(c) = &mut w.config {
                    c.failure_policy = 99
                }
            }),
            "typed_config.config.failure_policy",
        ),
    ];
    for (name, any, field) in cases {
        let e = decode_resource(name, &tec(name, any)).unwrap_err();
        assert_eq!(e.field, field, "{e}");
        assert!(!e.reason.is_empty());
    }
    // The TypedExtensionConfig's name must be the resource name.
    let e = decode_resource("a", &tec("b", pc(inline(b"x")))).unwrap_err();
    assert_eq!(e.field, "name");
    // Not a TypedExtensionConfig at all.
    let e = decode_resource("a", &string_value("x")).unwrap_err();
    assert_eq!(e.field, "resource");
}
