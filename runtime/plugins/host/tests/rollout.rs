//! Safe rollout with real plugins in the real host, on an injected clock: a new version that starts trapping is
//! swapped back for the previous one (counted, reported, refused when resent, until different code arrives); a
//! healthy one, or one whose failures stay under the threshold, passes probation; failures after the window, or
//! with probation disabled, roll nothing back.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{PEER, allowlist, misbehave, pinned_code, policy};
use weft_plugin_host::testing::conn;
use weft_plugin_host::{HostConfig, ManualClock, Outcome, PluginHost, RollbackEvent, sha256_hex};
use weft_state::{PluginRollout, PluginSource, PluginSpec};

struct Setup {
    host: PluginHost,
    clock: Arc<ManualClock>,
}

fn setup(rollout: PluginRollout) -> Setup {
    let clock = Arc::new(ManualClock::default());
    let host = PluginHost::new(HostConfig {
        // Enough warm instances that a burst of traps (each throws its instance away) never finds the pool empty.
        prewarm_instances: 12,
        max_idle_per_plugin: 12,
        rollout,
        clock: clock.clone(),
        ..HostConfig::default()
    })
    .expect("host");
    Setup { host, clock }
}

fn rollout(min_calls: u32, ratio: f64) -> PluginRollout {
    PluginRollout {
        window: Duration::from_secs(60),
        max_failure_ppm: PluginRollout::ppm(ratio),
        min_calls,
        disabled: false,
    }
}

/// A spec with its code read once (inline), so the test knows its sha256 and a rebuild cannot change it.
fn pinned(name: &str, wasm: &std::path::Path, config: &str) -> (Arc<PluginSpec>, String) {
    let mut s = (*policy(name, wasm, config)).clone();
    s.source = pinned_code(wasm);
    let sha = match &s.source {
        PluginSource::Inline(b) => sha256_hex(b),
        PluginSource::Path(_) => unreachable!(),
    };
    (Arc::new(s), sha)
}

fn rollbacks_metric(host: &PluginHost, plugin: &str) -> u64 {
    let prefix = format!("weft_plugin_rollbacks_total{{plugin=\"{plugin}\"}} ");
    host.metrics_text()
        .lines()
        .find_map(|l| l.strip_prefix(&prefix).and_then(|v| v.trim().parse().ok()))
        .unwrap_or(0)
}

/// Waits (30 s floor) for the rollout thread's report.
fn next_rollback(rx: &mut tokio::sync::broadcast::Receiver<RollbackEvent>) -> RollbackEvent {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async { tokio::time::timeout(Duration::from_secs(60), rx.recv()).await })
        .expect("no rollback within 60 s")
        .expect("rollback channel")
}

#[test]
fn a_version_that_starts_trapping_is_rolled_back_and_refused_when_resent() {
    let s = setup(rollout(5, 0.5));
    let (good, good_sha) = pinned("p", &allowlist(), r#"{"ports": [666, 80]}"#);
    let (bad, bad_sha) = pinned("p", &misbehave(), "trap");
    assert!(matches!(
        s.host.apply(std::slice::from_ref(&good), &[]).get("p"),
        Some(Outcome::Loaded { .. })
    ));
    // The first version replaced nothing: no probation.
    assert!(!s.host.status()[0].on_probation);
    let mut rx = s.host.rollbacks();
    assert!(matches!(
        s.host.apply(std::slice::from_ref(&bad), &[]).get("p"),
        Some(Outcome::Loaded { .. })
    ));
    assert!(s.host.status()[0].on_probation);

    // Port 666 traps in the new version (fail-closed: denied). Five calls, five traps: over 50 % of >= 5.
    for _ in 0..5 {
        assert!(!s.host_authorize(666).is_allow());
    }
    let e = next_rollback(&mut rx);
    assert_eq!(e.plugin, "p");
    assert_eq!(
        (e.rolled_back_sha256.as_str(), e.restored_sha256.as_str()),
        (bad_sha.as_str(), good_sha.as_str())
    );
    assert_eq!((e.calls, e.failures, e.traps, e.timeouts), (5, 5, 5, 0));
    assert!((e.max_failure_ratio - 0.5).abs() < 1e-9);
    // The previous version serves again: 666 is allowed.
    assert!(s.host_authorize(666).is_allow());
    assert_eq!(rollbacks_metric(&s.host, "p"), 1);
    let st = &s.host.status()[0];
    assert_eq!(
        (st.state, st.sha256.as_deref()),
        ("serving-previous", Some(good_sha.as_str()))
    );
    assert!(
        st.last_error
            .as_deref()
            .is_some_and(|r| r.contains("rolled back")),
        "{st:?}"
    );
    assert!(!st.on_probation);

    // The same code resent is refused; so is the same code with another config.
    for spec in [bad.clone(), pinned("p", &misbehave(), "deny").0] {
        match s.host.apply(&[spec], &[]).get("p") {
            Some(Outcome::Rejected {
                reason,
                still_serving,
            }) => {
                assert!(
                    reason.contains("rolled back") && reason.contains(&bad_sha),
                    "{reason}"
                );
                assert_eq!(still_serving.as_deref(), Some(good_sha.as_str()));
            }
            other => panic!("{other:?}"),
        }
    }
    assert!(s.host_authorize(666).is_allow());
    // Different code lifts the refusal (here: the restored code with another config).
    let (other, _) = pinned("p", &allowlist(), r#"{"ports": [80]}"#);
    assert!(matches!(
        s.host.apply(&[other], &[]).get("p"),
        Some(Outcome::Loaded { .. })
    ));
    assert!(!s.host_authorize(666).is_allow());
    assert!(matches!(
        s.host.apply(&[bad], &[]).get("p"),
        Some(Outcome::Loaded { .. })
    ));
    assert_eq!(rollbacks_metric(&s.host, "p"), 1);
}

#[test]
fn a_healthy_version_passes_probation_and_later_failures_roll_nothing_back() {
    let s = setup(rollout(5, 0.5));
    let (v1, _) = pinned("p", &allowlist(), r#"{"ports": [80]}"#);
    // misbehave "deny" denies port 666 with a plain deny and allows the rest: healthy (no call fails).
    let (v2, v2_sha) = pinned("p", &misbehave(), "deny");
    s.host.apply(&[v1], &[]);
    s.host.apply(&[v2], &[]);
    for i in 0..40 {
        let v = s.host_authorize(if i % 2 == 0 { 666 } else { 80 });
        assert_eq!(v.is_allow(), i % 2 == 1);
    }
    assert!(s.host.check_rollouts().is_empty());
    assert!(s.host.status()[0].on_probation);
    s.clock.advance(Duration::from_secs(61));
    assert!(s.host.check_rollouts().is_empty());
    let st = &s.host.status()[0];
    assert!(!st.on_probation, "{st:?}");
    assert_eq!(st.sha256.as_deref(), Some(v2_sha.as_str()));
    assert_eq!(rollbacks_metric(&s.host, "p"), 0);

    // A version that traps only after its window: nothing to roll back to any more.
    let (v3, v3_sha) = pinned("p", &misbehave(), "trap");
    s.host.apply(&[v3], &[]);
    for _ in 0..3 {
        assert!(s.host_authorize(80).is_allow());
    }
    s.clock.advance(Duration::from_secs(61));
    for _ in 0..10 {
        assert!(!s.host_authorize(666).is_allow());
    }
    assert!(s.host.check_rollouts().is_empty());
    assert_eq!(s.host.status()[0].sha256.as_deref(), Some(v3_sha.as_str()));
    assert_eq!(rollbacks_metric(&s.host, "p"), 0);
}

#[test]
fn failures_at_or_under_the_threshold_or_with_probation_disabled_roll_nothing_back() {
    let s = setup(rollout(10, 0.5));
    let (v1, _) = pinned("p", &allowlist(), r#"{"ports": [80, 666]}"#);
    let (v2, v2_sha) = pinned("p", &misbehave(), "trap");
    s.host.apply(std::slice::from_ref(&v1), &[]);
    s.host.apply(&[v2], &[]);
    // Every other call traps, a good one first: at most exactly the threshold, never over it.
    for i in 0..20 {
        let _ = s.host_authorize(if i % 2 == 0 { 80 } else { 666 });
    }
    assert!(s.host.check_rollouts().is_empty());
    assert_eq!(s.host.status()[0].sha256.as_deref(), Some(v2_sha.as_str()));

    // The plugin's own rollout: disabled. Every call traps and the version stays.
    let s = setup(rollout(1, 0.0));
    s.host.apply(&[v1], &[]);
    let (v2, v2_sha) = pinned("p", &misbehave(), "trap");
    let mut v2 = (*v2).clone();
    v2.rollout = Some(PluginRollout {
        disabled: true,
        ..rollout(1, 0.0)
    });
    s.host.apply(&[Arc::new(v2)], &[]);
    assert!(!s.host.status()[0].on_probation);
    for _ in 0..10 {
        assert!(!s.host_authorize(666).is_allow());
    }
    assert!(s.host.check_rollouts().is_empty());
    assert_eq!(s.host.status()[0].sha256.as_deref(), Some(v2_sha.as_str()));
}

impl Setup {
    fn host_authorize(&self, port: u16) -> weft_hooks::Verdict {
        use weft_hooks::ConnectionHooks;
        self.host.authorize(&conn(port, Some(PEER)))
    }
}
