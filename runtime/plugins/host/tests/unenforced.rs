//! No policy left unenforced by accident, in the real host with real plugins: when Istio authorization policies apply
//! to a connection's destination and the serving policy plugins do not enforce them (here `port-allowlist` serves
//! under the name `istio-authz`, as a replaced default plugin would), the connection is denied with the reason, the
//! policy is counted and listed for `/config_dump`; the operator can opt out; `istio-authz` itself enforces them, so
//! nothing is added to its decisions.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use weft_hooks::Verdict;
use weft_plugin_host::HostConfig;
use weft_plugin_host::testing::{Harness, build_plugin, conn, spec, workload};
use weft_state::{PluginKind, Policy, PolicyAction, PolicyScope};

fn policy(name: &str, ns: &str, scope: PolicyScope, dry_run: bool) -> Arc<Policy> {
    Arc::new(Policy {
        name: name.into(),
        namespace: ns.into(),
        scope,
        action: PolicyAction::Deny,
        dry_run,
        // Never matches (no rules): what matters is that it applies, not what it says.
        rules: Vec::new(),
    })
}

/// `port-allowlist` (allows everything with an empty config) serving as `istio-authz`: it does not ask for the
/// mesh's authorization policies, so it enforces none.
fn replaced(config: HostConfig) -> Harness {
    let wasm = build_plugin("plugins/port-allowlist").unwrap();
    Harness::with_spec(spec("istio-authz", PluginKind::Policy, &wasm, "{}"), config).unwrap()
}

fn denied_by_weft(v: &Verdict, policy: &str) -> bool {
    matches!(v, Verdict::Deny { by, reason } if by == "weft"
        && reason.contains(&format!("authorization policy {policy} applies"))
        && reason.contains("--allow-unenforced-policies"))
}

#[test]
fn an_unenforced_policy_fails_closed_for_the_workloads_it_applies_to() {
    let h = replaced(HostConfig::default());
    let peer = Some("spiffe://cluster.local/ns/shop/sa/frontend");
    // No policy: nothing to enforce.
    assert_eq!(h.authorize(&conn(8080, peer)), Verdict::Allow);
    assert!(h.host().unenforced_policies().is_empty());

    // A policy of another namespace does not apply to `shop/server`; one of its own does.
    h.set_policies(&[policy("other-ns", "other", PolicyScope::Namespace, false)]);
    assert_eq!(h.authorize(&conn(8080, peer)), Verdict::Allow);
    h.set_policies(&[policy("deny-some", "shop", PolicyScope::Namespace, false)]);
    let v = h.authorize(&conn(8080, peer));
    assert!(denied_by_weft(&v, "shop/deny-some"), "{v:?}");
    // Counted, and listed for /config_dump with why.
    let m = h.metrics_text();
    assert!(
        m.contains("weft_plugin_unenforced_policy_denials_total{policy=\"shop/deny-some\"} 1"),
        "{m}"
    );
    let listed = h.host().unenforced_policies();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert!(listed[0].contains("shop/deny-some"), "{listed:?}");

    // A dry-run policy decides nothing: leaving it to no plugin changes nothing.
    h.set_policies(&[policy("audit-only", "shop", PolicyScope::Namespace, true)]);
    assert_eq!(h.authorize(&conn(8080, peer)), Verdict::Allow);

    // A global policy applies to every workload; a WORKLOAD_SELECTOR one to the workloads that list it.
    h.set_policies(&[policy(
        "mesh-wide",
        "istio-system",
        PolicyScope::Global,
        false,
    )]);
    assert!(denied_by_weft(
        &h.authorize(&conn(8080, peer)),
        "istio-system/mesh-wide"
    ));
    h.set_policies(&[policy(
        "strict",
        "istio-system",
        PolicyScope::WorkloadSelector,
        false,
    )]);
    assert_eq!(h.authorize(&conn(8080, peer)), Verdict::Allow);
    let mut listed_by = conn(8080, peer);
    let mut w = (*workload("server", "shop", "backend")).clone();
    w.authorization_policies = vec!["istio-system/strict".into()];
    listed_by.dst_workload = Some(Arc::new(w));
    assert!(denied_by_weft(
        &h.authorize(&listed_by),
        "istio-system/strict"
    ));

    // Outbound is not where Istio's policies are enforced.
    let mut out = conn(8080, peer);
    out.direction = weft_hooks::Direction::Outbound;
    h.set_policies(&[policy("deny-some", "shop", PolicyScope::Namespace, false)]);
    assert_eq!(h.authorize(&out), Verdict::Allow);
}

#[test]
fn the_operator_can_opt_out() {
    let h = replaced(HostConfig {
        allow_unenforced_policies: true,
        ..HostConfig::default()
    });
    h.set_policies(&[policy("deny-some", "shop", PolicyScope::Namespace, false)]);
    assert_eq!(
        h.authorize(&conn(
            8080,
            Some("spiffe://cluster.local/ns/shop/sa/frontend")
        )),
        Verdict::Allow
    );
    assert!(h.host().unenforced_policies().is_empty());
}

#[test]
fn istio_authz_enforces_them_so_nothing_is_added() {
    let wasm = build_plugin("plugins/istio-authz").unwrap();
    let h = Harness::with_spec(
        spec("istio-authz", PluginKind::Policy, &wasm, ""),
        HostConfig::default(),
    )
    .unwrap();
    // A DENY policy with no rules never matches: istio-authz allows, and the guard does not step in.
    h.set_policies(&[policy("deny-some", "shop", PolicyScope::Namespace, false)]);
    assert_eq!(
        h.authorize(&conn(
            8080,
            Some("spiffe://cluster.local/ns/shop/sa/frontend")
        )),
        Verdict::Allow
    );
    assert!(h.host().unenforced_policies().is_empty());
}
