//! Cost of one access log line (the fields `weft-proxy` writes per connection, inside a connection's span) in
//! weft's JSON format ([`weft_logging::json`]) against `tracing-subscriber`'s JSON format, the baseline it replaced, and
//! its text format (weft's default), all written to `io::sink`. Run: `cargo bench -p weft-logging --bench log_line`.
#![allow(clippy::unwrap_used)] // a bench panics to fail

use std::hint::black_box;
use std::net::SocketAddr;

use criterion::{Criterion, criterion_group, criterion_main};
use tracing::Subscriber;
use tracing_subscriber::layer::SubscriberExt;
use weft_logging::json::{JsonLine, JsonSpanFields};

fn line() {
    let src: SocketAddr = black_box(([10, 244, 1, 7], 41234).into());
    let dst: SocketAddr = black_box(([10, 244, 2, 9], 8080).into());
    tracing::info!(
        target: "access",
        conn = 123_456u64,
        src.addr = %src,
        src.workload = "client-7d9f8b-x2k4l",
        src.namespace = "shop",
        src.identity = "spiffe://cluster.local/ns/shop/sa/client",
        dst.addr = %dst,
        dst.hbone_addr = %dst,
        forwarded_for = "",
        dst.service = "server.shop.svc.cluster.local",
        dst.workload = "server-5c6d7-abcde",
        dst.namespace = "shop",
        dst.identity = "spiffe://cluster.local/ns/shop/sa/server",
        direction = "inbound",
        bytes_sent = 1u64,
        bytes_recv = 1u64,
        duration = "0ms",
        error = "",
        "connection complete"
    );
}

fn run(c: &mut Criterion, name: &str, sub: impl Subscriber + Send + Sync + 'static) {
    tracing::subscriber::with_default(sub, || {
        let span = tracing::info_span!("inbound", conn = 123_456u64, peer = "10.244.1.7:41234");
        let _e = span.enter();
        c.bench_function(name, |b| b.iter(line));
    });
}

fn bench(c: &mut Criterion) {
    run(
        c,
        "access_line/weft_json",
        tracing_subscriber::registry().with(
            tracing_subscriber::fmt::layer()
                .event_format(JsonLine)
                .fmt_fields(JsonSpanFields)
                .with_writer(std::io::sink),
        ),
    );
    run(
        c,
        "access_line/tracing_subscriber_json",
        tracing_subscriber::registry().with(
            tracing_subscriber::fmt::layer()
                .json()
                .flatten_event(true)
                .with_current_span(false)
                .with_writer(std::io::sink),
        ),
    );
    run(
        c,
        "access_line/text",
        tracing_subscriber::registry().with(
            tracing_subscriber::fmt::layer()
                .with_ansi(false)
                .with_writer(std::io::sink),
        ),
    );
}

criterion_group!(benches, bench);
criterion_main!(benches);
