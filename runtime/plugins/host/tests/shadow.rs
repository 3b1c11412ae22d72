//! Shadow versions of policy plugins, with real Wasm: the serving verdict is what a connection gets; the shadow's is
//! decided off the data path, counted per (serving, shadow) verdict and sampled where they diverge; a shadow that
//! traps is counted as an error; a full shadow queue skips decisions without waiting; no shadow, no shadow series.
#![allow(clippy::unwrap_used)] // a test panics to fail

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use weft_hooks::{ConnectionHooks, Verdict};
use weft_plugin_host::testing::conn;
use weft_plugin_host::{HostConfig, Outcome, PluginHost, ShadowReport};
use weft_state::{PluginShadow, PluginSpec};
use weft_testkit::eventually_blocking as eventually;

/// A policy plugin with its code pinned (see [`common::pinned_code`]).
fn serving(name: &str, wasm: &std::path::Path, config: &str) -> PluginSpec {
    let mut spec = (*policy(name, wasm, config)).clone();
    spec.source = pinned_code(wasm);
    spec
}

/// `spec` with a shadow version of `wasm` configured with `config`.
fn shadowed(mut spec: PluginSpec, wasm: &std::path::Path, config: &str) -> Arc<PluginSpec> {
    spec.shadow = Some(Arc::new(PluginShadow {
        source: pinned_code(wasm),
        sha256: None,
        config: config.to_string(),
    }));
    Arc::new(spec)
}

/// How many decisions of (serving, shadow) verdicts the report holds (inbound).
fn count(r: &ShadowReport, serving: &str, shadow: &str) -> u64 {
    r.decisions
        .iter()
        .filter(|c| c.direction == "inbound" && c.serving == serving && c.shadow == shadow)
        .map(|c| c.count)
        .sum()
}

fn total(r: &ShadowReport) -> u64 {
    r.decisions.iter().map(|c| c.count).sum()
}

/// Waits until `plugin`'s shadow has booked `n` decisions and returns its report.
fn decided(host: &PluginHost, plugin: &str, n: u64) -> ShadowReport {
    eventually(&format!("{n} shadow decisions of {plugin}"), || {
        host.shadow_report(plugin).filter(|r| total(r) >= n)
    })
}

fn loaded(host: &PluginHost, specs: &[Arc<PluginSpec>]) {
    let report = host.apply(specs, &[]);
    for s in specs {
        assert!(
            matches!(report.get(&s.name), Some(Outcome::Loaded { .. })),
            "{report:?}"
        );
    }
}

/// (a) The shadow never enforces: a shadow that allows nothing leaves allowed connections allowed, and a shadow that
/// allows everything leaves denied ones denied.
#[test]
fn the_serving_verdict_is_what_the_connection_gets() {
    let host = host();
    loaded(
        &host,
        &[shadowed(
            serving("strict", &allowlist(), r#"{"ports": [80]}"#),
            &allowlist(),
            r#"{"ports": [1]}"#,
        )],
    );
    assert_eq!(host.authorize(&conn(80, Some(PEER))), Verdict::Allow);
    assert!(!host.authorize(&conn(81, Some(PEER))).is_allow());
    let r = decided(&host, "strict", 2);
    assert_eq!(count(&r, "allow", "deny"), 1, "{r:?}");
    assert_eq!(count(&r, "deny", "deny"), 1, "{r:?}");

    let host = self::host();
    loaded(
        &host,
        &[shadowed(
            serving("open", &allowlist(), r#"{"ports": [80]}"#),
            &allowlist(),
            r#"{"ports": [80, 81, 82]}"#,
        )],
    );
    assert!(!host.authorize(&conn(81, Some(PEER))).is_allow());
    let r = decided(&host, "open", 1);
    assert_eq!(count(&r, "deny", "allow"), 1, "{r:?}");
}

/// (b) Serving allows 80 and 81, the shadow 80 only: port 81 diverges, counted with its labels and sampled with its
/// port, identities and workloads.
#[test]
fn divergences_are_counted_and_sampled() {
    let host = host();
    loaded(
        &host,
        &[shadowed(
            serving("p", &allowlist(), r#"{"ports": [80, 81]}"#),
            &allowlist(),
            r#"{"ports": [80]}"#,
        )],
    );
    assert_eq!(host.authorize(&conn(80, Some(PEER))), Verdict::Allow);
    assert_eq!(host.authorize(&conn(81, Some(PEER))), Verdict::Allow);
    assert!(!host.authorize(&conn(82, Some(PEER))).is_allow());
    let r = decided(&host, "p", 3);
    assert_eq!(count(&r, "allow", "allow"), 1, "{r:?}");
    assert_eq!(count(&r, "allow", "deny"), 1, "{r:?}");
    assert_eq!(count(&r, "deny", "deny"), 1, "{r:?}");
    assert_eq!(r.skipped, 0);
    assert!(r.sha256.is_some());
    assert_eq!(r.samples.len(), 1, "only the divergence is sampled: {r:?}");
    let s = &r.samples[0];
    assert_eq!(s.dst.port(), 81);
    assert_eq!((s.serving, s.shadow), ("allow", "deny"));
    assert_eq!(s.serving_reason, None);
    assert!(s.shadow_reason.is_some(), "{s:?}");
    assert_eq!(s.src_identity.as_deref(), Some(PEER));
    assert_eq!(s.dst_workload.as_deref(), Some("shop/server"));
    assert_eq!(s.src_workload.as_deref(), Some("shop/client"));

    let text = host.metrics_text();
    for line in [
        r#"weft_plugin_shadow_decisions_total{plugin="p",direction="inbound",serving="allow",shadow="allow"} 1"#,
        r#"weft_plugin_shadow_decisions_total{plugin="p",direction="inbound",serving="allow",shadow="deny"} 1"#,
        r#"weft_plugin_shadow_decisions_total{plugin="p",direction="inbound",serving="deny",shadow="deny"} 1"#,
        r#"weft_plugin_shadow_skipped_total{plugin="p"} 0"#,
    ] {
        assert!(text.contains(line), "{line} missing in:\n{text}");
    }
}

/// (c) A shadow that traps is counted as `error`; the connection gets the serving verdict and the serving version's
/// own error count stays at zero.
#[test]
fn a_trapping_shadow_is_counted_never_enforced() {
    let host = host();
    loaded(
        &host,
        &[shadowed(
            serving("p", &allowlist(), r#"{"ports": [80, 666]}"#),
            &misbehave(),
            "trap",
        )],
    );
    assert_eq!(host.authorize(&conn(666, Some(PEER))), Verdict::Allow);
    assert_eq!(host.authorize(&conn(80, Some(PEER))), Verdict::Allow);
    let r = decided(&host, "p", 2);
    assert_eq!(count(&r, "allow", "error"), 1, "{r:?}");
    assert_eq!(count(&r, "allow", "allow"), 1, "{r:?}");
    let s = r.samples.iter().find(|s| s.shadow == "error").unwrap();
    assert_eq!(s.dst.port(), 666);
    let text = host.metrics_text();
    assert!(
        text.contains(r#"weft_plugin_shadow_decisions_total{plugin="p",direction="inbound",serving="allow",shadow="error"} 1"#),
        "{text}"
    );
    // The serving version failed nothing.
    assert!(
        !text
            .lines()
            .any(|l| l.starts_with(r#"weft_plugin_errors_total{plugin="p","#) && !l.ends_with(" 0")),
        "{text}"
    );
    // And it keeps serving.
    assert_eq!(host.authorize(&conn(666, Some(PEER))), Verdict::Allow);
}

/// (d) With a one-slot queue and a shadow that runs to its deadline, most decisions are skipped and counted; the
/// connections are decided at the serving version's pace all the same.
#[test]
fn a_full_queue_skips_without_waiting() {
    let deadline = Duration::from_millis(50);
    let host = PluginHost::new(HostConfig {
        prewarm_instances: 2,
        shadow_queue: 1,
        call_deadline: deadline,
        ..HostConfig::default()
    })
    .unwrap();
    loaded(
        &host,
        &[shadowed(
            serving("p", &allowlist(), r#"{"ports": [666]}"#),
            &misbehave(),
            "loop",
        )],
    );
    const N: u64 = 100;
    let started = Instant::now();
    for _ in 0..N {
        assert_eq!(host.authorize(&conn(666, Some(PEER))), Verdict::Allow);
    }
    let took = started.elapsed();
    // Had a connection waited for the shadow, N of them would take N deadlines.
    assert!(
        took < deadline * (N as u32) / 4,
        "{N} connections took {took:?}"
    );
    let r = eventually("every decision booked or skipped", || {
        host.shadow_report("p")
            .filter(|r| total(r) + r.skipped == N)
    });
    assert!(r.skipped > 0, "{r:?}");
    assert_eq!(count(&r, "allow", "error"), total(&r), "{r:?}");
    let text = host.metrics_text();
    let line = format!(
        r#"weft_plugin_shadow_skipped_total{{plugin="p"}} {}"#,
        r.skipped
    );
    assert!(text.contains(&line), "{line} missing in:\n{text}");
}

/// (e) No shadow: no report, no shadow series, the same verdicts; dropping a shadow drops its series and leaves the
/// serving version as it was.
#[test]
fn no_shadow_no_series() {
    let host = host();
    let plain = Arc::new(serving("p", &allowlist(), r#"{"ports": [80]}"#));
    loaded(&host, std::slice::from_ref(&plain));
    assert_eq!(host.authorize(&conn(80, Some(PEER))), Verdict::Allow);
    assert!(!host.authorize(&conn(81, Some(PEER))).is_allow());
    assert!(host.shadow_report("p").is_none());
    let no_series = |host: &PluginHost| {
        let text = host.metrics_text();
        assert!(
            !text.contains("weft_plugin_shadow_decisions_total{")
                && !text.contains("weft_plugin_shadow_skipped_total{"),
            "{text}"
        );
    };
    no_series(&host);

    // A shadow added, then dropped: the serving version is not reloaded either time.
    let with = shadowed((*plain).clone(), &allowlist(), r#"{"ports": [1]}"#);
    let report = host.apply(std::slice::from_ref(&with), &[]);
    assert_eq!(report.get("p"), Some(&Outcome::Unchanged), "{report:?}");
    assert_eq!(host.authorize(&conn(80, Some(PEER))), Verdict::Allow);
    decided(&host, "p", 1);
    let report = host.apply(std::slice::from_ref(&plain), &[]);
    assert_eq!(report.get("p"), Some(&Outcome::Unchanged), "{report:?}");
    assert!(host.shadow_report("p").is_none());
    no_series(&host);
    assert_eq!(host.authorize(&conn(80, Some(PEER))), Verdict::Allow);
    assert!(!host.authorize(&conn(81, Some(PEER))).is_allow());
}

/// Divergence samples are rate-limited per interval on the host's clock and kept in a bounded ring; every
/// divergence is still counted.
#[test]
fn samples_are_rate_limited_and_bounded() {
    let clock = Arc::new(weft_plugin_host::ManualClock::default());
    let interval = Duration::from_secs(10);
    let host = PluginHost::new(HostConfig {
        prewarm_instances: 2,
        shadow_samples: 3,
        shadow_samples_per_interval: 2,
        shadow_sample_interval: interval,
        clock: clock.clone(),
        ..HostConfig::default()
    })
    .unwrap();
    loaded(
        &host,
        &[shadowed(
            serving("p", &allowlist(), r#"{"ports": [81]}"#),
            &allowlist(),
            r#"{"ports": [1]}"#,
        )],
    );
    for _ in 0..5 {
        assert_eq!(host.authorize(&conn(81, Some(PEER))), Verdict::Allow);
    }
    let r = decided(&host, "p", 5);
    assert_eq!(count(&r, "allow", "deny"), 5, "{r:?}");
    assert_eq!((r.samples.len(), r.samples_dropped), (2, 3), "{r:?}");

    clock.advance(interval);
    for _ in 0..5 {
        assert_eq!(host.authorize(&conn(81, Some(PEER))), Verdict::Allow);
    }
    let r = decided(&host, "p", 10);
    assert_eq!(count(&r, "allow", "deny"), 10, "{r:?}");
    assert_eq!((r.samples.len(), r.samples_dropped), (3, 6), "{r:?}");
    // The ring keeps the latest: ids rise.
    assert!(r.samples.windows(2).all(|w| w[0].conn < w[1].conn), "{r:?}");
}

/// A telemetry plugin's shadow gets the same events; its metrics, under the names it defines, are exposed apart
/// (the shadow registry), never among the serving version's; a shadow dropped takes its series with it.
#[test]
fn a_telemetry_shadow_counts_the_same_events_into_its_own_registry() {
    let host = host();
    let mut spec = (*telemetry("counter", &counter(), r#"{"prefix": "conn_counter"}"#)).clone();
    spec.source = pinned_code(&counter());
    let plain = Arc::new(spec.clone());
    let with = shadowed(spec, &counter(), r#"{"prefix": "conn_counter_v2"}"#);
    loaded(&host, std::slice::from_ref(&with));
    for port in [80, 81, 82] {
        let c = Arc::new(conn(port, Some(PEER)));
        host.on_open(&c);
        host.on_close(
            &c,
            &weft_hooks::CloseRecord {
                bytes_sent: 10,
                bytes_received: 20,
                duration: Duration::from_millis(1),
                verdict: Verdict::Allow,
                error: None,
                response_flags: "-",
            },
        );
    }
    host.flush_telemetry();
    let serving = host.metrics_text();
    let shadow = host.shadow_metrics_text();
    let opened = |prefix: &str| {
        format!("{prefix}_opened_total{{direction=\"inbound\",destination_workload=\"server\"}} 3")
    };
    assert!(serving.contains(&opened("conn_counter")), "{serving}");
    assert!(!serving.contains("conn_counter_v2"), "{serving}");
    assert!(shadow.contains(&opened("conn_counter_v2")), "{shadow}");
    assert!(!shadow.contains(&opened("conn_counter")), "{shadow}");

    // Same names in both: each registry has its own series.
    let same = shadowed(
        (*plain).clone(),
        &counter(),
        r#"{"prefix": "conn_counter"}"#,
    );
    let report = host.apply(std::slice::from_ref(&same), &[]);
    assert_eq!(
        report.get("counter"),
        Some(&Outcome::Unchanged),
        "{report:?}"
    );
    let c = Arc::new(conn(80, Some(PEER)));
    host.on_open(&c);
    host.flush_telemetry();
    let shadow = host.shadow_metrics_text();
    assert!(
        shadow.contains(
            "conn_counter_opened_total{direction=\"inbound\",destination_workload=\"server\"} 1"
        ),
        "a new shadow version starts empty: {shadow}"
    );
    assert!(!shadow.contains("conn_counter_v2"), "{shadow}");
    assert!(host.metrics_text().contains(
        "conn_counter_opened_total{direction=\"inbound\",destination_workload=\"server\"} 4"
    ));

    // Dropped: no shadow series left.
    let report = host.apply(std::slice::from_ref(&plain), &[]);
    assert_eq!(
        report.get("counter"),
        Some(&Outcome::Unchanged),
        "{report:?}"
    );
    assert!(
        !host.shadow_metrics_text().contains("conn_counter"),
        "{}",
        host.shadow_metrics_text()
    );
}
