//! Malicious plugins against the real host: each misbehaviour is stopped by the sandbox (the error kind says
//! which limit caught it), the failure policy applies, the instance is replaced in the background, a call never
//! instantiates on the caller's thread, and a well-behaved plugin is not held up meanwhile. No assertion here
//! depends on how fast the machine is: they wait for events (counters, status) with generous overall timeouts.
#![allow(clippy::unwrap_used)] // a test panics to fail

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::*;
use weft_hooks::{ConnectionHooks, Verdict};
use weft_plugin_host::testing::conn;
use weft_plugin_host::{HostConfig, Outcome, PluginHost};
use weft_state::FailurePolicy;
use weft_testkit::eventually_blocking as eventually;

/// `common::policy` with the code read under the wasm build lock into an inline source: another test binary
/// may rebuild the plugins meanwhile, and a file read in the middle of a rewrite is not a component.
fn policy(name: &str, wasm: &std::path::Path, config: &str) -> Arc<weft_state::PluginSpec> {
    let mut spec = (*common::policy(name, wasm, config)).clone();
    spec.source = common::pinned_code(wasm);
    Arc::new(spec)
}

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

/// Runs the bad call; checks the verdict, the error kind counted (which limit stopped it), and that the plugin
/// still serves after.
fn contained(mode: &str, kind: &str) {
    contained_with(mode, kind, &HostConfig::default());
}

fn contained_with(mode: &str, kind: &str, cfg: &HostConfig) {
    let host = load(mode, FailurePolicy::FailClosed, cfg);
    let v = host.authorize(&conn(666, Some(PEER)));
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
    // The poisoned instance was thrown away and is replaced in the background; the plugin keeps serving good
    // calls (from the instances left, or the replacement once it is ready).
    wait_for_idle(&host, "bad", 1);
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

fn status(host: &PluginHost, name: &str) -> weft_plugin_host::PluginStatus {
    host.status().into_iter().find(|s| s.name == name).unwrap()
}

/// Waits until the plugin's pool holds at least `n` idle instances.
fn wait_for_idle(host: &PluginHost, name: &str, n: usize) {
    eventually(&format!("{name} to have {n} idle instances"), || {
        (status(host, name).idle_instances >= n).then_some(())
    });
}

/// A `weft_plugin_errors_total` value.
fn errors(host: &PluginHost, plugin: &str, kind: &str) -> u64 {
    let prefix = format!("weft_plugin_errors_total{{plugin=\"{plugin}\",kind=\"{kind}\"}} ");
    host.metrics_text()
        .lines()
        .find_map(|l| l.strip_prefix(&prefix)?.parse().ok())
        .unwrap_or_else(|| panic!("no {prefix}"))
}

#[test]
fn endless_loop_times_out() {
    contained("loop", "timeout");
}

/// The epoch ticker parks when no call runs; a call that then loops forever wakes it and is still stopped at its
/// deadline (a ticker that stayed parked would let it spin for ever: the call runs on its own thread, so that fails
/// the test instead of hanging it).
#[test]
fn endless_loop_times_out_after_the_idle_ticker_parked() {
    let host = Arc::new(load(
        "loop",
        FailurePolicy::FailClosed,
        &HostConfig::default(),
    ));
    let parked = eventually("the idle epoch ticker to park", || {
        let t = host.epoch_ticker();
        t.parked.then_some(t)
    });
    // It slowed down before it parked (it found no call running).
    assert!(
        parked.interval > HostConfig::default().epoch_tick,
        "{parked:?}"
    );
    let (tx, rx) = std::sync::mpsc::channel();
    let caller = host.clone();
    std::thread::spawn(move || {
        let _ = tx.send(caller.authorize(&conn(666, Some(PEER))));
    });
    let v = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("the looping call was never interrupted: the parked ticker did not wake for it");
    assert!(
        matches!(&v, Verdict::Deny { reason, .. } if reason.contains("timeout")),
        "{v:?}"
    );
    let after = host.epoch_ticker();
    assert!(
        after.ticks > parked.ticks,
        "the ticker did not tick for the call: {parked:?} -> {after:?}"
    );
    assert_eq!(errors(&host, "bad", "timeout"), 1);
    // With no call left, it parks again.
    eventually("the ticker to park again", || {
        (host.epoch_ticker().parks > parked.parks).then_some(())
    });
}

/// With a generous deadline the bomb reaches the memory cap and traps there.
#[test]
fn memory_bomb_hits_the_cap() {
    let cfg = HostConfig {
        call_deadline: Duration::from_millis(500),
        memory_limit: 8 << 20,
        ..HostConfig::default()
    };
    contained_with("bomb", "memory", &cfg);
}

/// With the default deadline (10 ms) a bomb is stopped by whichever comes first, the cap or the deadline.
#[test]
fn memory_bomb_ends_within_the_default_deadline() {
    let host = load("bomb", FailurePolicy::FailClosed, &HostConfig::default());
    let v = host.authorize(&conn(666, Some(PEER)));
    match v {
        Verdict::Deny { reason, .. } => assert!(
            reason.contains("memory") || reason.contains("timeout"),
            "{reason}"
        ),
        Verdict::Allow => panic!("allowed"),
    }
    assert_eq!(
        errors(&host, "bad", "memory") + errors(&host, "bad", "timeout"),
        1
    );
}

#[test]
fn trap_is_contained() {
    contained("trap", "trap");
}

/// Loads and stores outside the instance's memory trap: just past its end, and near the top of the 32-bit space
/// (inside the engine's reservation, which the compiled code relies on in place of bounds checks).
#[test]
fn memory_outside_the_instance_traps() {
    for mode in ["read-past-end", "read-far", "write-past-end"] {
        contained(mode, "trap");
    }
}

#[test]
fn panic_is_a_trap() {
    contained("panic", "trap");
}

#[test]
fn deep_recursion_overflows_the_stack() {
    contained("recursion", "stack_overflow");
}

#[test]
fn oversized_reason_is_bad_output() {
    let cfg = HostConfig {
        call_deadline: Duration::from_millis(500),
        ..HostConfig::default()
    };
    contained_with("big-reason", "bad_output", &cfg);
}

/// The global allocator of this test binary, recording the largest allocation made by a thread while it tracks.
struct TrackingAllocator;

thread_local! {
    /// `Some(largest so far)` while this thread tracks its allocations.
    static LARGEST_ALLOCATION: Cell<Option<usize>> = const { Cell::new(None) };
}

fn note_allocation(size: usize) {
    let _ = LARGEST_ALLOCATION.try_with(|l| {
        if let Some(largest) = l.get()
            && size > largest
        {
            l.set(Some(size));
        }
    });
}

#[allow(unsafe_code)]
// SAFETY: forwards every call to the system allocator unchanged; the bookkeeping only touches a const-initialised
// thread-local `Cell` (no allocation, no destructor).
unsafe impl GlobalAlloc for TrackingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note_allocation(layout.size());
        // SAFETY: the caller's contract is the system allocator's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note_allocation(layout.size());
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note_allocation(new_size);
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: TrackingAllocator = TrackingAllocator;

/// A 10 MB deny reason is refused while it is still in the guest's memory: the host never allocates room for
/// it (the call runs on this thread, whose allocations are tracked).
#[test]
fn oversized_reason_is_refused_before_it_is_copied() {
    let cfg = HostConfig {
        call_deadline: Duration::from_millis(500),
        ..HostConfig::default()
    };
    let host = load("big-reason", FailurePolicy::FailClosed, &cfg);
    let c = conn(666, Some(PEER));
    LARGEST_ALLOCATION.with(|l| l.set(Some(0)));
    let v = host.authorize(&c);
    let largest = LARGEST_ALLOCATION.with(|l| l.replace(None)).unwrap();
    assert!(
        largest < 1 << 20,
        "the host allocated {largest} bytes during the call (the reason is 10 MiB)"
    );
    match v {
        Verdict::Deny { by, reason } => {
            assert_eq!(by, "bad");
            assert!(
                reason.contains("bad_output") && reason.contains("refused before copying"),
                "{reason}"
            );
        }
        Verdict::Allow => panic!("fail-closed plugin allowed"),
    }
    assert_eq!(errors(&host, "bad", "bad_output"), 1);
}

#[test]
fn configure_that_never_returns_is_rejected() {
    let host = PluginHost::new(HostConfig {
        configure_deadline: Duration::from_millis(50),
        ..HostConfig::default()
    })
    .expect("host");
    // `apply` returns at all: the 50 ms configure budget stopped the endless `configure` (the reason says so).
    let report = host.apply(&[policy("bad", &misbehave(), "configure-loop")], &[]);
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

/// The optional `authorize-scope` call is sandboxed like `configure`: one that traps or never returns rejects the
/// version, with the stage and the limit in the reason, and the fail-closed plugin denies what it would judge.
#[test]
fn a_scope_call_that_traps_or_spins_rejects_the_version() {
    for (mode, kind) in [("scope-trap", "trap"), ("scope-loop", "timeout")] {
        let host = PluginHost::new(HostConfig {
            configure_deadline: Duration::from_millis(50),
            ..HostConfig::default()
        })
        .expect("host");
        let report = host.apply(&[policy("bad", &misbehave(), mode)], &[]);
        let reason = match report.get("bad") {
            Some(Outcome::Rejected { reason, .. }) => reason.clone(),
            other => panic!("{mode}: {other:?}"),
        };
        assert!(
            reason.contains("authorize-scope") && reason.contains(kind),
            "{mode}: {reason}"
        );
        assert!(!host.authorize(&conn(80, Some(PEER))).is_allow(), "{mode}");
    }
}

/// The host trusts a declared scope: a plugin that says it needs to see nothing is not called, so even the port
/// its `authorize` would deny is allowed, and the connection is counted as out of scope, not as a call.
#[test]
fn a_declared_scope_is_trusted_and_counted() {
    let host = load(
        "scope-nothing",
        FailurePolicy::FailClosed,
        &HostConfig::default(),
    );
    assert_eq!(
        status(&host, "bad").scope.as_deref(),
        Some("namespaces=[] policies=[] unknown_destination=false")
    );
    assert_eq!(host.authorize(&conn(666, Some(PEER))), Verdict::Allow);
    let s = status(&host, "bad");
    assert_eq!((s.calls, s.out_of_scope), (0, 1));
    assert!(
        host.metrics_text()
            .contains("weft_plugin_out_of_scope_total{plugin=\"bad\"} 1"),
        "{}",
        host.metrics_text()
    );
    // The same plugin declaring nothing (`deny` mode: scope all) is called and denies.
    let all = load("deny", FailurePolicy::FailClosed, &HostConfig::default());
    assert_eq!(status(&all, "bad").scope.as_deref(), Some("all"));
    assert!(!all.authorize(&conn(666, Some(PEER))).is_allow());
    let s = status(&all, "bad");
    assert_eq!((s.calls, s.out_of_scope), (1, 0));
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
        m.contains("weft_plugin_metric_dropped_total{plugin=\"bad\",reason=\"series_cap\"} 9900"),
        "{m}"
    );
}

/// While a bad plugin's call loops on another thread, a good plugin's calls go through: plugins share no lock
/// and no thread. The bad call has a long budget, so it is provably still running when the good calls are done
/// (its instance is still checked out and no timeout is counted yet).
#[test]
fn a_looping_plugin_does_not_hold_up_another_plugins_calls() {
    let host = Arc::new(
        PluginHost::new(HostConfig {
            prewarm_instances: 1,
            call_deadline: Duration::from_secs(3),
            ..HostConfig::default()
        })
        .expect("host"),
    );
    let mut good = (*policy("good", &allowlist(), r#"{"ports": [80, 666]}"#)).clone();
    good.selector.workloads = vec!["server".into()];
    let mut bad = (*policy("bad", &misbehave(), "loop")).clone();
    bad.selector.workloads = vec!["other".into()];
    let report = host.apply(&[Arc::new(good), Arc::new(bad)], &[]);
    assert!(report.rejected().is_empty(), "{report:?}");

    let mut bad_conn = conn(666, Some(PEER));
    bad_conn.dst_workload = Some(weft_plugin_host::testing::workload("other", "shop", "x"));
    let done = Arc::new(AtomicBool::new(false));
    let looping = {
        let (host, done) = (host.clone(), done.clone());
        std::thread::spawn(move || {
            let v = host.authorize(&bad_conn);
            done.store(true, Ordering::SeqCst);
            v
        })
    };
    // The bad call is running: its only instance is checked out.
    eventually("the bad call to start", || {
        (status(&host, "bad").busy_instances == 1).then_some(())
    });
    let good_conn = conn(80, Some(PEER));
    for i in 0..200 {
        assert_eq!(host.authorize(&good_conn), Verdict::Allow, "good call {i}");
    }
    assert!(
        !done.load(Ordering::SeqCst),
        "the bad call ended before the good calls did (it has a 3 s CPU budget)"
    );
    assert_eq!(errors(&host, "bad", "timeout"), 0);
    let bad_verdict = looping.join().expect("looping thread");
    assert!(!bad_verdict.is_allow());
    assert_eq!(errors(&host, "bad", "timeout"), 1);
    for kind in ["timeout", "trap", "no_instance", "instantiate"] {
        assert_eq!(errors(&host, "good", kind), 0, "{kind}");
    }
}

/// The attack from issue #8: a policy plugin whose `authorize` traps on every call (each failure throws the
/// instance away) and whose `configure` spins in every instance but the first. Calls never instantiate or
/// configure on the caller's thread: once the pool is empty each call fails at once with `no_instance` and the
/// failure policy applies, while the background refill keeps failing (counted as `instantiate`, backing off).
/// Another plugin's calls are unaffected.
#[test]
fn an_exhausted_pool_applies_the_failure_policy_at_once() {
    for failure in [FailurePolicy::FailClosed, FailurePolicy::FailOpen] {
        let host = PluginHost::new(HostConfig {
            prewarm_instances: 1,
            configure_deadline: Duration::from_millis(100),
            ..HostConfig::default()
        })
        .expect("host");
        let mut good = (*policy("good", &allowlist(), r#"{"ports": [80]}"#)).clone();
        good.selector.workloads = vec!["server".into()];
        let mut bad = (*policy("bad", &misbehave(), "trap-refill-spin")).clone();
        bad.selector.workloads = vec!["other".into()];
        bad.failure_policy = failure;
        let report = host.apply(&[Arc::new(good), Arc::new(bad)], &[]);
        assert!(report.rejected().is_empty(), "{report:?}");
        let mut bad_conn = conn(80, Some(PEER));
        bad_conn.dst_workload = Some(weft_plugin_host::testing::workload("other", "shop", "x"));
        let good_conn = conn(80, Some(PEER));
        let expect = |v: Verdict, kind: &str| match (failure, v) {
            (FailurePolicy::FailClosed, Verdict::Deny { by, reason }) => {
                assert_eq!(by, "bad");
                assert!(reason.contains(kind), "{reason}");
            }
            (FailurePolicy::FailOpen, Verdict::Allow) => {}
            (_, v) => panic!("{failure:?}: {v:?}"),
        };

        // The only instance traps and is thrown away.
        expect(host.authorize(&bad_conn), "trap");
        assert_eq!(errors(&host, "bad", "trap"), 1);
        // At once, whatever the refill is doing: no instance, failure policy.
        expect(host.authorize(&bad_conn), "no_instance");
        // The refill's `configure` spins to its deadline on the refill thread, and fails.
        eventually("a failed refill", || {
            (errors(&host, "bad", "instantiate") >= 1).then_some(())
        });
        let st = status(&host, "bad");
        let refill_error = st.refill_error.clone().unwrap_or_default();
        assert!(
            refill_error.contains("configure") && refill_error.contains("timeout"),
            "{st:?}"
        );
        for _ in 0..3 {
            expect(host.authorize(&bad_conn), "instance pool exhausted");
        }
        // Counted as its own kind, in the metrics and the status; the trap was the only call that ran.
        assert_eq!(errors(&host, "bad", "no_instance"), 4);
        assert_eq!(errors(&host, "bad", "trap"), 1);
        assert_eq!(errors(&host, "bad", "timeout"), 0);
        let st = status(&host, "bad");
        assert_eq!(st.errors.get("no_instance"), Some(&4), "{st:?}");
        assert_eq!((st.idle_instances, st.busy_instances), (0, 0), "{st:?}");
        // The other plugin is unaffected.
        for _ in 0..50 {
            assert_eq!(host.authorize(&good_conn), Verdict::Allow);
        }
        let good = status(&host, "good");
        assert!(good.errors.is_empty(), "{good:?}");
        assert_eq!(good.idle_instances, 1, "{good:?}");
    }
}

/// A healthy plugin's instance that traps is replaced in the background: the pool is full again without any
/// call creating an instance.
#[test]
fn the_pool_refills_in_the_background_after_a_trap() {
    let host = PluginHost::new(HostConfig {
        prewarm_instances: 1,
        ..HostConfig::default()
    })
    .expect("host");
    let report = host.apply(&[policy("bad", &misbehave(), "trap")], &[]);
    assert!(report.rejected().is_empty(), "{report:?}");
    for round in 1..=3 {
        assert!(!host.authorize(&conn(666, Some(PEER))).is_allow());
        assert_eq!(errors(&host, "bad", "trap"), round);
        // No call in between: only the refill thread can bring the pool back to its one instance.
        wait_for_idle(&host, "bad", 1);
        assert_eq!(host.authorize(&conn(80, Some(PEER))), Verdict::Allow);
    }
    assert_eq!(errors(&host, "bad", "no_instance"), 0);
    assert_eq!(errors(&host, "bad", "instantiate"), 0);
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

/// The workload handles a reused instance is lent name the workloads of *this* call, also once the instance has
/// seen more distinct workloads than it keeps between calls (old entries evicted, new ones pushed), and with none.
#[test]
fn a_reused_instance_is_lent_the_workloads_of_each_call() {
    let host = host();
    let report = host.apply(&[policy("wl", &misbehave(), "workloads")], &[]);
    assert!(report.rejected().is_empty(), "{report:?}");
    let workloads: Vec<_> = (0..40)
        .map(|i| weft_plugin_host::testing::workload(&format!("w{i}"), "shop", "sa"))
        .collect();
    for round in 0..3 {
        for i in 0..workloads.len() {
            let mut c = conn(666, Some(PEER));
            c.src_workload = Some(workloads[i].clone());
            c.dst_workload = Some(workloads[(i * 7 + round) % workloads.len()].clone());
            let expected = format!("src=w{i} dst=w{}", (i * 7 + round) % workloads.len());
            match host.authorize(&c) {
                Verdict::Deny { reason, .. } => assert_eq!(reason, expected, "round {round}"),
                v => panic!("round {round}, call {i}: {v:?}"),
            }
        }
    }
    let mut c = conn(666, Some(PEER));
    c.src_workload = None;
    c.dst_workload = Some(workloads[3].clone());
    match host.authorize(&c) {
        Verdict::Deny { reason, .. } => assert_eq!(reason, "src=- dst=w3"),
        v => panic!("{v:?}"),
    }
}
