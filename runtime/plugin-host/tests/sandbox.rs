//! Malicious plugins against the real host: each misbehaviour is contained within its deadline, the failure
//! policy applies, the instance is replaced, and a well-behaved plugin's latency is unaffected meanwhile.
#![allow(clippy::unwrap_used)] // a test panics to fail

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::*;
use weft_hooks::{ConnectionHooks, Verdict};
use weft_plugin_host::testing::conn;
use weft_plugin_host::{HostConfig, Outcome, PluginHost};
use weft_state::FailurePolicy;

fn load(mode: &str, failure: FailurePolicy, cfg: &HostConfig) -> PluginHost {
    let host = PluginHost::new(cfg.clone()).expect("host");
    let mut spec = (*policy("bad", &misbehave(), mode)).clone();
    spec.failure_policy = failure;
    let report = host.apply(&[Arc::new(spec)], &[]);
    assert!(
        matches!(report.get("bad"), Some(Outcome::Loaded { .. })),
        "{report:?}"
    );
    host
}

/// Runs the bad call; checks time, verdict, the error kind counted, and that the plugin still serves after.
fn contained(mode: &str, kind: &str, max: Duration) {
    contained_with(mode, kind, max, &HostConfig::default());
}

fn contained_with(mode: &str, kind: &str, max: Duration, cfg: &HostConfig) {
    let host = load(mode, FailurePolicy::FailClosed, cfg);
    let started = Instant::now();
    let v = host.authorize(&conn(666, Some(PEER)));
    let took = started.elapsed();
    assert!(took < max, "{mode}: took {took:?}");
    match v {
        Verdict::Deny { by, reason } => {
            assert_eq!(by, "bad");
            assert!(reason.contains(kind), "{mode}: {reason}");
        }
        Verdict::Allow => panic!("{mode}: fail-closed plugin allowed"),
    }
    let metrics = host.metrics_text();
    assert!(
        metrics.contains(&format!(
            "weft_plugin_errors_total{{plugin=\"bad\",kind=\"{kind}\"}} 1"
        )),
        "{mode}: {metrics}"
    );
    // The poisoned instance was thrown away; the plugin keeps serving good calls.
    for _ in 0..3 {
        assert_eq!(
            host.authorize(&conn(80, Some(PEER))),
            Verdict::Allow,
            "{mode}"
        );
    }
    // Fail-open applies the other way.
    let open = load(mode, FailurePolicy::FailOpen, cfg);
    assert_eq!(
        open.authorize(&conn(666, Some(PEER))),
        Verdict::Allow,
        "{mode} fail-open"
    );
}

#[test]
fn endless_loop_times_out() {
    // Deadline 10 ms (+1 tick); allow generous slack for a loaded CI machine.
    contained("loop", "timeout", Duration::from_millis(250));
}

/// With a generous deadline the bomb reaches the memory cap and traps there.
#[test]
fn memory_bomb_hits_the_cap() {
    let cfg = HostConfig {
        call_deadline: Duration::from_millis(500),
        memory_limit: 8 << 20,
        ..HostConfig::default()
    };
    contained_with("bomb", "memory", Duration::from_millis(1000), &cfg);
}

/// With the default deadline (10 ms) a bomb is stopped by whichever comes first, the cap or the deadline.
#[test]
fn memory_bomb_ends_within_the_default_deadline() {
    let host = load("bomb", FailurePolicy::FailClosed, &HostConfig::default());
    let started = Instant::now();
    let v = host.authorize(&conn(666, Some(PEER)));
    assert!(
        started.elapsed() < Duration::from_millis(150),
        "{:?}",
        started.elapsed()
    );
    match v {
        Verdict::Deny { reason, .. } => assert!(
            reason.contains("memory") || reason.contains("timeout"),
            "{reason}"
        ),
        Verdict::Allow => panic!("allowed"),
    }
}

#[test]
fn trap_is_contained() {
    contained("trap", "trap", Duration::from_millis(100));
}

#[test]
fn panic_is_a_trap() {
    contained("panic", "trap", Duration::from_millis(100));
}

#[test]
fn deep_recursion_overflows_the_stack() {
    contained("recursion", "stack_overflow", Duration::from_millis(250));
}

#[test]
fn oversized_reason_is_bad_output() {
    let cfg = HostConfig {
        call_deadline: Duration::from_millis(500),
        ..HostConfig::default()
    };
    contained_with(
        "big-reason",
        "bad_output",
        Duration::from_millis(1000),
        &cfg,
    );
}

#[test]
fn configure_that_never_returns_is_rejected() {
    let host = PluginHost::new(HostConfig {
        configure_deadline: Duration::from_millis(50),
        ..HostConfig::default()
    })
    .expect("host");
    let started = Instant::now();
    let report = host.apply(&[policy("bad", &misbehave(), "configure-loop")], &[]);
    // Bounded: the compile plus a 50 ms CPU budget; generous for a loaded 2-core machine.
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    let reason = match report.get("bad") {
        Some(Outcome::Rejected { reason, .. }) => reason.clone(),
        other => panic!("{other:?}"),
    };
    assert!(
        reason.contains("configure") && reason.contains("timeout"),
        "{reason}"
    );
    // Never loaded and fail-closed: what it would have judged is denied.
    assert!(!host.authorize(&conn(80, Some(PEER))).is_allow());
}

#[test]
fn log_flood_is_rate_limited() {
    let cfg = HostConfig {
        call_deadline: Duration::from_secs(2),
        ..HostConfig::default()
    };
    let host = load("log-flood", FailurePolicy::FailClosed, &cfg);
    assert_eq!(host.authorize(&conn(666, Some(PEER))), Verdict::Allow);
    let m = host.metrics_text();
    let dropped: f64 = m
        .lines()
        .find(|l| l.starts_with("weft_plugin_log_dropped_total{plugin=\"bad\"}"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    assert!(dropped >= 9_000.0, "{m}");
}

#[test]
fn metric_series_are_capped() {
    let host = PluginHost::new(HostConfig {
        max_series_per_plugin: 100,
        call_deadline: Duration::from_secs(2),
        ..HostConfig::default()
    })
    .expect("host");
    host.apply(&[policy("bad", &misbehave(), "metric-flood")], &[]);
    assert_eq!(host.authorize(&conn(666, Some(PEER))), Verdict::Allow);
    let m = host.metrics_text();
    let series = m
        .lines()
        .filter(|l| l.starts_with("misbehave_flood_total{"))
        .count();
    assert_eq!(series, 100, "{m}");
    assert!(
        m.contains("weft_plugin_metric_series_dropped_total{plugin=\"bad\"} 9900"),
        "{m}"
    );
}

/// While other threads keep a bad plugin looping to its deadline, a good plugin's decisions stay fast.
#[test]
fn good_plugin_latency_unaffected_by_a_looping_neighbour() {
    let host = Arc::new(host());
    let mut good = (*policy("good", &allowlist(), r#"{"ports": [80, 666]}"#)).clone();
    good.selector.workloads = vec!["server".into()];
    let mut bad = (*policy("bad", &misbehave(), "loop")).clone();
    bad.selector.workloads = vec!["other".into()];
    let report = host.apply(&[Arc::new(good), Arc::new(bad)], &[]);
    assert!(report.rejected().is_empty(), "{report:?}");

    let mut bad_conn = conn(666, Some(PEER));
    bad_conn.dst_workload = Some(weft_plugin_host::testing::workload("other", "shop", "x"));
    let stop = Arc::new(AtomicBool::new(false));
    let looping = {
        let (host, stop) = (host.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                assert!(!host.authorize(&bad_conn).is_allow());
                n += 1;
            }
            n
        })
    };
    let good_conn = conn(80, Some(PEER));
    let mut lat = Vec::new();
    let until = Instant::now() + Duration::from_millis(300);
    while Instant::now() < until {
        let t = Instant::now();
        assert_eq!(host.authorize(&good_conn), Verdict::Allow);
        lat.push(t.elapsed());
    }
    stop.store(true, Ordering::Relaxed);
    let bad_calls = looping.join().expect("looping thread");
    lat.sort();
    let p50 = lat[lat.len() / 2];
    assert!(bad_calls >= 5, "bad calls {bad_calls}");
    assert!(
        p50 < Duration::from_micros(200),
        "good p50 {p50:?} over {} calls",
        lat.len()
    );
}

/// A reused instance serves any number of calls: handles lent to the guest per call must not accumulate in the
/// store (wasmtime caps a store at 100,000 live handles; a leak of one per call failed every call after ~50,000).
#[test]
fn a_reused_instance_serves_more_calls_than_the_store_handle_limit() {
    let host = host();
    let good = policy("good", &allowlist(), r#"{"ports": [80]}"#);
    let report = host.apply(&[good], &[]);
    assert!(report.rejected().is_empty(), "{report:?}");
    let mut c = conn(80, Some(PEER));
    c.src_workload = Some(weft_plugin_host::testing::workload(
        "client", "shop", "frontend",
    ));
    for i in 0..120_000 {
        let v = host.authorize(&c);
        assert_eq!(v, Verdict::Allow, "call {i}");
    }
}
