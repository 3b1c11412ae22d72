//! Decision cost of `plugins/istio-authz` with 10, 1,000 and 10,000 policies in the mesh (10 of which apply to the
//! destination workload, see `synthetic`): the plugin's engine compiled natively (the same source file) against
//! the plugin on a reused instance through the whole host chain, with the mesh's root-namespace policy (the
//! plugin's scope is `all`) and without it (the scope names destinations, and the connection's destination is in
//! it: the host checks the scope, then calls the plugin).
//! Run: `CARGO_TARGET_DIR=target-plugin cargo bench -p weft-plugin-host --bench istio_authz`; medians are in
//! `target-plugin/criterion/istio_authz/*/new/estimates.json` and printed at the end.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../tests/istio_authz_native/mod.rs"]
mod istio_authz_native;

use std::hint::black_box;
use std::sync::Arc;

use criterion::{BenchmarkId, Criterion, criterion_group};
use weft_plugin_host::testing::{Harness, build_plugin};

const SIZES: [usize; 3] = [10, 1_000, 10_000];

fn bench(c: &mut Criterion) {
    let wasm = build_plugin("plugins/istio-authz").expect("build istio-authz");
    let conn = istio_authz_native::synthetic_conn();
    let mut g = c.benchmark_group("istio_authz");
    // The host chain and the component call alone: no policies, the plugin allows without reading anything.
    let empty = Harness::policy(&wasm, "").expect("load");
    assert!(empty.authorize(&conn).is_allow());
    g.bench_function(BenchmarkId::new("wasm_no_policies", 0), |b| {
        b.iter(|| black_box(empty.authorize(black_box(&conn))))
    });
    for n in SIZES {
        let mesh = istio_authz_native::synthetic(n);
        let index = istio_authz_native::index(&mesh);
        assert_eq!(istio_authz_native::decide(&index, &conn), Ok(()));
        g.bench_with_input(BenchmarkId::new("native", n), &n, |b, _| {
            b.iter(|| black_box(istio_authz_native::decide(&index, black_box(&conn))))
        });

        let harness = Harness::policy(&wasm, r#"{"logDryRun": false}"#).expect("load");
        let mesh: Vec<_> = mesh.into_iter().map(Arc::new).collect();
        let report = harness.set_policies(&mesh);
        assert!(report.rejected().is_empty(), "{report:?}");
        assert!(harness.authorize(&conn).is_allow());
        g.bench_with_input(BenchmarkId::new("wasm", n), &n, |b, _| {
            b.iter(|| black_box(harness.authorize(black_box(&conn))))
        });
        if n == 1_000 {
            // A node decides for many destination workloads: 48 in turn, each its own metadata (more than an
            // instance's table keeps if it kept too few, and each must then be lent again under a new key).
            let conns: Vec<_> = (0..48)
                .map(|i| {
                    let mut c = conn.clone();
                    if let Some(w) = &conn.dst_workload {
                        let mut meta = (**w).clone();
                        meta.name = format!("server-{i}");
                        c.dst_workload = Some(Arc::new(meta));
                    }
                    c
                })
                .collect();
            assert!(conns.iter().all(|c| harness.authorize(c).is_allow()));
            let mut i = 0;
            g.bench_with_input(BenchmarkId::new("wasm_48_destinations", n), &n, |b, _| {
                b.iter(|| {
                    i = (i + 1) % conns.len();
                    black_box(harness.authorize(black_box(&conns[i])))
                })
            });
        }

        // Without the root-namespace policy the plugin's scope names destinations, and the connection is in it.
        let scoped = Harness::policy(&wasm, r#"{"logDryRun": false}"#).expect("load");
        let mesh: Vec<_> = mesh
            .iter()
            .filter(|p| p.scope != weft_state::PolicyScope::Global)
            .cloned()
            .collect();
        let report = scoped.set_policies(&mesh);
        assert!(report.rejected().is_empty(), "{report:?}");
        assert!(scoped.authorize(&conn).is_allow());
        g.bench_with_input(BenchmarkId::new("wasm_in_scope", n), &n, |b, _| {
            b.iter(|| black_box(scoped.authorize(black_box(&conn))))
        });
    }
    g.finish();
}

/// Prints the medians criterion estimated (ns), native against wasm.
fn summary() {
    let dir = std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| weft_plugin_host::testing::repo_root().join("target"))
        .join("criterion/istio_authz");
    let median = |kind: &str, n: usize| -> Option<f64> {
        let text = std::fs::read_to_string(
            dir.join(kind)
                .join(n.to_string())
                .join("new/estimates.json"),
        )
        .ok()?;
        let v: serde_json::Value = serde_json::from_str(&text).ok()?;
        v["median"]["point_estimate"].as_f64()
    };
    if let Some(base) = median("wasm_no_policies", 0) {
        println!("istio_authz: host chain + component call with no policies, median {base:.1} ns");
    }
    println!(
        "istio_authz decision, median ns (policies: native / wasm, scope all / wasm, destination in a named scope):"
    );
    for n in SIZES {
        match (
            median("native", n),
            median("wasm", n),
            median("wasm_in_scope", n),
        ) {
            (Some(a), Some(b), Some(c)) => println!("  {n:>6}: {a:>8.1} / {b:>8.1} / {c:>8.1}"),
            _ => println!("  {n:>6}: (no estimate in {})", dir.display()),
        }
    }
}

criterion_group!(benches, bench);

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
    summary();
}
