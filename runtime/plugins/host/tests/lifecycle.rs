//! Loading, rejecting and hot-swapping plugins: bad versions are rejected with their reason while the previous
//! version keeps serving; swaps under load fail no call; state updates reach the plugins that want them.
#![allow(clippy::unwrap_used)] // a test panics to fail

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use common::*;
use weft_hooks::{ConnectionHooks, Direction, Verdict};
use weft_plugin_host::testing::{conn, workload};
use weft_plugin_host::{HostConfig, Outcome, PluginHost, sha256_hex};
use weft_state::{PluginSource, PluginSpec};
use weft_testkit::eventually_blocking as eventually;

/// See [`common::pinned_code`].
fn code(wasm: &std::path::Path) -> PluginSource {
    common::pinned_code(wasm)
}

/// `common::policy`, with the code pinned (see [`code`]).
fn policy(name: &str, wasm: &std::path::Path, config: &str) -> Arc<PluginSpec> {
    let mut spec = (*common::policy(name, wasm, config)).clone();
    spec.source = code(wasm);
    Arc::new(spec)
}

/// `common::telemetry`, with the code pinned (see [`code`]).
fn telemetry(name: &str, wasm: &std::path::Path, config: &str) -> Arc<PluginSpec> {
    let mut spec = (*common::telemetry(name, wasm, config)).clone();
    spec.source = code(wasm);
    Arc::new(spec)
}

fn loaded(report: &weft_plugin_host::ApplyReport, name: &str) -> String {
    match report.get(name) {
        Some(Outcome::Loaded { sha256 }) => sha256.clone(),
        other => panic!("{name}: {other:?} in {report:?}"),
    }
}

fn rejected(report: &weft_plugin_host::ApplyReport, name: &str) -> (String, Option<String>) {
    match report.get(name) {
        Some(Outcome::Rejected {
            reason,
            still_serving,
        }) => (reason.clone(), still_serving.clone()),
        other => panic!("{name}: {other:?} in {report:?}"),
    }
}

/// Version 1 allows port 80 only; each bad version 2 is rejected and version 1 keeps deciding.
#[test]
fn bad_versions_are_rejected_while_the_old_one_serves() {
    let host = host();
    let v1 = policy("p", &allowlist(), r#"{"ports": [80]}"#);
    let sha1 = loaded(&host.apply(std::slice::from_ref(&v1), &[]), "p");
    let still = |host: &PluginHost| {
        assert_eq!(host.authorize(&conn(80, Some(PEER))), Verdict::Allow);
        assert!(!host.authorize(&conn(81, Some(PEER))).is_allow());
    };
    still(&host);

    let with = |f: &dyn Fn(&mut PluginSpec)| {
        let mut s = (*v1).clone();
        f(&mut s);
        Arc::new(s)
    };
    let cases: Vec<(&str, Arc<PluginSpec>, &str)> = vec![
        (
            "garbage bytes",
            with(&|s| {
                s.source =
                    PluginSource::Inline(Arc::new(b"\0asm garbage, not a component".to_vec()))
            }),
            "not a valid WebAssembly component",
        ),
        (
            "wrong world",
            with(&|s| s.source = code(&counter())),
            "does not fit the weft:plugin/transport-policy world",
        ),
        (
            "configure error",
            with(&|s| s.config = r#"{"ports": ["not a port"]}"#.into()),
            "configure rejected the config",
        ),
        (
            "sha256 mismatch",
            with(&|s| s.sha256 = Some("00".repeat(32))),
            "sha256 mismatch",
        ),
        (
            "missing file",
            with(&|s| s.source = PluginSource::Path("/nonexistent/plugin.wasm".into())),
            "cannot read plugin code",
        ),
    ];
    for (what, bad, expect) in cases {
        let report = host.apply(&[bad], &[]);
        let (reason, serving) = rejected(&report, "p");
        assert!(reason.contains(expect), "{what}: {reason}");
        assert_eq!(serving.as_deref(), Some(sha1.as_str()), "{what}");
        still(&host);
        let status = host.status();
        assert_eq!(status[0].state, "serving-previous", "{what}");
        assert!(
            status[0]
                .last_error
                .as_deref()
                .is_some_and(|e| e.contains(expect))
        );
    }
    // A misbehaving plugin's `configure` error (from the plugin itself).
    let report = host.apply(
        &[with(&|s| {
            s.source = code(&misbehave());
            s.config = "configure-error".into();
        })],
        &[],
    );
    assert!(
        rejected(&report, "p")
            .0
            .contains("misbehave: configure refuses")
    );
    still(&host);
    // Going back to the good spec: unchanged, serving again without a rejection.
    let report = host.apply(std::slice::from_ref(&v1), &[]);
    assert_eq!(report.get("p"), Some(&Outcome::Unchanged));
    assert_eq!(host.status()[0].state, "serving");
    // A correct sha256 loads.
    let PluginSource::Inline(good_code) = &v1.source else {
        panic!("pinned code")
    };
    let good_sha = sha256_hex(good_code);
    let report = host.apply(
        &[with(&|s| {
            s.sha256 = Some(good_sha.to_uppercase());
            s.config = r#"{"ports": [81]}"#.into();
        })],
        &[],
    );
    assert_eq!(loaded(&report, "p"), good_sha);
    assert!(host.authorize(&conn(81, Some(PEER))).is_allow());
}

/// Threads authorize in a loop while the plugin flips between two configs: no call fails, and the new behaviour
/// is visible as soon as `apply` returns. Calls overlap every swap (the test waits for calls made after each).
#[test]
fn hot_swap_under_load_fails_nothing() {
    // The pool holds an instance for each thread that calls at once (4 workers and this thread): calls never
    // create instances, so a pool smaller than the concurrency answers `no_instance`.
    let host = Arc::new(
        PluginHost::new(HostConfig {
            prewarm_instances: 6,
            max_idle_per_plugin: 8,
            ..HostConfig::default()
        })
        .expect("host"),
    );
    let a = policy("p", &allowlist(), r#"{"ports": [80, 81]}"#);
    let b = policy("p", &allowlist(), r#"{"ports": [80, 82]}"#);
    host.apply(std::slice::from_ref(&a), &[]);
    let stop = Arc::new(AtomicBool::new(false));
    let calls = Arc::new(AtomicU64::new(0));
    let workers: Vec<_> = (0..4)
        .map(|_| {
            let (host, stop, calls) = (host.clone(), stop.clone(), calls.clone());
            std::thread::spawn(move || {
                let c = conn(80, Some(PEER));
                let mut failures = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let v = host.authorize(&c);
                    if v != Verdict::Allow {
                        eprintln!("failed: {v:?}");
                        failures += 1;
                    }
                    calls.fetch_add(1, Ordering::Relaxed);
                }
                failures
            })
        })
        .collect();
    for i in 0..20 {
        let (spec, on, off) = if i % 2 == 0 {
            (&b, 82, 81)
        } else {
            (&a, 81, 82)
        };
        let report = host.apply(std::slice::from_ref(spec), &[]);
        assert!(
            matches!(report.get("p"), Some(Outcome::Loaded { .. })),
            "{report:?}"
        );
        assert!(host.authorize(&conn(on, Some(PEER))).is_allow(), "swap {i}");
        assert!(
            !host.authorize(&conn(off, Some(PEER))).is_allow(),
            "swap {i}"
        );
        // The load goes on across this swap before the next one.
        let seen = calls.load(Ordering::Relaxed);
        eventually("calls after the swap", || {
            (calls.load(Ordering::Relaxed) >= seen + 20).then_some(())
        });
    }
    stop.store(true, Ordering::Relaxed);
    let failures: u64 = workers.into_iter().map(|w| w.join().expect("worker")).sum();
    assert_eq!(failures, 0);
    let errors: Vec<_> = host
        .metrics_text()
        .lines()
        .filter(|l| l.starts_with("weft_plugin_errors_total") && !l.ends_with(" 0"))
        .map(str::to_string)
        .collect();
    assert!(errors.is_empty(), "{errors:?}");
}

/// Captures the events logged while it is the thread's default subscriber: level and formatted fields.
#[derive(Clone, Default)]
struct Capture(Arc<std::sync::Mutex<Vec<(tracing::Level, String)>>>);

impl tracing::Subscriber for Capture {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        struct Fields(String);
        impl tracing::field::Visit for Fields {
            fn record_debug(&mut self, f: &tracing::field::Field, v: &dyn std::fmt::Debug) {
                self.0.push_str(&format!(" {}={v:?}", f.name()));
            }
        }
        let mut fields = Fields(String::new());
        event.record(&mut fields);
        self.0
            .lock()
            .unwrap()
            .push((*event.metadata().level(), fields.0));
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

impl Capture {
    /// The events about plugin `name` being rejected.
    fn rejections(&self, name: &str) -> Vec<(tracing::Level, String)> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, f)| f.contains("rejected") && f.contains(&format!("plugin={name}")))
            .cloned()
            .collect()
    }
}

/// The process-wide capture for this test binary. A thread-local subscriber (`with_default`) can miss events
/// while other tests' threads register the same callsites (tracing caches each callsite's interest globally), so
/// this test installs one global subscriber and tells its events apart by plugin names no other test uses.
fn global_capture() -> &'static Capture {
    static CAPTURE: std::sync::OnceLock<Capture> = std::sync::OnceLock::new();
    CAPTURE.get_or_init(|| {
        let c = Capture::default();
        tracing::subscriber::set_global_default(c.clone())
            .expect("no other global subscriber in this test binary");
        c
    })
}

/// A rejection is logged once, with its reason: a warning while the previous version keeps serving, an error
/// when nothing serves for the plugin.
#[test]
fn a_rejection_is_logged_once_at_the_level_of_its_consequence() {
    let capture = global_capture();
    let host = host();
    let v1 = policy("log-once-p", &allowlist(), r#"{"ports": [80]}"#);
    loaded(&host.apply(std::slice::from_ref(&v1), &[]), "log-once-p");
    let mut bad = (*v1).clone();
    bad.config = r#"{"ports": ["not a port"]}"#.into();
    let report = host.apply(&[Arc::new(bad)], &[]);
    rejected(&report, "log-once-p");
    let lines = capture.rejections("log-once-p");
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0].0, tracing::Level::WARN, "{lines:?}");
    assert!(
        lines[0].1.contains("configure rejected the config"),
        "{lines:?}"
    );

    // Nothing serves for it (never loaded, fail-closed: what it selects is denied).
    let host = self::host();
    let mut never = (*policy("log-once-q", &allowlist(), "{}")).clone();
    never.sha256 = Some("11".repeat(32));
    let report = host.apply(&[Arc::new(never)], &[]);
    rejected(&report, "log-once-q");
    let lines = capture.rejections("log-once-q");
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0].0, tracing::Level::ERROR, "{lines:?}");
    assert!(lines[0].1.contains("sha256 mismatch"), "{lines:?}");
}

#[test]
fn chain_order_selector_directions_and_first_deny() {
    let host = host();
    let mut first = (*policy(
        "a-first",
        &allowlist(),
        r#"{"ports": [80], "deny_message": "first"}"#,
    ))
    .clone();
    first.priority = -1;
    let mut second = (*policy(
        "b-second",
        &allowlist(),
        r#"{"ports": [81], "deny_message": "second"}"#,
    ))
    .clone();
    second.selector.namespaces = vec!["other-ns".into()];
    let mut egress = (*policy("c-egress", &allowlist(), r#"{"ports": [443]}"#)).clone();
    egress.directions.inbound = false;
    egress.directions.outbound = true;
    let report = host.apply(&[Arc::new(second), Arc::new(first), Arc::new(egress)], &[]);
    assert!(report.rejected().is_empty(), "{report:?}");
    // Inbound to shop/server: only a-first applies (b-second selects other-ns, c-egress is outbound).
    assert!(host.authorize(&conn(80, Some(PEER))).is_allow());
    match host.authorize(&conn(81, Some(PEER))) {
        Verdict::Deny { by, reason } => assert_eq!(
            (by.as_str(), reason.starts_with("first")),
            ("a-first", true)
        ),
        v => panic!("{v:?}"),
    }
    // In other-ns both apply: the lower priority denies first.
    let mut c = conn(82, Some(PEER));
    c.dst_workload = Some(workload("x", "other-ns", "sa"));
    assert!(matches!(host.authorize(&c), Verdict::Deny { by, .. } if by == "a-first"));
    c.dst.set_port(80);
    assert!(matches!(host.authorize(&c), Verdict::Deny { by, .. } if by == "b-second"));
    // Outbound: only the egress plugin.
    let mut out = conn(443, Some(PEER));
    out.direction = Direction::Outbound;
    assert!(host.authorize(&out).is_allow());
    out.dst.set_port(80);
    assert!(matches!(host.authorize(&out), Verdict::Deny { by, .. } if by == "c-egress"));
}

/// A policy plugin built before the optional `authorize-scope` export existed (it exports `policy` only) still
/// loads, shows scope `all`, and is asked about every connection; one built with the SDK today exports the scope
/// too and loads alongside it.
#[test]
fn a_plugin_without_authorize_scope_loads_and_is_asked_about_everything() {
    let host = host();
    let legacy = policy("legacy", &legacy_policy(), "");
    let current = policy("current", &allowlist(), r#"{"ports": [80, 666]}"#);
    let report = host.apply(&[legacy, current], &[]);
    assert!(report.rejected().is_empty(), "{report:?}");
    let status = |name: &str| host.status().into_iter().find(|s| s.name == name).unwrap();
    assert_eq!(status("legacy").scope.as_deref(), Some("all"));
    assert_eq!(status("current").scope.as_deref(), Some("all"));
    assert!(host.authorize(&conn(80, Some(PEER))).is_allow());
    let mut elsewhere = conn(666, Some(PEER));
    elsewhere.dst_workload = Some(workload("x", "other-ns", "sa"));
    assert!(matches!(host.authorize(&elsewhere), Verdict::Deny { by, .. } if by == "legacy"));
    elsewhere.dst_workload = None;
    assert!(matches!(host.authorize(&elsewhere), Verdict::Deny { by, .. } if by == "legacy"));
    let s = status("legacy");
    assert_eq!((s.calls, s.out_of_scope), (3, 0));
}

#[test]
fn recheck_watch_and_removal() {
    let host = host();
    let mut rx = host.policy_changes();
    let p = policy("p", &allowlist(), r#"{"ports": [80]}"#);
    assert!(host.apply(std::slice::from_ref(&p), &[]).recheck);
    assert!(rx.has_changed().expect("watch"));
    rx.mark_unchanged();
    // Unchanged: no re-check.
    assert!(!host.apply(std::slice::from_ref(&p), &[]).recheck);
    assert!(!rx.has_changed().expect("watch"));
    // Opt-out: a new version without recheck does not bump.
    let mut quiet = (*policy("p", &allowlist(), r#"{"ports": [81]}"#)).clone();
    quiet.recheck = false;
    assert!(!host.apply(&[Arc::new(quiet)], &[]).recheck);
    // Removal.
    let report = host.apply(&[], &[]);
    assert_eq!(report.get("p"), Some(&Outcome::Removed));
    assert!(host.authorize(&conn(9999, Some(PEER))).is_allow());
    assert!(host.status().is_empty());
}

#[test]
fn never_loaded_fail_closed_plugin_denies_and_fail_open_does_not() {
    let host = host();
    let bad = |name: &str, open: bool| {
        let mut s = (*policy(name, &allowlist(), "{}")).clone();
        s.sha256 = Some("11".repeat(32));
        if open {
            s.failure_policy = weft_state::FailurePolicy::FailOpen;
        }
        Arc::new(s)
    };
    host.apply(&[bad("open", true)], &[]);
    assert!(host.authorize(&conn(80, Some(PEER))).is_allow());
    host.apply(&[bad("closed", false)], &[]);
    match host.authorize(&conn(80, Some(PEER))) {
        Verdict::Deny { by, reason } => {
            assert_eq!(by, "closed");
            assert!(reason.contains("sha256 mismatch"), "{reason}");
        }
        v => panic!("{v:?}"),
    }
    assert_eq!(host.status()[0].state, "rejected");
}

#[test]
fn compiled_form_is_cached_on_disk() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = HostConfig {
        cache_dir: Some(dir.path().join("cache")),
        ..HostConfig::default()
    };
    let p = policy("p", &allowlist(), r#"{"ports": [80]}"#);
    let h1 = PluginHost::new(cfg.clone()).expect("host");
    loaded(&h1.apply(std::slice::from_ref(&p), &[]), "p");
    // One compiled entry (beside the cache's integrity key).
    let files: Vec<_> = std::fs::read_dir(dir.path().join("cache"))
        .expect("cache dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|name| name != "cache.key")
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    // A second host (a restart) loads the serialized form.
    let h2 = PluginHost::new(cfg).expect("host");
    loaded(&h2.apply(&[p], &[]), "p");
    assert!(h2.authorize(&conn(80, Some(PEER))).is_allow());
}

#[test]
fn telemetry_plugin_metrics_and_status() {
    let host = host();
    let report = host.apply(
        &[
            telemetry("counter", &counter(), ""),
            policy("p", &allowlist(), "{}"),
        ],
        &[],
    );
    assert!(report.rejected().is_empty(), "{report:?}");
    let c = Arc::new(conn(80, Some(PEER)));
    host.on_open(&c);
    host.on_close(
        &c,
        &weft_hooks::CloseRecord {
            bytes_sent: 100,
            bytes_received: 2000,
            duration: std::time::Duration::from_millis(5),
            verdict: Verdict::Allow,
            error: None,
            response_flags: "-",
        },
    );
    host.flush_telemetry();
    let m = host.metrics_text();
    for line in [
        "conn_counter_opened_total{direction=\"inbound\",destination_workload=\"server\"} 1",
        "conn_counter_closed_total{direction=\"inbound\",destination_workload=\"server\",verdict=\"allow\"} 1",
        "conn_counter_bytes_total{direction=\"inbound\",way=\"received\"} 2000",
        "conn_counter_open{direction=\"inbound\"} 0",
        "conn_counter_duration_seconds_count{direction=\"inbound\"} 1",
        "weft_plugin_calls_total{plugin=\"counter\",kind=\"telemetry\"}",
    ] {
        assert!(m.contains(line), "missing {line} in\n{m}");
    }
    let status = serde_json::to_value(host.status()).expect("json");
    assert_eq!(status[0]["name"], "counter");
    assert_eq!(status[0]["state"], "serving");
    assert_eq!(status[1]["kind"], "policy");
}

/// A policy plugin is called by every data-path thread at once and keeps the instances the host pre-warms; a
/// telemetry plugin is called by the telemetry thread alone and keeps two (one to call, one spare), whatever the
/// pre-warm count, also after a state update loads its next version.
#[test]
fn a_telemetry_plugin_keeps_two_instances_a_policy_plugin_the_prewarmed_count() {
    let host = PluginHost::new(HostConfig {
        prewarm_instances: 6,
        max_idle_per_plugin: 8,
        ..HostConfig::default()
    })
    .unwrap();
    let specs = [
        telemetry("counter", &counter(), ""),
        policy("p", &allowlist(), "{}"),
    ];
    for policies in [vec![], vec![authz("a")]] {
        let report = host.apply(&specs, &policies);
        assert!(report.rejected().is_empty(), "{report:?}");
        let pools: Vec<_> = host
            .status()
            .into_iter()
            .map(|s| (s.name, s.kind, s.pool_target, s.idle_instances))
            .collect();
        assert_eq!(
            pools,
            [
                ("counter".to_string(), "telemetry", 2, 2),
                ("p".to_string(), "policy", 6, 6)
            ],
            "with {} policies",
            policies.len()
        );
    }
}

#[test]
fn every_plugin_builds_for_wasm32() {
    let built = weft_plugin_host::testing::build_plugins_workspace().expect("build plugins/");
    assert!(built.len() >= 3, "{built:?}");
}

fn authz(name: &str) -> Arc<weft_state::Policy> {
    Arc::new(weft_state::Policy {
        name: name.to_string(),
        namespace: "shop".to_string(),
        scope: weft_state::PolicyScope::Namespace,
        action: weft_state::PolicyAction::Allow,
        dry_run: false,
        rules: vec![vec![vec![weft_state::PolicyMatch {
            principals: vec![weft_state::StringMatch::Prefix(
                "cluster.local/ns/shop/".into(),
            )],
            source_ips: vec!["10.0.0.0/8".parse().expect("cidr")],
            not_destination_ports: vec![9999],
            ..Default::default()
        }]]],
    })
}

/// Authorization policies reach the plugins that ask for them, as a new configured version; a state the plugin
/// refuses is rejected while the previous state keeps serving; plugins that don't ask are left alone.
#[test]
fn policy_state_updates() {
    let host = host();
    let mut rx = host.policy_changes();
    let report = host.apply(
        &[
            policy("s", &misbehave(), "state"),
            policy("p", &allowlist(), "{}"),
        ],
        &[authz("a")],
    );
    assert!(report.rejected().is_empty(), "{report:?}");
    rx.mark_unchanged();
    let reason = |host: &PluginHost| match host.authorize(&conn(666, Some(PEER))) {
        Verdict::Deny { reason, .. } => reason,
        v => panic!("{v:?}"),
    };
    assert_eq!(reason(&host), "policies: [shop/a]");
    let report = host.apply(
        &[
            policy("s", &misbehave(), "state"),
            policy("p", &allowlist(), "{}"),
        ],
        &[authz("a"), authz("b")],
    );
    assert_eq!(report.get("s"), Some(&Outcome::StateUpdated));
    assert_eq!(report.get("p"), Some(&Outcome::Unchanged));
    assert!(report.recheck && rx.has_changed().expect("watch"));
    assert_eq!(reason(&host), "policies: [shop/a,shop/b]");
    let report = host.apply(
        &[policy("s", &misbehave(), "state")],
        &[authz("a"), authz("reject-me")],
    );
    let (why, serving) = rejected(&report, "s");
    assert!(why.contains("refusing a policy named reject-me"), "{why}");
    assert!(serving.is_some());
    assert_eq!(reason(&host), "policies: [shop/a,shop/b]");
}
