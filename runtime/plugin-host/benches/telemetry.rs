//! Per-connection cost of Istio's TCP telemetry: `plugins/istio-telemetry` through the whole host path (the data
//! path queues an open and a close event, the telemetry thread hands them in batches to the plugin, which updates
//! its series) against the same metric updates done natively on the calling thread (Istio's TCP label set built
//! once per connection from the same records, four counters updated as ztunnel does).
//! Run: `CARGO_TARGET_DIR=target-plugin cargo bench -p weft-plugin-host --bench telemetry`; each iteration is
//! [`CONNS`] connections, so a median divided by [`CONNS`] is the cost of one connection. On the 2-core dev
//! machine (2026-12-03) both took 2.8 µs per connection (364 µs and 363 µs per iteration): the plugin's series
//! updates behind the host's batching cost what the same updates cost natively.

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

fn side(labels: &mut Labels, which: &'static [&'static str; 8], w: Option<&WorkloadMeta>) {
    let get = |f: fn(&WorkloadMeta) -> &str| w.map_or("unknown", f).to_owned();
    let values = [
        get(|w| &w.workload_name),
        get(|w| &w.canonical_name),
        get(|w| &w.canonical_revision),
        get(|w| &w.namespace),
        w.map_or_else(
            || "unknown".to_owned(),
            |w| {
                format!(
                    "spiffe://{}/ns/{}/sa/{}",
                    w.trust_domain, w.namespace, w.service_account
                )
            },
        ),
        get(|w| &w.canonical_name),
        get(|w| &w.canonical_revision),
        get(|w| &w.cluster_id),
    ];
    labels.extend(which.iter().copied().zip(values));
}

impl Native {
    /// Istio's label set for a connection (built once per connection, as ztunnel does).
    fn labels(c: &ConnectionRecord, response_flags: &str) -> Labels {
        let mut l = Labels::with_capacity(24);
        l.push(("reporter", "destination".to_owned()));
        side(
            &mut l,
            &[
                "source_workload",
                "source_canonical_service",
                "source_canonical_revision",
                "source_workload_namespace",
                "source_principal",
                "source_app",
                "source_version",
                "source_cluster",
            ],
            c.src_workload.as_deref(),
        );
        side(
            &mut l,
            &[
                "destination_workload",
                "destination_canonical_service",
                "destination_canonical_revision",
                "destination_workload_namespace",
                "destination_principal",
                "destination_app",
                "destination_version",
                "destination_cluster",
            ],
            c.dst_workload.as_deref(),
        );
        let service = c.dst_service.as_deref().unwrap_or("unknown");
        let (ns, host) = service.split_once('/').unwrap_or(("unknown", service));
        l.push(("destination_service", host.to_owned()));
        l.push((
            "destination_service_name",
            host.split('.').next().unwrap_or(host).to_owned(),
        ));
        l.push(("destination_service_namespace", ns.to_owned()));
        l.push(("request_protocol", "tcp".to_owned()));
        l.push(("response_flags", response_flags.to_owned()));
        l.push(("connection_security_policy", "mutual_tls".to_owned()));
        l
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
    let conns: Vec<ConnectionRecord> = (0..CONNS)
        .map(|_| ConnectionRecord {
            src_workload: Some(client.clone()),
            dst_workload: Some(server.clone()),
            ..conn(8080, Some(PEER))
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
