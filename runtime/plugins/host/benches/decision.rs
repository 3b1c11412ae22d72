//! Per-decision cost of the example policy plugin (`plugins/port-allowlist`): the same logic in native Rust, the
//! plugin on a reused (pooled) instance through the whole host chain, and the plugin on a fresh instance per call.
//! Run: `CARGO_TARGET_DIR=target-plugin cargo bench -p weft-plugin-host --bench decision`.
#![allow(clippy::unwrap_used)] // a test panics to fail

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use weft_plugin_host::testing::{Harness, build_plugin, conn};

const CONFIG: &str =
    r#"{"ports": [80, 443, "8000-8099"], "principals": ["spiffe://cluster.local/ns/shop/*"]}"#;
const PEER: &str = "spiffe://cluster.local/ns/shop/sa/frontend";

/// The plugin's rules, natively (same data structures and checks as `port-allowlist`'s `Rules::decide`).
struct Native {
    ports: Vec<(u16, u16)>,
    prefixes: Vec<String>,
}

impl Native {
    fn decide(&self, port: u16, peer: Option<&str>) -> Result<(), String> {
        if !self.ports.iter().any(|&(lo, hi)| lo <= port && port <= hi) {
            return Err(format!("not in the port allow-list: port {port}"));
        }
        if !peer.is_some_and(|p| self.prefixes.iter().any(|x| p.starts_with(x.as_str()))) {
            return Err("not in the port allow-list: peer".to_string());
        }
        Ok(())
    }
}

fn bench(c: &mut Criterion) {
    let wasm = build_plugin("plugins/port-allowlist").expect("build port-allowlist");
    let harness = Harness::policy(&wasm, CONFIG).expect("load");
    let allowed = conn(80, Some(PEER));
    assert!(harness.authorize(&allowed).is_allow());
    let native = Native {
        ports: vec![(80, 80), (443, 443), (8000, 8099)],
        prefixes: vec!["spiffe://cluster.local/ns/shop/".to_string()],
    };
    let mut g = c.benchmark_group("decision");
    g.bench_function("native", |b| {
        b.iter(|| {
            black_box(native.decide(
                black_box(allowed.dst.port()),
                black_box(allowed.peer_identity.as_deref()),
            ))
        })
    });
    g.bench_function("wasm_reused_instance", |b| {
        b.iter(|| black_box(harness.authorize(black_box(&allowed))))
    });
    g.sample_size(20);
    g.bench_function("wasm_fresh_instance", |b| {
        b.iter(|| black_box(harness.authorize_fresh(black_box(&allowed))))
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
