//! Tests that refused config files say which file, which field and which line (and column).

#![allow(clippy::unwrap_used)]

use std::path::Path;

use weft_state::ConfigError;
use weft_state::local::{load, parse_named};

const FILE: &str = "/etc/weft/config.yaml";

/// Parse `text`, expect a refusal at `line`, and check the message names the file, the line and every `needles`.
fn refused(text: &str, line: usize, needles: &[&str]) -> String {
    let err = parse_named(text, Path::new(FILE)).unwrap_err();
    let msg = err.to_string();
    assert_eq!(err.line(), Some(line), "{msg}");
    assert!(msg.starts_with(FILE), "file missing: {msg}");
    assert!(
        msg.contains(&format!("line {line}, column ")),
        "line missing: {msg}"
    );
    for n in needles {
        assert!(msg.contains(n), "{n:?} missing: {msg}");
    }
    assert!(matches!(err, ConfigError::Invalid { .. }));
    msg
}

const POLICY_HEAD: &str =
    "policies:\n- name: p\n  namespace: ns\n  scope: Namespace\n  action: Allow\n  rules:\n";

#[test]
fn unknown_fields() {
    refused(
        "workloads:\n- name: a\n  namespace: ns\n  bogus: 1\n",
        4,
        &["workloads[0]", "unknown field `bogus`"],
    );
    refused("workload: []\n", 1, &["unknown field `workload`"]);
    refused(
        "services:\n- name: s\n  namespace: ns\n  hostname: h\n  vip: [/10.0.0.1]\n",
        5,
        &["services[0]", "unknown field `vip`"],
    );
    // A misspelt match key would silently widen a policy: refused.
    refused(
        &format!("{POLICY_HEAD}  - - - notDestinationPort: [9999]\n"),
        7,
        &[
            "policies[0].rules[0][0][0]",
            "unknown field `notDestinationPort`",
        ],
    );
    refused(
        "workloads: [{name: a, namespace: b, locality: {region: r, foo: 1}}]\n",
        1,
        &["workloads[0].locality", "unknown field `foo`"],
    );
}

#[test]
fn bad_ip_cidr_and_vip() {
    refused(
        "workloads:\n- name: a\n  namespace: ns\n  workloadIps:\n  - 10.0.0.1\n  - 10.0.0.300\n",
        6,
        &[
            "workloads[0].workloadIps[1]",
            "invalid IP address \"10.0.0.300\"",
        ],
    );
    refused(
        &format!("{POLICY_HEAD}  - - - sourceIps:\n        - 10.0.0.0/8\n        - 10.0.0.0/33\n"),
        9,
        &[
            "policies[0].rules[0][0][0].sourceIps[1]",
            "invalid CIDR \"10.0.0.0/33\"",
        ],
    );
    refused(
        &format!("{POLICY_HEAD}  - - - notDestinationIps: [10.0.0.x]\n"),
        7,
        &["notDestinationIps[0]", "10.0.0.x"],
    );
    refused(
        "services:\n- name: s\n  namespace: ns\n  hostname: h\n  vips:\n  - /10.0.0.1\n  - 10.0.0.2\n",
        7,
        &["services[0].vips[1]", "invalid VIP \"10.0.0.2\""],
    );
    refused(
        "services:\n- name: s\n  namespace: ns\n  hostname: h\n  vips: [net/nope]\n",
        5,
        &["services[0].vips[0]", "invalid VIP"],
    );
}

#[test]
fn bad_enum_values() {
    refused(
        "workloads:\n- name: a\n  namespace: ns\n  protocol: HBONEX\n",
        4,
        &[
            "workloads[0].protocol",
            "unknown variant `HBONEX`",
            "`TCP` or `HBONE`",
        ],
    );
    refused(
        "policies:\n- name: p\n  namespace: ns\n  scope: Cluster\n  action: Allow\n  rules: []\n",
        4,
        &["policies[0].scope", "unknown variant `Cluster`"],
    );
    refused(
        &format!("{POLICY_HEAD}  - - - principals:\n        - !Exact a\n        - !Regex b\n"),
        9,
        &["principals[1]", "unknown variant `Regex`"],
    );
    refused(
        "plugins:\n- name: p\n  kind: nope\n  path: a\n",
        3,
        &["plugins[0].kind", "unknown variant `nope`"],
    );
    refused(
        "plugins:\n- name: p\n  kind: policy\n  path: a\n  failurePolicy: fail_closed\n",
        5,
        &["plugins[0].failurePolicy", "`failClosed` or `failOpen`"],
    );
}

#[test]
fn duplicate_uid_and_ip() {
    refused(
        "workloads:\n- uid: x\n  namespace: ns\n- uid: y\n  namespace: ns\n- uid: x\n  namespace: ns\n",
        6,
        &[
            "workloads[2]",
            "duplicate workload uid \"x\"",
            "workloads[0]",
        ],
    );
    // Derived uids (no `uid`) collide too.
    refused(
        "workloads:\n- {name: a, namespace: ns}\n- {name: a, namespace: ns}\n",
        3,
        &["workloads[1]", "duplicate workload uid \"//Pod/ns/a\""],
    );
    refused(
        "workloads:\n- uid: x\n  namespace: ns\n  workloadIps: [10.0.0.1]\n- uid: y\n  namespace: ns\n  workloadIps: [10.0.0.2, 10.0.0.1]\n",
        5,
        &["workloads[1]", "duplicate workload IP 10.0.0.1"],
    );
    refused(
        "workloads:\n- uid: x\n  namespace: ns\n  workloadIps: [10.0.0.1, 10.0.0.1]\n",
        2,
        &["workloads[0]", "10.0.0.1 is listed twice"],
    );
}

#[test]
fn bad_ports_and_service_names() {
    refused(
        "services:\n- name: s\n  namespace: ns\n  hostname: h\n  ports:\n    80: 8080\n    0: 8080\n",
        7,
        &["services[0].ports", "service port 0"],
    );
    refused(
        "workloads:\n- uid: x\n  namespace: ns\n  services:\n    ns/h:\n      0: 1\n",
        6,
        &["workloads[0].services.ns/h", "service port 0"],
    );
    refused(
        "workloads:\n- uid: x\n  namespace: ns\n  services:\n    h: {80: 1}\n",
        5,
        &["workloads[0].services", "invalid service name \"h\""],
    );
    refused(
        "services:\n- name: s\n  namespace: ns\n  hostname: h\n  ports: {70000: 1}\n",
        5,
        &["services[0].ports", "70000"],
    );
}

#[test]
fn bad_plugins() {
    refused(
        "plugins:\n- name: p\n  kind: policy\n",
        2,
        &["plugins[0]", "set one of `path`"],
    );
    refused(
        "plugins:\n- name: p\n  kind: policy\n  path: a.wasm\n  inline: AAAA\n",
        2,
        &["plugins[0]", "exactly one of `path` or `inline`"],
    );
    refused(
        "plugins:\n- name: p\n  kind: policy\n  inline: '@@@'\n",
        4,
        &["plugins[0].inline", "invalid base64"],
    );
    refused(
        "plugins:\n- name: p\n  kind: policy\n  path: a.wasm\n  sha256: abc\n",
        5,
        &["plugins[0].sha256", "invalid sha256", "64 hex digits"],
    );
    refused(
        "plugins:\n- name: p\n  kind: policy\n  path: a.wasm\n  sha256: zz00000000000000000000000000000000000000000000000000000000000000\n",
        5,
        &["plugins[0].sha256", "invalid sha256"],
    );
    refused(
        &format!(
            "plugins:\n- name: p\n  kind: policy\n  inline: AAAA\n  sha256: {}\n",
            "0".repeat(64)
        ),
        2,
        &["plugins[0]", "`inline` has sha256"],
    );
    refused(
        "plugins:\n- name: p\n  kind: policy\n  path: a\n- name: p\n  kind: telemetry\n  path: b\n",
        5,
        &["plugins[1]", "duplicate plugin name \"p\""],
    );
    refused(
        "plugins:\n- name: p\n  kind: policy\n  path: a\n  directions: []\n",
        2,
        &["plugins[0]", "`directions`"],
    );
}

#[test]
fn yaml_syntax_and_missing_fields() {
    refused("workloads:\n- name: a\n\tnamespace: ns\n", 3, &["tab"]);
    refused(
        "workloads:\n- name: a\n  workloadIps: [10.0.0.1]\n",
        2,
        &["workloads[0]", "missing field `namespace`"],
    );
}

#[test]
fn unreadable_file_names_the_file() {
    let err = load(Path::new("/nonexistent/weft/config.yaml")).unwrap_err();
    assert!(matches!(err, ConfigError::Read { .. }));
    assert_eq!(err.file(), Path::new("/nonexistent/weft/config.yaml"));
    assert!(
        err.to_string()
            .starts_with("/nonexistent/weft/config.yaml: cannot read config file")
    );
}

#[test]
fn inline_text_is_named_inline() {
    let err = weft_state::local::parse("workloads: 3\n", Path::new("/")).unwrap_err();
    assert!(err.to_string().starts_with("<inline>: line 1"), "{err}");
}
