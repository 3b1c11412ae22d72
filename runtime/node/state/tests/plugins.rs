//! Tests of weft's `plugins` section: sources (relative and absolute paths, inline base64), sha256, config
//! conversion, and every default.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::sync::Arc;

use sha2::{Digest, Sha256};
use weft_state::local::{load, parse};
use weft_state::{FailurePolicy, PluginDirections, PluginKind, PluginSource, WorkloadSelector};

#[test]
fn defaults_for_policy_and_telemetry() {
    let cfg = parse(
        "plugins:\n- name: pol\n  kind: policy\n  path: pol.wasm\n- name: tel\n  kind: telemetry\n  path: tel.wasm\n",
        Path::new("/etc/weft"),
    )
    .unwrap();
    let pol = &cfg.plugins[0];
    assert_eq!(pol.name, "pol");
    assert_eq!(pol.kind, PluginKind::Policy);
    assert_eq!(pol.source, PluginSource::Path("/etc/weft/pol.wasm".into()));
    assert_eq!(pol.sha256, None);
    assert_eq!(pol.config, "{}");
    assert_eq!(pol.failure_policy, FailurePolicy::FailClosed);
    assert_eq!(pol.priority, 0);
    assert_eq!(pol.selector, WorkloadSelector::default());
    assert_eq!(
        pol.directions,
        PluginDirections {
            inbound: true,
            outbound: false
        }
    );
    assert!(pol.recheck);
    let tel = &cfg.plugins[1];
    assert_eq!(tel.kind, PluginKind::Telemetry);
    assert_eq!(tel.failure_policy, FailurePolicy::FailOpen);
}

#[test]
fn every_field() {
    let code = b"\0asm fake component bytes";
    let b64 = "AGFzbSBmYWtlIGNvbXBvbmVudCBieXRlcw==";
    let sha = hex::encode(Sha256::digest(code));
    let text = format!(
        r#"
plugins:
- name: allowlist
  kind: policy
  inline: {b64}
  sha256: {upper}
  config:
    allow: [default, "team-*"]
    limit: 3
    nested: {{deep: true}}
  failurePolicy: failOpen
  priority: -5
  selector: {{namespaces: [default, shop], workloads: [cart-7d9]}}
  directions: [outbound, inbound]
  recheck: false
- name: audit
  kind: telemetry
  path: /opt/weft/audit.wasm
  config: "raw text, not JSON"
  failurePolicy: failClosed
  directions: [outbound]
"#,
        upper = sha.to_uppercase()
    );
    let cfg = parse(&text, Path::new("/etc/weft")).unwrap();
    let p = &cfg.plugins[0];
    assert_eq!(p.source, PluginSource::Inline(Arc::new(code.to_vec())));
    assert_eq!(p.sha256.as_deref(), Some(sha.as_str()), "kept lowercase");
    let config: serde_json::Value = serde_json::from_str(&p.config).unwrap();
    assert_eq!(
        config,
        serde_json::json!({"allow": ["default", "team-*"], "limit": 3, "nested": {"deep": true}})
    );
    assert_eq!(p.failure_policy, FailurePolicy::FailOpen);
    assert_eq!(p.priority, -5);
    assert_eq!(p.selector.namespaces, vec!["default", "shop"]);
    assert_eq!(p.selector.workloads, vec!["cart-7d9"]);
    assert_eq!(
        p.directions,
        PluginDirections {
            inbound: true,
            outbound: true
        }
    );
    assert!(!p.recheck);
    let a = &cfg.plugins[1];
    assert_eq!(a.source, PluginSource::Path("/opt/weft/audit.wasm".into()));
    assert_eq!(
        a.config, "raw text, not JSON",
        "a string stays as the string"
    );
    assert_eq!(a.failure_policy, FailurePolicy::FailClosed);
    assert_eq!(
        a.directions,
        PluginDirections {
            inbound: false,
            outbound: true
        }
    );
}

#[test]
fn inline_base64_may_be_wrapped_and_unpadded() {
    let cfg = parse(
        "plugins:\n- name: p\n  kind: policy\n  inline: |\n    AGFzbSBmYWtl\n    IGNvbXBvbmVudCBieXRlcw\n",
        Path::new("/"),
    )
    .unwrap();
    assert_eq!(
        cfg.plugins[0].source,
        PluginSource::Inline(Arc::new(b"\0asm fake component bytes".to_vec()))
    );
}

#[test]
fn relative_path_resolves_against_the_config_files_directory() {
    let dir = tempfile::tempdir().unwrap();
    let sub = dir.path().join("conf");
    std::fs::create_dir(&sub).unwrap();
    let file = sub.join("weft.yaml");
    std::fs::write(
        &file,
        "plugins:\n- name: p\n  kind: policy\n  path: ../plugins/p.wasm\n  sha256: 0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef\n",
    )
    .unwrap();
    let cfg = load(&file).unwrap();
    assert_eq!(
        cfg.plugins[0].source,
        PluginSource::Path(sub.join("../plugins/p.wasm"))
    );
    // For a path source the digest is only recorded; the plugin host checks it against the file.
    assert_eq!(
        cfg.plugins[0].sha256.as_deref(),
        Some("0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef")
    );
    let state = cfg.into_state(1);
    assert!(state.plugins.contains_key("p"));
}

#[test]
fn null_config_is_empty_object() {
    let cfg = parse(
        "plugins:\n- name: p\n  kind: policy\n  path: p.wasm\n  config: ~\n",
        Path::new("/x"),
    )
    .unwrap();
    assert_eq!(cfg.plugins[0].config, "{}");
}
