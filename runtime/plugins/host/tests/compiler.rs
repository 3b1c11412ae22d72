//! A compiler child that misbehaves fails the load with a reason that says what happened, and nothing is loaded
//! from what it wrote unless the engine accepts it: one that cannot start, hangs past its deadline, crashes,
//! reports the component invalid, writes nothing, or writes garbage. (The real child, `weft compile-plugin`, is
//! exercised end to end in `conformance/tests/plugins.rs`.)
#![allow(clippy::unwrap_used)] // a test panics to fail

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use weft_hooks::{ConnectionHooks, Verdict};
use weft_plugin_host::testing::conn;
use weft_plugin_host::{Compiler, HostConfig, Outcome, PluginHost, SubprocessCompiler};
use weft_state::PluginSpec;

/// A host whose compiler child is `sh -c script` (the engine settings arrive as `$1..`, unused).
fn host_with_child(script: &str, timeout: Duration) -> PluginHost {
    PluginHost::new(HostConfig {
        prewarm_instances: 1,
        compiler: Compiler::Subprocess(SubprocessCompiler {
            program: "/bin/sh".into(),
            args: vec!["-c".into(), script.into(), "sh".into()],
            timeout,
            address_space_limit: None,
        }),
        ..HostConfig::default()
    })
    .unwrap()
}

fn allowlist_spec() -> Arc<PluginSpec> {
    let wasm = allowlist();
    let mut spec = (*policy("p", &wasm, r#"{"ports": [80]}"#)).clone();
    spec.source = pinned_code(&wasm);
    Arc::new(spec)
}

/// The reason `p` was rejected for; nothing serves in its place.
fn rejection(host: &PluginHost) -> String {
    let report = host.apply(&[allowlist_spec()], &[]);
    let reason = match report.get("p") {
        Some(Outcome::Rejected {
            reason,
            still_serving: None,
        }) => reason.clone(),
        other => panic!("expected a rejection, got {other:?} in {report:?}"),
    };
    // A fail-closed policy that never loaded denies, naming why.
    match host.authorize(&conn(80, Some(PEER))) {
        Verdict::Deny { reason: why, .. } => assert!(
            why.starts_with("plugin not loaded (fail-closed): ") && why.ends_with(&reason),
            "{why}"
        ),
        other => panic!("{other:?}"),
    }
    reason
}

/// The reason `p` is rejected for when the compiler child is `sh -c script` with a generous deadline.
fn rejection_by(script: &str) -> String {
    rejection(&host_with_child(script, Duration::from_secs(60)))
}

#[test]
fn a_compiler_that_cannot_start_is_a_clear_rejection() {
    let host = PluginHost::new(HostConfig {
        prewarm_instances: 1,
        compiler: Compiler::Subprocess(SubprocessCompiler {
            program: "/nonexistent/weft".into(),
            args: vec!["compile-plugin".into()],
            timeout: Duration::from_secs(60),
            address_space_limit: None,
        }),
        ..HostConfig::default()
    })
    .unwrap();
    let reason = rejection(&host);
    assert!(
        reason.contains("the plugin compiler failed")
            && reason.contains("/nonexistent/weft")
            && reason.contains("cannot start the compiler process"),
        "{reason}"
    );
}

#[test]
fn a_compiler_past_its_deadline_is_killed_and_the_version_rejected() {
    // The child would sleep a minute; the deadline is a fraction of that, so the test ends when it is killed.
    let host = host_with_child("exec sleep 60", Duration::from_millis(300));
    let started = Instant::now();
    let reason = rejection(&host);
    assert!(
        reason.contains("did not finish within 300ms and was killed"),
        "{reason}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(50),
        "the load did not wait for the child's sleep"
    );
}

#[test]
fn a_compiler_that_crashes_is_a_rejection_naming_the_signal() {
    let reason = rejection_by("cat >/dev/null; echo 'about to crash' >&2; kill -KILL $$");
    assert!(
        reason.contains("the compiler process failed") && reason.contains("SIGKILL"),
        "{reason}"
    );
    assert!(
        reason.contains("about to crash"),
        "its stderr is kept: {reason}"
    );
}

#[test]
fn a_component_the_child_finds_invalid_is_rejected_with_the_childs_reason() {
    let reason = rejection_by("cat >/dev/null; echo 'magic header not detected' >&2; exit 1");
    assert_eq!(
        reason,
        "not a valid WebAssembly component: magic header not detected"
    );
}

#[test]
fn an_artifact_the_engine_does_not_accept_is_never_loaded() {
    let reason = rejection_by("cat >/dev/null; printf 'not an artifact'");
    assert!(
        reason.contains("the compiled artifact does not load into this engine"),
        "{reason}"
    );
}

#[test]
fn a_child_that_writes_nothing_is_a_rejection() {
    let reason = rejection_by("cat >/dev/null");
    assert!(
        reason.contains("the compiler process wrote no artifact"),
        "{reason}"
    );
}
