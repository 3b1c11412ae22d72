//! Per-connection cost of Istio's TCP telemetry: `plugins/istio-telemetry` through the whole host path (the data
//! path queues an open and a close event, the telemetry thread hands them in batches to the plugin, which updates
//! its series) against the same metric updates done natively on the calling thread, the straightforward way: ztunnel's
//! 27 labels built once per connection as owned strings from the same records, and four counters updated through
//! their label sets.
//! Run: `CARGO_TARGET_DIR=target-plugin cargo bench -p weft-plugin-host --bench telemetry`; each iteration is
//! [`CONNS`] connections, so a median divided by [`CONNS`] is the cost of one connection. On the 2-core dev
//! machine (2026-12-03): 2.6–3.3 µs per connection through the plugin (it keeps its label sets and sends the host one
//! update per series per batch), 4.2 µs natively.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use weft_hooks::{CloseRecord, ConnectionRecord, Verdict, WorkloadMeta};
use weft_plugin_host::HostConfig;
use weft_plugin_host::testing::{Harness, build_plugin, conn, spec, workload};
use weft_state::PluginKind;

/// Connections per iteration: a batch's worth (the host's default `telemetry_batch` is 256 events).
const CONNS: usize = 128;

#[path = "../tests/istio_labels/mod.rs"]
mod istio_labels;
use istio_labels::ZTUNNEL_LABELS;

const PEER: &str = "spiffe://cluster.local/ns/shop/sa/frontend";

type Labels = Vec<(&'static str, String)>;

/// Istio's TCP metrics, natively.
#[derive(Default)]
struct Native {
    opened: Family<Labels, Counter>,
    closed: Family<Labels, Counter>,
    sent: Family<Labels, Counter>,
    received: Family<Labels, Counter>,
}

/// A workload's field, `unknown` without a workload.
fn of(w: Option<&WorkloadMeta>, f: fn(&WorkloadMeta) -> &str) -> String {
    w.map_or("unknown", f).to_owned()
}

fn principal(w: Option<&WorkloadMeta>) -> String {
    w.map_or_else(
        || "unknown".to_owned(),
        |w| {
            format!(
                "spiffe://{}/ns/{}/sa/{}",
                w.trust_domain, w.namespace, w.service_account
            )
        },
    )
}

impl Native {
    /// Istio's label set for a connection (what istio-telemetry reports as the destination), the values in the
    /// order of ztunnel's labels, built once per connection as ztunnel does.
    fn labels(c: &ConnectionRecord, response_flags: &str) -> Labels {
        let (src, dst) = (c.src_workload.as_deref(), c.dst_workload.as_deref());
        let service = c.dst_service.as_deref().unwrap_or("unknown");
        let (service_ns, host) = service.split_once('/').unwrap_or(("unknown", service));
        let values = [
            "destination".to_owned(),
            of(src, |w| &w.workload_name),
            of(src, |w| &w.canonical_name),
            of(src, |w| &w.canonical_revision),
            of(src, |w| &w.namespace),
            principal(src),
            of(src, |w| &w.canonical_name),
            of(src, |w| &w.canonical_revision),
            of(src, |w| &w.cluster_id),
            host.to_owned(),
            service_ns.to_owned(),
            host.split('.').next().unwrap_or(host).to_owned(),
            of(dst, |w| &w.workload_name),
            of(dst, |w| &w.canonical_name),
            of(dst, |w| &w.canonical_revision),
            of(dst, |w| &w.namespace),
            principal(dst),
            of(dst, |w| &w.canonical_name),
            of(dst, |w| &w.canonical_revision),
            of(dst, |w| &w.cluster_id),
            "tcp".to_owned(),
            response_flags.to_owned(),
            "mutual_tls".to_owned(),
            of(src, |w| &w.region),
            of(src, |w| &w.zone),
            of(dst, |w| &w.region),
            of(dst, |w| &w.zone),
        ];
        ZTUNNEL_LABELS.iter().copied().zip(values).collect()
    }

    fn connection(&self, c: &ConnectionRecord, close: &CloseRecord) {
        let labels = Self::labels(c, close.response_flags);
        self.opened.get_or_create(&labels).inc();
        self.closed.get_or_create(&labels).inc();
        self.sent.get_or_create(&labels).inc_by(close.bytes_sent);
        self.received
            .get_or_create(&labels)
            .inc_by(close.bytes_received);
    }
}

fn close() -> CloseRecord {
    CloseRecord {
        bytes_sent: 512,
        bytes_received: 4096,
        duration: Duration::from_millis(3),
        verdict: Verdict::Allow,
        error: None,
        response_flags: "-",
    }
}

fn bench(c: &mut Criterion) {
    let wasm = build_plugin("plugins/istio-telemetry").expect("build istio-telemetry");
    // The connections of one client and one server, sharing their workloads' metadata as the state's snapshot
    // does (a batch carries each workload's metadata once).
    let (client, server) = (
        workload("client", "shop", "frontend"),
        workload("server", "shop", "backend"),
    );
    let conns: Vec<std::sync::Arc<ConnectionRecord>> = (0..CONNS)
        .map(|_| {
            std::sync::Arc::new(ConnectionRecord {
                src_workload: Some(client.clone()),
                dst_workload: Some(server.clone()),
                ..conn(8080, Some(PEER))
            })
        })
        .collect();
    let close = close();
    let mut g = c.benchmark_group("telemetry");
    g.throughput(Throughput::Elements(CONNS as u64));

    let native = Native::default();
    g.bench_function("native", |b| {
        b.iter(|| {
            for conn in &conns {
                native.connection(black_box(conn), black_box(&close));
            }
        })
    });

    // The plugin as the defaults configure it (no access log), fed as the data path feeds it: every event queued
    // without waiting, then a flush (which returns once the plugin has seen them all). No linger: the
    // iteration's own events make the batches.
    let harness = Harness::with_spec(
        spec(
            "istio-telemetry",
            PluginKind::Telemetry,
            &wasm,
            r#"{"accessLog": "off"}"#,
        ),
        HostConfig {
            telemetry_linger: Duration::ZERO,
            ..HostConfig::default()
        },
    )
    .expect("load istio-telemetry");
    harness.open_close(&conns[0], &close);
    assert!(
        harness
            .metrics_text()
            .contains("istio_tcp_connections_opened_total"),
        "the plugin counts connections"
    );
    g.bench_function("wasm", |b| {
        b.iter(|| {
            let host = harness.host();
            for conn in &conns {
                weft_hooks::ConnectionHooks::on_open(host, black_box(conn));
                weft_hooks::ConnectionHooks::on_close(host, conn, &close);
            }
            host.flush_telemetry();
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
