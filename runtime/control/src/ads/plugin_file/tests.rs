//! Tests of the WeftPlugin file format: what a file becomes, what is refused and where.

#![allow(clippy::unwrap_used)] // test code: a panic fails the test

use super::*;

fn entry(spec: &str) -> Result<PluginEntry, ConfigError> {
    let text = format!(
        "apiVersion: weft.dev/v1alpha1\nkind: WeftPlugin\nmetadata:\n  name: p\nspec:\n  \
         url: oci://registry.example/p:v1\n{spec}"
    );
    let file = Path::new("p.yaml");
    let mut parsed = parse_file(&text, file)?;
    parsed.remove(0).into_entry(&text, Path::new("."))
}

/// What the node will decode from the served resource.
fn served(e: &PluginEntry) -> PluginResource {
    weft_state::xds::plugin::decode_resource_with("p", &e.current.body, &|_| Ok(())).unwrap()
}

#[test]
fn a_file_becomes_the_model_the_node_decodes() {
    let e = entry(
        "  pluginName: root\n  pluginConfig: {ports: [8080]}\n  failStrategy: FAIL_OPEN\n  kind: policy\n  \
         priority: 3\n  directions: [outbound]\n  recheck: false\n  rollout: {window: 10s, maxFailureRatio: 0.5}\n",
    )
    .unwrap();
    let r = served(&e);
    assert_eq!(r.root_id, "root");
    assert_eq!(r.config, r#"{"ports":[8080]}"#);
    assert_eq!(r.failure_policy, FailurePolicy::FailOpen);
    assert_eq!(r.kind, Some(PluginKind::Policy));
    assert_eq!((r.priority, r.recheck), (3, false));
    assert!(!r.directions.inbound && r.directions.outbound);
    let ro = r.rollout.unwrap();
    assert_eq!(
        (ro.window, ro.max_failure_ppm, ro.min_calls),
        (Duration::from_secs(10), 500_000, 1)
    );
    let Code::Remote(rc) = r.code else {
        panic!("remote code expected")
    };
    assert_eq!(rc.uri, "oci://registry.example/p:v1");
    assert_eq!(rc.timeout, Some(Duration::from_secs(30)));
}

#[test]
fn what_no_node_could_take_is_refused_here_naming_the_field() {
    let e = entry("  directions: []\n").err().unwrap().to_string();
    assert!(e.contains("spec.directions: empty"), "{e}");
    let e = entry("  rollout: {minCalls: 5}\n")
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("spec.rollout.window: required unless disabled"),
        "{e}"
    );
    // `nodes` alone stages the version without probation settings: nothing for the node.
    assert!(
        served(&entry("  rollout: {nodes: [a]}\n").unwrap())
            .rollout
            .is_none()
    );
}

#[test]
fn a_shadow_becomes_the_model_the_node_decodes() {
    let dir = std::env::temp_dir().join(format!("weft-shadow-file-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("v2.wasm"), b"\0asm v2").unwrap();
    let sha = hex::encode(Sha256::digest(b"\0asm v2"));
    let text = format!(
        "apiVersion: weft.dev/v1alpha1\nkind: WeftPlugin\nmetadata:\n  name: p\nspec:\n  \
         url: oci://registry.example/p:v1\n  shadow:\n    url: file://v2.wasm\n    sha256: {sha}\n    \
         pluginConfig: {{ports: []}}\n"
    );
    let e = parse_file(&text, Path::new("p.yaml"))
        .unwrap()
        .remove(0)
        .into_entry(&text, &dir)
        .unwrap();
    let sh = served(&e).shadow.unwrap();
    assert_eq!(
        sh.code,
        Code::Inline(std::sync::Arc::new(b"\0asm v2".to_vec()))
    );
    assert_eq!(sh.config, r#"{"ports":[]}"#);
    // A wrong pin is refused naming the shadow's field.
    let bad = text.replace(&sha, &"0".repeat(64));
    let err = parse_file(&bad, Path::new("p.yaml"))
        .unwrap()
        .remove(0)
        .into_entry(&bad, &dir)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("spec.shadow.sha256: "), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
    // Remote: carried with its pin.
    let r = served(
        &entry(&format!(
            "  shadow: {{url: \"https://plugins.example/p-v2.wasm\", sha256: {}}}\n",
            "ab".repeat(32)
        ))
        .unwrap(),
    );
    let sh = r.shadow.unwrap();
    assert_eq!(sh.sha256, Some("ab".repeat(32)));
    let Code::Remote(rc) = sh.code else {
        panic!("remote shadow code expected")
    };
    assert_eq!(rc.uri, "https://plugins.example/p-v2.wasm");
    assert_eq!(sh.config, "");
}

#[test]
fn a_shadow_no_node_could_take_is_refused_naming_the_field() {
    let e = entry("  shadow: {url: \"https://plugins.example/p-v2.wasm\"}\n")
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("spec.shadow.sha256: required for https://"),
        "{e}"
    );
    // A telemetry plugin's shadow is taken (its metrics are kept apart on the node).
    assert!(
        served(&entry("  kind: telemetry\n  shadow: {url: oci://registry.example/p:v2, sha256: 0167d5e1a7c1b1f4b5ef4fa3a8c7e42d3a6d0e1f2a3b4c5d6e7f8091a2b3c4d5}\n").unwrap())
            .shadow
            .is_some()
    );
    let e = entry("  shadow: {url: file://missing-v2.wasm}\n")
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("spec.shadow.url: cannot read"), "{e}");
    let e = entry("  shadow: {url: ftp://x/y}\n")
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("shadow.url") && e.contains("unsupported URL"),
        "{e}"
    );
    let e = entry("  shadow: {url: oci://registry.example/p:v2, color: red}\n")
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("unknown field `color`"), "{e}");
}

#[test]
fn errors_point_at_the_line_of_their_document_past_a_shadow() {
    let text = "apiVersion: weft.dev/v1alpha1\nkind: WeftPlugin\nmetadata:\n  name: a\nspec:\n  \
                url: oci://registry.example/a:v1\n  shadow:\n    url: oci://registry.example/a:v2\n    \
                sha256: {sha}\n---\napiVersion: weft.dev/v1alpha1\nkind: WeftPlugin\nmetadata:\n  name: b\n\
                spec:\n  url: https://plugins.example/b.wasm\n  shadow:\n    url: file://missing.wasm\n"
        .replace("{sha}", &"ab".repeat(32));
    let mut parsed = parse_file(&text, Path::new("p.yaml")).unwrap();
    let b = parsed.remove(1);
    let line = |e: ConfigError| match e {
        ConfigError::Invalid { line, message, .. } => (line, message),
        other => panic!("{other}"),
    };
    // spec.url of document b (its sha256 is missing) is line 16, not the shadow's url of document a.
    let (l, m) = line(b.into_entry(&text, Path::new(".")).err().unwrap());
    assert_eq!(l, Some(16), "{m}");
    // The shadow of document b: its `shadow:` line.
    let fixed = text.replace(
        "url: https://plugins.example/b.wasm",
        "url: oci://registry.example/b:v1",
    );
    let b = parse_file(&fixed, Path::new("p.yaml")).unwrap().remove(1);
    let (l, m) = line(b.into_entry(&fixed, Path::new(".")).err().unwrap());
    assert!(m.contains("spec.shadow.url: cannot read"), "{m}");
    assert_eq!(l, Some(17), "{m}");
}

#[test]
fn stages_become_a_plan_and_what_cannot_be_staged_is_refused_naming_the_field() {
    let e = entry(
        "  rollout:\n    stages:\n    - {nodes: 1, bake: 30s, shadowFirst: true}\n    - {percent: 50, bake: 1m}\n    \
         abortWhen: {nacks: 1, divergenceRatio: 0.01}\n",
    )
    .unwrap();
    let plan = e.plan.unwrap();
    assert_eq!(plan.stages.len(), 2);
    assert!(plan.stages[0].shadow_first);
    assert_eq!(plan.stages[1].bake, Duration::from_secs(60));
    assert_eq!(
        (plan.abort_when.nacks, plan.abort_when.divergence_ratio),
        (1, Some(0.01))
    );
    // Stages alone ask nothing of the node's probation.
    assert!(
        served(&entry("  rollout: {stages: [{nodes: 1, bake: 0s}]}\n").unwrap())
            .rollout
            .is_none()
    );
    for (spec, want) in [
        ("  rollout: {stages: []}\n", "spec.rollout.stages: empty"),
        (
            "  rollout: {nodes: [a], stages: [{nodes: 1, bake: 1s}]}\n",
            "either nodes (a manual stage) or stages",
        ),
        (
            "  rollout: {stages: [{nodes: 0, bake: 1s}]}\n",
            "stages[0].nodes: must be at least 1",
        ),
        (
            "  rollout: {stages: [{percent: 101, bake: 1s}]}\n",
            "stages[0].percent: 101 is not in 1..=100",
        ),
        (
            "  rollout: {stages: [{percent: 50, bake: 1s}, {percent: 10, bake: 1s}]}\n",
            "stages[1].percent: 10 is less than the stage before (50)",
        ),
        (
            "  rollout: {stages: [{nodes: 1, percent: 5, bake: 1s}]}\n",
            "exactly one of nodes and percent",
        ),
        (
            "  rollout: {stages: [{nodes: 1}]}\n",
            "missing field `bake`",
        ),
        (
            "  rollout: {abortWhen: {nacks: 1}}\n",
            "abortWhen: only with spec.rollout.stages",
        ),
        (
            "  rollout: {stages: [{nodes: 1, bake: 1s}], abortWhen: {failureRatio: 2}}\n",
            "not a ratio",
        ),
    ] {
        let e = entry(spec).err().unwrap().to_string();
        assert!(e.contains(want), "{spec}: {e}");
    }
}
