//! Push-to-effect of a plugin on a node, the node's part of an xDS push: an extension-config resource (a
//! WeftPlugin with inline code) handed to the node's handler → decoded → kind from the component → into the state →
//! the plugin host loads and configures the new version (pre-warmed instances) → chain swapped → the next
//! connection gets the new verdict. The handler returns (and the ACK would be sent) only then, so this is also
//! push-to-ACK. Each push flips port-allowlist between allowing 80 and 81, and the bench checks that the first
//! connection after the push sees the flip. Prints the median and p99 over BENCH_PUSHES pushes (default 200).
//!   cargo bench -p weft-conformance --bench plugin_push
#![allow(clippy::unwrap_used)] // a bench panics to fail

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;
use weft_hooks::ConnectionHooks;
use weft_plugin_host::testing::{build_plugin, conn};
use weft_plugin_host::{HostConfig, PluginHost};
use weft_plugin_xds::{EcdsHandler, PluginSink, Resource};
use weft_proto::envoy::config::core::v3 as core;
use weft_proto::envoy::extensions::wasm::v3::{self as wasm, plugin_config::Vm};
use weft_proto::type_url;
use weft_proto::weft::plugin::v1 as weft;
use weft_state::{PluginSpec, StateStore};

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

fn resource(bytes: &[u8], port: u16) -> Resource {
    let wp = weft::WeftPlugin {
        config: Some(wasm::PluginConfig {
            vm: Some(Vm::VmConfig(wasm::VmConfig {
                code: Some(core::AsyncDataSource {
                    specifier: Some(core::async_data_source::Specifier::Local(
                        core::DataSource {
                            specifier: Some(core::data_source::Specifier::InlineBytes(
                                bytes.to_vec(),
                            )),
                        },
                    )),
                }),
                ..Default::default()
            })),
            configuration: Some(prost_types::Any {
                type_url: type_url::STRING_VALUE.into(),
                value: prost::Message::encode_to_vec(&format!(r#"{{"ports": [{port}]}}"#)),
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    Resource {
        name: "ports".into(),
        any: weft_proto::to_any(
            type_url::EXTENSION_CONFIG,
            &core::TypedExtensionConfig {
                name: "ports".into(),
                typed_config: Some(weft_proto::to_any(type_url::WEFT_PLUGIN, &wp)),
            },
        ),
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn main() {
    let pushes: usize = std::env::var("BENCH_PUSHES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let code = std::fs::read(build_plugin("plugins/port-allowlist").unwrap()).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let host = Arc::new(PluginHost::new(HostConfig::default()).unwrap());
        let state = Arc::new(StateStore::new());
        let _apply = {
            let (state, host) = (state.clone(), host.clone());
            let mut rx = state.subscribe();
            tokio::spawn(async move {
                while rx.changed().await.is_ok() {
                    let cur = state.current();
                    host.apply_version_async(cur.version, cur.plugins.values().cloned().collect(), vec![])
                        .await;
                }
            })
        };
        let sink = Arc::new(StateSink { state: state.clone(), plugins: Mutex::new(BTreeMap::new()) });
        let handler = EcdsHandler::new(
            weft_fetch::Fetcher::new(weft_fetch::FetchConfig::default()).unwrap(),
            host.clone(),
            sink,
        );
        let peer = Some("spiffe://cluster.local/ns/a/sa/b");
        // Warm-up: the first load compiles the component (cached by content hash afterwards).
        assert!(handler.apply(vec![resource(&code, 81)], vec![]).await.is_empty());
        let mut samples = Vec::with_capacity(pushes);
        for i in 0..pushes {
            let port = if i % 2 == 0 { 80 } else { 81 };
            let other = if port == 80 { 81 } else { 80 };
            let t0 = Instant::now();
            let refused = handler.apply(vec![resource(&code, port)], vec![]).await;
            let allowed = host.authorize(&conn(port, peer)).is_allow();
            let took = t0.elapsed();
            assert!(refused.is_empty(), "{refused:?}");
            assert!(allowed && !host.authorize(&conn(other, peer)).is_allow(), "push {i} not in effect");
            samples.push(took);
        }
        samples.sort();
        println!(
            "plugin push-to-effect (node side, {pushes} pushes, config change of port-allowlist): median {:.2} ms, p99 {:.2} ms, max {:.2} ms",
            percentile(&samples, 0.5).as_secs_f64() * 1e3,
            percentile(&samples, 0.99).as_secs_f64() * 1e3,
            samples[samples.len() - 1].as_secs_f64() * 1e3,
        );
    });
}
