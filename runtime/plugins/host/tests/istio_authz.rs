//! `plugins/istio-authz` in the real host: the case table `plugins/istio-authz/tests/cases.yaml` (policies in
//! ztunnel's local-config format, one inbound connection, the expected verdict) run against the compiled plugin and
//! against the same engine compiled natively; plus re-checks on policy change, outbound, logs and metrics, a
//! 10,000-policy mesh, and config errors.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod istio_authz_native;

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use serde::Deserialize;
use serde_yaml::{Mapping, Value};
use weft_hooks::{ConnectionHooks, ConnectionRecord, Direction, Verdict, WorkloadMeta};
use weft_plugin_host::testing::{Harness, build_plugin, conn, workload};
use weft_state::Policy;

fn wasm() -> PathBuf {
    build_plugin("plugins/istio-authz").expect("build istio-authz")
}

fn cases_path() -> PathBuf {
    weft_plugin_host::testing::plugins_dir().join("istio-authz/tests/cases.yaml")
}

// ---- the case table -------------------------------------------------------------------------------------------

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct WorkloadSpec {
    name: String,
    namespace: String,
    service_account: String,
    #[serde(default)]
    authorization_policies: Vec<String>,
}

#[derive(Debug, Deserialize, PartialEq, Eq, Clone, Copy)]
#[serde(rename_all = "lowercase")]
enum Expect {
    Allow,
    Deny,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawCase {
    name: String,
    #[serde(default)]
    description: Option<String>,
    policies: Value,
    workload: Option<WorkloadSpec>,
    identity: Option<String>,
    src: IpAddr,
    dst: SocketAddr,
    expect: Expect,
    #[serde(default)]
    reason: Option<String>,
}

/// One case, ready to run.
#[derive(Debug)]
struct Case {
    name: String,
    policies: Vec<Arc<Policy>>,
    conn: ConnectionRecord,
    expect: Expect,
    reason: Option<String>,
}

/// Parses `policies` (ztunnel's local-config entries) with weft's own config loader.
fn parse_policies(value: &Value) -> Vec<Arc<Policy>> {
    let mut doc = Mapping::new();
    doc.insert(Value::from("policies"), value.clone());
    let text = serde_yaml::to_string(&Value::Mapping(doc)).unwrap();
    let cfg = weft_state::local::parse(&text, Path::new("/"))
        .unwrap_or_else(|e| panic!("policies do not parse: {e}\n{text}"));
    cfg.policies.into_iter().map(Arc::new).collect()
}

/// Loads the table: each case is `defaults` overlaid with its own keys (`workload` merged key by key).
fn load_cases(path: &Path) -> Vec<Case> {
    let text = std::fs::read_to_string(path).unwrap();
    let doc: Value = serde_yaml::from_str(&text).unwrap();
    let defaults = doc
        .get("defaults")
        .and_then(Value::as_mapping)
        .cloned()
        .unwrap_or_default();
    let cases = doc.get("cases").and_then(Value::as_sequence).unwrap();
    let mut out = Vec::new();
    let mut names = std::collections::HashSet::new();
    for raw in cases {
        let mut merged = defaults.clone();
        for (k, v) in raw.as_mapping().unwrap() {
            let merged_value = match (k.as_str(), merged.get(k), v) {
                (Some("workload"), Some(Value::Mapping(base)), Value::Mapping(over)) => {
                    let mut base = base.clone();
                    for (wk, wv) in over {
                        base.insert(wk.clone(), wv.clone());
                    }
                    Value::Mapping(base)
                }
                _ => v.clone(),
            };
            merged.insert(k.clone(), merged_value);
        }
        let raw: RawCase = serde_yaml::from_value(Value::Mapping(merged))
            .unwrap_or_else(|e| panic!("bad case {raw:?}: {e}"));
        assert!(
            names.insert(raw.name.clone()),
            "duplicate case {}",
            raw.name
        );
        let _ = raw.description;
        let dst_workload = raw.workload.map(|w| {
            let mut meta: WorkloadMeta =
                (*workload(&w.name, &w.namespace, &w.service_account)).clone();
            meta.authorization_policies = w.authorization_policies;
            Arc::new(meta)
        });
        let record = ConnectionRecord {
            direction: Direction::Inbound,
            src: SocketAddr::new(raw.src, 40000),
            dst: raw.dst,
            hbone: raw.identity.is_some(),
            peer_identity: raw.identity.map(Into::into),
            dst_workload,
            src_workload: None,
            dst_service: None,
            ..conn(raw.dst.port(), None)
        };
        out.push(Case {
            name: raw.name,
            policies: parse_policies(&raw.policies),
            conn: record,
            expect: raw.expect,
            reason: raw.reason,
        });
    }
    out
}

/// Checks one verdict against a case; `None` when it agrees.
fn check(case: &Case, got: Result<(), String>) -> Option<String> {
    match (case.expect, &got, &case.reason) {
        (Expect::Allow, Ok(()), _) => None,
        (Expect::Deny, Err(reason), Some(want)) if !reason.contains(want.as_str()) => {
            Some(format!(
                "{}: denied with {reason:?}, expected a reason containing {want:?}",
                case.name
            ))
        }
        (Expect::Deny, Err(_), _) => None,
        _ => Some(format!(
            "{}: expected {:?}, got {got:?}",
            case.name, case.expect
        )),
    }
}

#[test]
fn case_table_in_the_wasm_plugin() {
    let cases = load_cases(&cases_path());
    assert!(cases.len() >= 40, "only {} cases", cases.len());
    let h = Harness::policy(&wasm(), "").unwrap();
    let mut failures = Vec::new();
    for case in &cases {
        let report = h.set_policies(&case.policies);
        assert!(report.rejected().is_empty(), "{}: {report:?}", case.name);
        let got = match h.authorize(&case.conn) {
            Verdict::Allow => Ok(()),
            Verdict::Deny { reason, .. } => Err(reason),
        };
        failures.extend(check(case, got));
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
    // The table's answers came both from calls and from the plugin's declared scope (connections no policy
    // reaches are allowed by the host without a call), so both agree with ztunnel's.
    let s = &h.host().status()[0];
    assert!(s.calls > 0 && s.out_of_scope > 0, "{s:?}");
}

#[test]
fn case_table_in_the_native_engine() {
    let cases = load_cases(&cases_path());
    let mut failures = Vec::new();
    for case in &cases {
        let index = istio_authz_native::index(case.policies.iter().map(|p| p.as_ref()));
        failures.extend(check(case, istio_authz_native::decide(&index, &case.conn)));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

// ---- platform behaviour ---------------------------------------------------------------------------------------

fn policies(yaml: &str) -> Vec<Arc<Policy>> {
    parse_policies(&serde_yaml::from_str(yaml).unwrap())
}

const DENY_9999: &str = "[{name: deny-9999, namespace: shop, scope: Namespace, action: Deny, rules: [[[{destinationPorts: [9999]}]]]}]";
const PEER: &str = "spiffe://cluster.local/ns/shop/sa/frontend";

#[test]
fn policy_change_rechecks_live_connections() {
    let h = Harness::policy(&wasm(), "").unwrap();
    let live = conn(9999, Some(PEER));
    assert!(h.authorize(&live).is_allow());
    let mut changes = h.host().policy_changes();
    changes.mark_unchanged();
    let report = h.set_policies(&policies(DENY_9999));
    assert!(report.recheck, "{report:?}");
    assert!(
        changes.has_changed().unwrap(),
        "live connections were not asked to re-check"
    );
    match h.authorize(&live) {
        Verdict::Deny { reason, .. } => assert_eq!(reason, "explicitly denied by: shop/deny-9999"),
        Verdict::Allow => panic!("still allowed after the policy change"),
    }
    // And back: the policy removed, the connection is allowed again.
    h.set_policies(&[]);
    assert!(h.authorize(&live).is_allow());
}

/// The plugin declares which connections its policies reach (`authorize-scope`): the host allows the others
/// without a call, and the scope follows every policy change (global policies reach everything). A version whose
/// scope takes in nothing is never called, so it keeps one instance, not the pre-warmed pool.
#[test]
fn connections_no_policy_reaches_are_allowed_without_a_call() {
    let prewarmed = 4;
    let h = Harness::with_spec(
        weft_plugin_host::testing::spec("plugin", weft_state::PluginKind::Policy, &wasm(), ""),
        weft_plugin_host::HostConfig {
            prewarm_instances: prewarmed,
            max_idle_per_plugin: 8,
            ..weft_plugin_host::HostConfig::default()
        },
    )
    .unwrap();
    let status = || h.host().status().into_iter().next().unwrap();
    let calls = || {
        let s = status();
        (s.calls, s.out_of_scope)
    };
    let to = |ns: &str, listed: &[&str]| {
        let mut w = (*workload("server", ns, "backend")).clone();
        w.authorization_policies = listed.iter().map(|p| p.to_string()).collect();
        ConnectionRecord {
            dst_workload: Some(Arc::new(w)),
            ..conn(9999, Some(PEER))
        }
    };
    assert_eq!(
        status().scope.as_deref(),
        Some("namespaces=[] policies=[] unknown_destination=false")
    );
    assert_eq!((status().pool_target, status().idle_instances), (1, 1));
    assert!(h.authorize(&to("shop", &[])).is_allow());
    assert_eq!(calls(), (0, 1));

    h.set_policies(&policies(DENY_9999));
    assert_eq!(
        status().scope.as_deref(),
        Some("namespaces=[shop] policies=[shop/deny-9999] unknown_destination=false")
    );
    assert_eq!(status().pool_target, prewarmed);
    assert!(!h.authorize(&to("shop", &[])).is_allow());
    assert_eq!(calls(), (1, 1));
    assert!(h.authorize(&to("other", &[])).is_allow());
    assert_eq!(calls(), (1, 2));
    // A workload elsewhere that lists the policy is reached through it (and the plugin applies it).
    assert!(!h.authorize(&to("other", &["shop/deny-9999"])).is_allow());
    assert_eq!(calls(), (2, 2));

    h.set_policies(&policies(
        "[{name: deny-9999, namespace: istio-system, scope: Global, action: Deny, rules: [[[{destinationPorts: [9999]}]]]}]",
    ));
    assert_eq!(status().scope.as_deref(), Some("all"));
    assert!(!h.authorize(&to("other", &[])).is_allow());
    let mut unknown = to("other", &[]);
    unknown.dst_workload = None;
    assert!(!h.authorize(&unknown).is_allow());
    assert_eq!(calls(), (4, 2));
}

/// The plugin keeps what it resolves for each destination workload (its namespace's and its selecting policies)
/// under the key the host gives that workload's metadata (`workload.key`), so decisions after the first ask the
/// host nothing: metadata that
/// changed between decisions (another policy selects the workload, it moved namespace) must be decided on as it
/// is now, also when the old and the new version alternate on one reused instance.
#[test]
fn a_workload_whose_metadata_changed_is_decided_on_what_it_is_now() {
    let h = Harness::policy(&wasm(), "").unwrap();
    // A selector policy that denies port 9999, and a namespace policy that never matches (so every `shop`
    // workload is in the plugin's scope, selected or not).
    h.set_policies(&policies(
        "[{name: deny-9999, namespace: shop, scope: WorkloadSelector, action: Deny, rules: [[[{destinationPorts: [9999]}]]]},
          {name: deny-1, namespace: shop, scope: Namespace, action: Deny, rules: [[[{destinationPorts: [1]}]]]},
          {name: deny-all, namespace: store, scope: Namespace, action: Deny, rules: [[]]}]",
    ));
    let version = |ns: &str, listed: &[&str]| {
        let mut w = (*workload("server", ns, "backend")).clone();
        w.authorization_policies = listed.iter().map(|p| p.to_string()).collect();
        Arc::new(w)
    };
    let to = |w: &Arc<WorkloadMeta>| ConnectionRecord {
        dst_workload: Some(w.clone()),
        ..conn(9999, Some(PEER))
    };
    let selected = version("shop", &["shop/deny-9999"]);
    let unselected = version("shop", &[]);
    let moved = version("store", &[]);
    let calls = || h.host().status().into_iter().next().unwrap().calls;
    for round in 0..3 {
        let before = calls();
        match h.authorize(&to(&selected)) {
            Verdict::Deny { reason, .. } => {
                assert_eq!(
                    reason, "explicitly denied by: shop/deny-9999",
                    "round {round}"
                )
            }
            Verdict::Allow => panic!("round {round}: the selected version was allowed"),
        }
        assert!(
            h.authorize(&to(&unselected)).is_allow(),
            "round {round}: the unselected version was decided as the selected one"
        );
        match h.authorize(&to(&moved)) {
            Verdict::Deny { reason, .. } => {
                assert_eq!(
                    reason, "explicitly denied by: store/deny-all",
                    "round {round}"
                )
            }
            Verdict::Allow => {
                panic!("round {round}: the moved version was decided in its old namespace")
            }
        }
        assert_eq!(
            calls() - before,
            3,
            "round {round}: every decision reached the plugin"
        );
    }
}

/// A workload decided under one policy set is decided under the next one as that set says, where what was resolved
/// for it under the first (its namespace's policies and those it lists, as positions in the index) would point at
/// a policy it does not list and deny. The host hands every policy set to new instances; the plugin keeps what
/// it resolves together with the index it was resolved against (replaced as one), so an instance updated in
/// place could not mix them either.
#[test]
fn a_policy_update_resolves_every_workload_again() {
    let h = Harness::policy(&wasm(), "").unwrap();
    let mut w = (*workload("server", "shop", "backend")).clone();
    w.authorization_policies = vec!["shop/deny-9999".into()];
    let to_9999 = ConnectionRecord {
        dst_workload: Some(Arc::new(w)),
        ..conn(9999, Some(PEER))
    };
    h.set_policies(&policies(
        "[{name: allow-1, namespace: shop, scope: Namespace, action: Allow, rules: [[[{destinationPorts: [1]}]]]},
          {name: deny-9999, namespace: shop, scope: WorkloadSelector, action: Deny, rules: [[[{destinationPorts: [9999]}]]]}]",
    ));
    match h.authorize(&to_9999) {
        Verdict::Deny { reason, .. } => assert_eq!(reason, "explicitly denied by: shop/deny-9999"),
        Verdict::Allow => panic!("allowed under the first policy set"),
    }
    // The listed policy now denies another port; the one at its old position denies 9999 but is not listed.
    h.set_policies(&policies(
        "[{name: deny-9999, namespace: shop, scope: WorkloadSelector, action: Deny, rules: [[[{destinationPorts: [9998]}]]]},
          {name: deny-other, namespace: shop, scope: WorkloadSelector, action: Deny, rules: [[[{destinationPorts: [9999]}]]]}]",
    ));
    for _ in 0..2 {
        assert!(
            h.authorize(&to_9999).is_allow(),
            "decided on what was resolved against the old policy set"
        );
    }
    let s = &h.host().status()[0];
    assert_eq!((s.calls, s.out_of_scope), (3, 0), "{s:?}");
}

#[test]
fn outbound_is_not_enforced() {
    let h = Harness::policy(&wasm(), "").unwrap();
    h.set_policies(&policies(
        "[{name: deny-all, namespace: shop, scope: Namespace, action: Deny, rules: [[]]}]",
    ));
    let mut c = conn(8080, Some(PEER));
    assert!(!h.authorize(&c).is_allow());
    c.direction = Direction::Outbound;
    let mut src = (*workload("client", "shop", "frontend")).clone();
    src.authorization_policies = vec!["shop/deny-all".into()];
    c.src_workload = Some(Arc::new(src));
    assert!(h.authorize(&c).is_allow());
}

/// The plugin's log lines (target `plugin`), captured from `tracing`.
fn captured() -> &'static Mutex<Vec<String>> {
    static LINES: OnceLock<Mutex<Vec<String>>> = OnceLock::new();
    LINES.get_or_init(Default::default)
}

struct Capture;

struct Message(String);

impl tracing::field::Visit for Message {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0 = format!("{value:?}");
        }
    }
}

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
        if event.metadata().target() == "plugin" {
            let mut m = Message(String::new());
            event.record(&mut m);
            captured().lock().unwrap().push(m.0);
        }
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

fn capture_logs() {
    static SET: OnceLock<()> = OnceLock::new();
    SET.get_or_init(|| {
        let _ = tracing::subscriber::set_global_default(Capture);
    });
}

fn logged(needle: &str) -> bool {
    captured()
        .lock()
        .unwrap()
        .iter()
        .any(|l| l.contains(needle))
}

#[test]
fn denials_and_dry_runs_are_logged_and_counted() {
    capture_logs();
    let h = Harness::policy(&wasm(), r#"{"logDenials": true, "logDryRun": true}"#).unwrap();
    h.set_policies(&policies(
        "[{name: deny-9999, namespace: shop, scope: Namespace, action: Deny, rules: [[[{destinationPorts: [9999]}]]]},
          {name: audit-7777, namespace: shop, scope: Namespace, action: Deny, dryRun: true, rules: [[[{destinationPorts: [7777]}]]]}]",
    ));
    assert!(!h.authorize(&conn(9999, Some(PEER))).is_allow());
    assert!(h.authorize(&conn(7777, Some(PEER))).is_allow());
    assert!(
        logged(
            "denied 10.0.0.1:40000(spiffe://cluster.local/ns/shop/sa/frontend)->10.0.0.2:9999: explicitly denied by: shop/deny-9999"
        ),
        "{:?}",
        captured().lock().unwrap()
    );
    assert!(logged("dry-run: deny policy match: shop/audit-7777"));
    let text = h.metrics_text();
    assert!(
        text.contains(r#"istio_authz_denials_total{policy="shop/deny-9999"} 1"#),
        "{text}"
    );
    assert!(
        text.contains(
            r#"istio_authz_dry_run_matches_total{policy="shop/audit-7777",action="deny"} 1"#
        ),
        "{text}"
    );
}

#[test]
fn ten_thousand_policies_index_and_decide() {
    let h = Harness::policy(&wasm(), "").unwrap();
    let mesh: Vec<Arc<Policy>> = istio_authz_native::synthetic(10_000)
        .into_iter()
        .map(Arc::new)
        .collect();
    let t = Instant::now();
    let report = h.set_policies(&mesh);
    let load = t.elapsed();
    assert!(report.rejected().is_empty(), "{report:?}");
    let ok = istio_authz_native::synthetic_conn();
    assert!(h.authorize(&ok).is_allow());
    let mut bad = istio_authz_native::synthetic_conn();
    bad.dst = SocketAddr::new(bad.dst.ip(), 22);
    match h.authorize(&bad) {
        Verdict::Deny { reason, .. } => {
            assert_eq!(reason, "explicitly denied by: shop/deny-admin-ports")
        }
        Verdict::Allow => panic!("port 22 allowed"),
    }
    let mut other = istio_authz_native::synthetic_conn();
    other.peer_identity = Some("spiffe://cluster.local/ns/team-3/sa/api".into());
    match h.authorize(&other) {
        Verdict::Deny { reason, .. } => {
            assert_eq!(reason, "allow policies exist, but none allowed")
        }
        Verdict::Allow => panic!("team-3 allowed"),
    }
    eprintln!("10,000 policies delivered and indexed (all instances) in {load:?}");
}

#[test]
fn bad_config_is_rejected() {
    let err = Harness::policy(&wasm(), r#"{"logDenial": true}"#).unwrap_err();
    assert!(err.contains("unknown key `logDenial`"), "{err}");
    let err = Harness::policy(&wasm(), r#"{"logDenials": "yes"}"#).unwrap_err();
    assert!(err.contains("must be a boolean"), "{err}");
}

// ---- Istio ambient's own policies -------------------------------------------------------------------------------

/// The policies istiod makes of PeerAuthentications and waypoints (istio/istio at
/// 86c9f01fd735fb01d8192f5bcaf0d424afb7f14c), as weft's xDS conversion holds them:
/// `runtime/node/state/tests/istio_ambient_policies.rs` builds istiod's protobuf and asserts
/// `weft_state::xds::authorization` yields exactly these values, names included (this crate does not depend on the
/// protobuf types).
mod istiod {
    use std::sync::Arc;

    use weft_state::{Policy, PolicyAction, PolicyMatch, PolicyScope, StringMatch};

    /// `notPrincipals: [presence]` (no mTLS identity), on `ports` when any.
    pub fn plaintext(ports: &[u16]) -> PolicyMatch {
        PolicyMatch {
            not_principals: vec![StringMatch::Presence],
            destination_ports: ports.to_vec(),
            ..Default::default()
        }
    }

    /// `notDestinationPorts: [port]`.
    pub fn not_port(port: u16) -> PolicyMatch {
        PolicyMatch {
            not_destination_ports: vec![port],
            ..Default::default()
        }
    }

    /// A WORKLOAD_SELECTOR DENY policy: groups (OR) of rules (AND), each rule one match.
    pub fn deny(namespace: &str, name: &str, groups: Vec<Vec<PolicyMatch>>) -> Arc<Policy> {
        Arc::new(Policy {
            name: name.into(),
            namespace: namespace.into(),
            scope: PolicyScope::WorkloadSelector,
            action: PolicyAction::Deny,
            dry_run: false,
            rules: groups
                .into_iter()
                .map(|rules| rules.into_iter().map(|m| vec![m]).collect())
                .collect(),
        })
    }

    /// `istio-system/istio_converted_static_strict` (`DefaultPolicy`, pilot/pkg/serviceregistry/ambient/
    /// policies.go), which every STRICT workload lists.
    pub fn static_strict() -> Arc<Policy> {
        deny(
            "istio-system",
            "istio_converted_static_strict",
            vec![vec![plaintext(&[])]],
        )
    }

    /// `ns1/converted_peer_authentication_strict-mtls`: mode UNSET, port 8080 STRICT
    /// (testdata/peer-authn-unset-port-mtls-strict.yaml).
    pub fn strict_port_8080() -> Arc<Policy> {
        deny(
            "ns1",
            "converted_peer_authentication_strict-mtls",
            vec![vec![plaintext(&[8080])]],
        )
    }

    /// `ns1/converted_peer_authentication_strict-and-permissive-mtls`: mode STRICT, port 9090 PERMISSIVE
    /// (testdata/peer-authn-strict-and-permissive-port-mtls.yaml): plaintext AND not port 9090.
    pub fn strict_except_9090() -> Arc<Policy> {
        deny(
            "ns1",
            "converted_peer_authentication_strict-and-permissive-mtls",
            vec![vec![plaintext(&[]), not_port(9090)]],
        )
    }

    /// `ns1/istio_allow_waypoint_ns1_waypoint-ns` (`implicitWaypointPolicy`, policies.go; the service accounts of
    /// `TestDefaultAllowWaypointPolicy`, ambientindex_test.go).
    pub fn waypoint_allow() -> Arc<Policy> {
        Arc::new(Policy {
            name: "istio_allow_waypoint_ns1_waypoint-ns".into(),
            namespace: "ns1".into(),
            scope: PolicyScope::WorkloadSelector,
            action: PolicyAction::Allow,
            dry_run: false,
            rules: vec![vec![vec![PolicyMatch {
                principals: vec![
                    StringMatch::Exact("cluster.local/ns/ns1/sa/namespace-wide".into()),
                    StringMatch::Exact("cluster.local/ns/ns1/sa/waypoint-sa".into()),
                ],
                ..Default::default()
            }]]],
        })
    }
}

/// An inbound connection to istiod's pod `cluster0//Pod/ns1/pod1` listing `listed`, on `port`, from `peer` over
/// HBONE or, without a peer, in plaintext.
fn to_istio_pod(port: u16, peer: Option<&str>, listed: &[&str]) -> ConnectionRecord {
    let mut w = (*workload("pod1", "ns1", "sa1")).clone();
    w.uid = "cluster0//Pod/ns1/pod1".into();
    w.authorization_policies = listed.iter().map(|p| p.to_string()).collect();
    ConnectionRecord {
        dst_workload: Some(Arc::new(w)),
        hbone: peer.is_some(),
        ..conn(port, peer)
    }
}

/// The plugin's verdict and the native engine's, which must agree.
fn decided(h: &Harness, policies: &[Arc<Policy>], c: &ConnectionRecord) -> Result<(), String> {
    let wasm = match h.authorize(c) {
        Verdict::Allow => Ok(()),
        Verdict::Deny { reason, .. } => Err(reason),
    };
    let index = istio_authz_native::index(policies.iter().map(|p| p.as_ref()));
    assert_eq!(
        wasm,
        istio_authz_native::decide(&index, c),
        "plugin and native engine differ"
    );
    wasm
}

const ISTIO_PEER: &str = "spiffe://cluster.local/ns/ns2/sa/client";

#[test]
fn istiods_static_strict_policy_denies_plaintext_to_a_workload_that_lists_it() {
    let h = Harness::policy(&wasm(), "").unwrap();
    let policies = vec![istiod::static_strict()];
    let report = h.set_policies(&policies);
    assert!(report.rejected().is_empty(), "{report:?}");
    let strict = ["istio-system/istio_converted_static_strict"];
    assert_eq!(
        decided(&h, &policies, &to_istio_pod(8080, None, &strict)),
        Err("explicitly denied by: istio-system/istio_converted_static_strict".into()),
        "plaintext to a STRICT workload"
    );
    assert_eq!(
        decided(
            &h,
            &policies,
            &to_istio_pod(8080, Some(ISTIO_PEER), &strict)
        ),
        Ok(()),
        "mTLS to a STRICT workload"
    );
    // A WORKLOAD_SELECTOR policy reaches only the workloads that list it (a PERMISSIVE one lists nothing).
    assert_eq!(
        decided(&h, &policies, &to_istio_pod(8080, None, &[])),
        Ok(()),
        "plaintext to a PERMISSIVE workload"
    );
}

#[test]
fn istiods_port_level_policies_deny_plaintext_only_on_their_ports() {
    let h = Harness::policy(&wasm(), "").unwrap();
    let policies = vec![
        istiod::static_strict(),
        istiod::strict_port_8080(),
        istiod::strict_except_9090(),
    ];
    let report = h.set_policies(&policies);
    assert!(report.rejected().is_empty(), "{report:?}");

    // PERMISSIVE with port 8080 STRICT: plaintext refused on 8080 only.
    let listed = ["ns1/converted_peer_authentication_strict-mtls"];
    assert_eq!(
        decided(&h, &policies, &to_istio_pod(8080, None, &listed)),
        Err("explicitly denied by: ns1/converted_peer_authentication_strict-mtls".into())
    );
    assert_eq!(
        decided(&h, &policies, &to_istio_pod(9090, None, &listed)),
        Ok(())
    );
    assert_eq!(
        decided(
            &h,
            &policies,
            &to_istio_pod(8080, Some(ISTIO_PEER), &listed)
        ),
        Ok(())
    );

    // STRICT with port 9090 PERMISSIVE: plaintext refused everywhere but 9090.
    let listed = ["ns1/converted_peer_authentication_strict-and-permissive-mtls"];
    for port in [8080, 15000, 80] {
        assert_eq!(
            decided(&h, &policies, &to_istio_pod(port, None, &listed)),
            Err(
                "explicitly denied by: ns1/converted_peer_authentication_strict-and-permissive-mtls"
                    .into()
            ),
            "plaintext to {port}"
        );
        assert_eq!(
            decided(
                &h,
                &policies,
                &to_istio_pod(port, Some(ISTIO_PEER), &listed)
            ),
            Ok(()),
            "mTLS to {port}"
        );
    }
    assert_eq!(
        decided(&h, &policies, &to_istio_pod(9090, None, &listed)),
        Ok(()),
        "plaintext to the PERMISSIVE port"
    );
}

#[test]
fn istiods_implicit_waypoint_policy_admits_the_waypoint() {
    let h = Harness::policy(&wasm(), "").unwrap();
    let policies = vec![istiod::static_strict(), istiod::waypoint_allow()];
    let report = h.set_policies(&policies);
    assert!(report.rejected().is_empty(), "{report:?}");
    let listed = [
        "istio-system/istio_converted_static_strict",
        "ns1/istio_allow_waypoint_ns1_waypoint-ns",
    ];
    for sa in ["waypoint-sa", "namespace-wide"] {
        let waypoint = format!("spiffe://cluster.local/ns/ns1/sa/{sa}");
        assert_eq!(
            decided(&h, &policies, &to_istio_pod(8080, Some(&waypoint), &listed)),
            Ok(()),
            "{waypoint}"
        );
    }
    assert_eq!(
        decided(
            &h,
            &policies,
            &to_istio_pod(8080, Some(ISTIO_PEER), &listed)
        ),
        Err("allow policies exist, but none allowed".into())
    );
    assert_eq!(
        decided(&h, &policies, &to_istio_pod(8080, None, &listed)),
        Err("explicitly denied by: istio-system/istio_converted_static_strict".into())
    );
}
