//! The extension-config handler with the real plugin host and real plugins, feeding a real `StateStore` that a
//! task applies to the host exactly as `weft run` does: a batch where a broken plugin, a plugin whose configure
//! fails and a malformed resource are each refused with their reason while the good one loads (and is served
//! before the handler returns); a broken update keeps the previous version serving and in the state; a rollback
//! becomes a NACK carrying a RollbackReport and puts the restored version back into the state.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::BoxFuture;
use weft_hooks::ConnectionHooks;
use weft_plugin_host::testing::{build_plugin, conn};
use weft_plugin_host::{HostConfig, ManualClock, PluginHost};
use weft_plugin_xds::{
    EcdsHandler, PluginSink, Resource, spawn_rollback_reporter, spawn_shadow_reporter,
};
use weft_proto::envoy::config::core::v3 as core;
use weft_proto::envoy::extensions::wasm::v3::{self as wasm, plugin_config::Vm};
use weft_proto::type_url;
use weft_proto::weft::plugin::v1 as weft;
use weft_state::{PluginSpec, StateStore};

const PEER: &str = "spiffe://cluster.local/ns/shop/sa/frontend";

/// The node's state as one source sees it: this source's plugins, swapped into the store whole.
struct StateSink {
    state: Arc<StateStore>,
    plugins: Mutex<BTreeMap<String, PluginSpec>>,
}

impl PluginSink for StateSink {
    fn put(
        &self,
        upserts: Vec<PluginSpec>,
        removals: Vec<String>,
    ) -> BoxFuture<'_, Result<u64, String>> {
        let mut p = self.plugins.lock().unwrap();
        for r in removals {
            p.remove(&r);
        }
        for s in upserts {
            p.insert(s.name.clone(), s);
        }
        let v = self
            .state
            .replace_parts(vec![], vec![], vec![], p.values().cloned().collect());
        Box::pin(async move { Ok(v) })
    }
}

struct Node {
    host: Arc<PluginHost>,
    state: Arc<StateStore>,
    handler: Arc<EcdsHandler>,
    clock: Arc<ManualClock>,
    _apply: tokio::task::JoinHandle<()>,
}

fn node() -> Node {
    let clock = Arc::new(ManualClock::default());
    let host = Arc::new(
        PluginHost::new(HostConfig {
            prewarm_instances: 8,
            max_idle_per_plugin: 8,
            clock: clock.clone(),
            ..HostConfig::default()
        })
        .unwrap(),
    );
    let state = Arc::new(StateStore::new());
    // What `weft run` does: every state version is applied to the host, in order.
    let apply = {
        let (state, host) = (state.clone(), host.clone());
        let mut rx = state.subscribe();
        tokio::spawn(async move {
            while rx.changed().await.is_ok() {
                let cur = state.current();
                host.apply_version_async(
                    cur.version,
                    cur.plugins.values().cloned().collect(),
                    vec![],
                )
                .await;
            }
        })
    };
    let fetcher = weft_fetch::Fetcher::new(weft_fetch::FetchConfig::default()).unwrap();
    let sink = Arc::new(StateSink {
        state: state.clone(),
        plugins: Mutex::new(BTreeMap::new()),
    });
    let handler = Arc::new(EcdsHandler::new(fetcher, host.clone(), sink));
    Node {
        host,
        state,
        handler,
        clock,
        _apply: apply,
    }
}

fn code(path: &std::path::Path) -> Vec<u8> {
    let lock = std::fs::File::create(
        weft_plugin_host::testing::wasm_target_dir().join(".weft-build.lock"),
    )
    .unwrap();
    lock.lock().unwrap();
    std::fs::read(path).unwrap()
}

fn config_any(json: &str) -> prost_types::Any {
    prost_types::Any {
        type_url: type_url::STRING_VALUE.into(),
        value: prost::Message::encode_to_vec(&json.to_string()),
    }
}

fn plugin_config(local: core::data_source::Specifier, json: &str) -> wasm::PluginConfig {
    wasm::PluginConfig {
        vm: Some(Vm::VmConfig(wasm::VmConfig {
            code: Some(core::AsyncDataSource {
                specifier: Some(core::async_data_source::Specifier::Local(
                    core::DataSource {
                        specifier: Some(local),
                    },
                )),
            }),
            ..Default::default()
        })),
        configuration: Some(config_any(json)),
        ..Default::default()
    }
}

/// A WeftPlugin resource with inline code; the kind is left to the component's world.
fn weft_resource(name: &str, bytes: &[u8], json: &str, rollout: Option<weft::Rollout>) -> Resource {
    let wp = weft::WeftPlugin {
        config: Some(plugin_config(
            core::data_source::Specifier::InlineBytes(bytes.to_vec()),
            json,
        )),
        rollout,
        ..Default::default()
    };
    resource(name, weft_proto::to_any(type_url::WEFT_PLUGIN, &wp))
}

fn resource(name: &str, typed: prost_types::Any) -> Resource {
    Resource {
        name: name.into(),
        any: weft_proto::to_any(
            type_url::EXTENSION_CONFIG,
            &core::TypedExtensionConfig {
                name: name.into(),
                typed_config: Some(typed),
            },
        ),
    }
}

fn allowed(host: &PluginHost, port: u16) -> bool {
    host.authorize(&conn(port, Some(PEER))).is_allow()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_plugin_is_refused_with_its_reason_while_the_rest_of_the_batch_applies() {
    let n = node();
    let allowlist = code(&build_plugin("plugins/port-allowlist").unwrap());
    let misbehave = code(&build_plugin("plugins/testdata/misbehave").unwrap());
    let refused = n
        .handler
        .apply(
            vec![
                weft_resource("ports", &allowlist, r#"{"ports": [80]}"#, None),
                weft_resource("garbage", b"\0asm\x01\0\0\0 not a component", "", None),
                weft_resource("refuses", &misbehave, "configure-error", None),
                resource(
                    "malformed",
                    weft_proto::to_any(
                        type_url::WASM_PLUGIN_CONFIG,
                        &plugin_config(
                            core::data_source::Specifier::Filename("/etc/passwd".into()),
                            "{}",
                        ),
                    ),
                ),
            ],
            vec![],
        )
        .await;
    let reasons: BTreeMap<&str, &str> = refused
        .iter()
        .map(|r| (r.name.as_str(), r.reason.as_str()))
        .collect();
    assert_eq!(reasons.len(), 3, "{refused:?}");
    assert!(
        reasons["garbage"].contains("not a valid WebAssembly component"),
        "{refused:?}"
    );
    assert!(
        reasons["refuses"].contains("configure rejected the config"),
        "{refused:?}"
    );
    assert!(
        reasons["malformed"].contains("typed_config.vm_config.code.local.filename"),
        "{refused:?}"
    );
    // The good one serves as soon as the handler returned (the ACK is sent then): port 80 allowed, 81 denied.
    assert!(allowed(&n.host, 80));
    assert!(!allowed(&n.host, 81));
    // The state holds what serves, and only that.
    let names: Vec<String> = n.state.current().plugins.keys().cloned().collect();
    assert_eq!(names, vec!["ports".to_string()]);

    // A broken update of the serving plugin: refused, the previous version keeps serving and stays in the state.
    let before = n.state.current().plugins["ports"].sha256.clone();
    let refused = n
        .handler
        .apply(
            vec![weft_resource("ports", &misbehave, "configure-error", None)],
            vec![],
        )
        .await;
    assert_eq!(refused.len(), 1);
    assert!(
        refused[0].reason.contains("configure rejected"),
        "{refused:?}"
    );
    assert!(allowed(&n.host, 80) && !allowed(&n.host, 81));
    n.host.wait_applied(n.state.version()).await;
    assert_eq!(n.state.current().plugins["ports"].sha256, before);

    // A good update, then a removal: both ACKed.
    let refused = n
        .handler
        .apply(
            vec![weft_resource(
                "ports",
                &allowlist,
                r#"{"ports": [81]}"#,
                None,
            )],
            vec![],
        )
        .await;
    assert!(refused.is_empty(), "{refused:?}");
    assert!(allowed(&n.host, 81) && !allowed(&n.host, 80));
    let refused = n.handler.apply(vec![], vec!["ports".into()]).await;
    assert!(refused.is_empty());
    assert!(allowed(&n.host, 80) && allowed(&n.host, 81));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollback_is_nacked_with_a_rollback_report_and_the_state_restored() {
    let n = node();
    let allowlist = code(&build_plugin("plugins/port-allowlist").unwrap());
    let misbehave = code(&build_plugin("plugins/testdata/misbehave").unwrap());
    let (tx, mut nacks) = tokio::sync::mpsc::unbounded_channel();
    let _reporter = spawn_rollback_reporter(
        &n.host,
        n.handler.clone(),
        Arc::new(
            move |name: &str, reason: &str, details: Vec<prost_types::Any>| {
                let _ = tx.send((name.to_string(), reason.to_string(), details));
            },
        ),
    );
    let rollout = weft::Rollout {
        window: Some(prost_types::Duration {
            seconds: 60,
            nanos: 0,
        }),
        max_failure_ratio: 0.5,
        min_calls: 4,
        disabled: false,
    };
    let v1 = weft_resource("p", &allowlist, r#"{"ports": [666]}"#, Some(rollout));
    assert!(n.handler.apply(vec![v1], vec![]).await.is_empty());
    let v1_sha = n.state.current().plugins["p"].sha256.clone();
    // The new version starts trapping on port 666 (misbehave "trap"); it loads fine, so it is ACKed.
    let v2 = weft_resource("p", &misbehave, "trap", Some(rollout));
    assert!(n.handler.apply(vec![v2.clone()], vec![]).await.is_empty());
    for _ in 0..4 {
        assert!(!allowed(&n.host, 666));
    }
    let (name, reason, details) = tokio::time::timeout(Duration::from_secs(60), nacks.recv())
        .await
        .expect("no rollback NACK within 60 s")
        .unwrap();
    assert_eq!(name, "p");
    assert!(reason.contains("rolled back"), "{reason}");
    let report: weft::RollbackReport =
        weft_proto::from_any(type_url::ROLLBACK_REPORT, &details[0]).unwrap();
    assert_eq!((report.calls, report.failures, report.traps), (4, 4, 4));
    assert_eq!(Some(report.restored_sha256.clone()), v1_sha);
    assert!((report.max_failure_ratio - 0.5).abs() < 1e-9);
    assert!(allowed(&n.host, 666));
    // The state carries the restored version again; the same code resent is NACKed.
    n.host.wait_applied(n.state.version()).await;
    assert_eq!(n.state.current().plugins["p"].sha256, v1_sha);
    let refused = n.handler.apply(vec![v2], vec![]).await;
    assert_eq!(refused.len(), 1);
    assert!(
        refused[0]
            .reason
            .contains("refused until different code arrives"),
        "{refused:?}"
    );
    assert!(allowed(&n.host, 666));
    let _ = &n.clock;
}

/// A WeftPlugin resource with inline code and an inline shadow.
fn shadowed_resource(name: &str, bytes: &[u8], json: &str, shadow_json: &str) -> Resource {
    let wp = weft::WeftPlugin {
        config: Some(plugin_config(
            core::data_source::Specifier::InlineBytes(bytes.to_vec()),
            json,
        )),
        shadow: Some(weft::Shadow {
            code: Some(core::AsyncDataSource {
                specifier: Some(core::async_data_source::Specifier::Local(
                    core::DataSource {
                        specifier: Some(core::data_source::Specifier::InlineBytes(bytes.to_vec())),
                    },
                )),
            }),
            configuration: Some(config_any(shadow_json)),
        }),
        ..Default::default()
    };
    resource(name, weft_proto::to_any(type_url::WEFT_PLUGIN, &wp))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_is_carried_into_the_state_and_decides_beside_the_serving_version() {
    let n = node();
    let allowlist = code(&build_plugin("plugins/port-allowlist").unwrap());
    let refused = n
        .handler
        .apply(
            vec![shadowed_resource(
                "ports",
                &allowlist,
                r#"{"ports": [80]}"#,
                r#"{"ports": [81]}"#,
            )],
            vec![],
        )
        .await;
    assert!(refused.is_empty(), "{refused:?}");
    let spec = n.state.current().plugins["ports"].clone();
    let shadow = spec.shadow.clone().unwrap();
    assert_eq!(shadow.config, r#"{"ports": [81]}"#);
    assert_eq!(shadow.sha256, Some(weft_fetch::sha256_hex(&allowlist)));
    // The serving verdict is enforced; the shadow's is booked.
    assert!(allowed(&n.host, 80));
    let r = weft_testkit::eventually("the shadow's decision booked", || {
        std::future::ready(n.host.shadow_report("ports").filter(|r| {
            r.decisions
                .iter()
                .any(|c| c.serving == "allow" && c.shadow == "deny" && c.count >= 1)
        }))
    })
    .await;
    assert_eq!(r.sha256, Some(weft_fetch::sha256_hex(&allowlist)));
    // The shadow reporter sends those figures, with the serving version's sha256, as a weft.plugin.v1.ShadowReport.
    let sent: Arc<Mutex<Vec<prost_types::Any>>> = Arc::default();
    let record = sent.clone();
    let reporter = spawn_shadow_reporter(
        &n.host,
        Arc::new(move |details: &[prost_types::Any]| {
            record.lock().unwrap().extend_from_slice(details);
            true
        }),
        Duration::from_millis(20),
    );
    let any = weft_testkit::eventually("the shadow report sent", || {
        std::future::ready(sent.lock().unwrap().first().cloned())
    })
    .await;
    reporter.abort();
    assert_eq!(any.type_url, type_url::SHADOW_REPORT);
    let report: weft::ShadowReport = prost::Message::decode(any.value.as_slice()).unwrap();
    assert_eq!(report.plugin, "ports");
    assert_eq!(report.serving_sha256, weft_fetch::sha256_hex(&allowlist));
    assert_eq!(report.shadow_sha256, weft_fetch::sha256_hex(&allowlist));
    assert!(
        report
            .decisions
            .iter()
            .any(|c| c.direction == "inbound" && c.serving == "allow" && c.shadow == "deny"),
        "{report:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_whose_code_does_not_load_is_refused_and_a_telemetry_shadow_is_taken() {
    let n = node();
    let allowlist = code(&build_plugin("plugins/port-allowlist").unwrap());
    let telemetry = code(&build_plugin("plugins/conn-counter").unwrap());
    let mut garbage = shadowed_resource("garbage", &allowlist, r#"{"ports": [80]}"#, "{}");
    {
        let tec: core::TypedExtensionConfig =
            prost::Message::decode(garbage.any.value.as_slice()).unwrap();
        let mut wp: weft::WeftPlugin =
            prost::Message::decode(tec.typed_config.unwrap().value.as_slice()).unwrap();
        wp.shadow.as_mut().unwrap().code = Some(core::AsyncDataSource {
            specifier: Some(core::async_data_source::Specifier::Local(
                core::DataSource {
                    specifier: Some(core::data_source::Specifier::InlineBytes(
                        b"\0asm\x01\0\0\0 not a component".to_vec(),
                    )),
                },
            )),
        });
        garbage = resource("garbage", weft_proto::to_any(type_url::WEFT_PLUGIN, &wp));
    }
    let refused = n
        .handler
        .apply(
            vec![
                garbage,
                shadowed_resource("counter", &telemetry, "{}", "{}"),
            ],
            vec![],
        )
        .await;
    let reasons: BTreeMap<&str, &str> = refused
        .iter()
        .map(|r| (r.name.as_str(), r.reason.as_str()))
        .collect();
    assert_eq!(reasons.len(), 1, "{refused:?}");
    assert!(
        reasons["garbage"].starts_with("shadow code: "),
        "{refused:?}"
    );
    let state = n.state.current();
    let plugins: Vec<_> = state.plugins.values().collect();
    assert_eq!(plugins.len(), 1, "{plugins:?}");
    assert_eq!(plugins[0].name, "counter");
    assert!(plugins[0].shadow.is_some(), "{plugins:?}");
}
