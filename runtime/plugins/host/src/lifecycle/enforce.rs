//! No policy left unenforced by accident: Istio's AuthorizationPolicies that apply to a connection's destination
//! when no serving policy plugin that selects the connection enforces them. A plugin enforces them when it asks for
//! them (`configure` returns `authorization-policies` among its state kinds), as `istio-authz` does; replacing it
//! with a plugin of the same name that does not, or turning the default plugins off, would otherwise leave the
//! mesh's policies silently unenforced (ztunnel always enforces them). Such a connection is denied, the policy is
//! logged once with the reason and counted, and `/config_dump` shows the policies no plugin at all enforces, unless
//! the operator opts out (`--allow-unenforced-policies`).

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::{Arc, Mutex};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use weft_hooks::WorkloadMeta;
use weft_state::{Policy, PolicyScope};

use crate::metrics::host::PolicyLabel;

/// The enforced (not dry-run) policies, indexed by where they apply.
#[derive(Debug)]
pub(crate) struct Unenforced {
    /// GLOBAL policies: every workload.
    global: Vec<String>,
    /// NAMESPACE policies by namespace.
    by_namespace: BTreeMap<String, Vec<String>>,
    /// WORKLOAD_SELECTOR policies: the workloads that list them.
    selected: HashSet<String>,
    /// Policies logged already (once each).
    logged: Mutex<HashSet<String>>,
    /// `weft_plugin_unenforced_policy_denials_total{policy}`.
    denials: Family<PolicyLabel, Counter>,
}

impl Unenforced {
    /// The index of `policies`; `None` when none is in force (no policy, or dry-run ones only: leaving those to no
    /// plugin changes no decision).
    pub(crate) fn build(
        policies: &[Arc<Policy>],
        denials: Family<PolicyLabel, Counter>,
    ) -> Option<Self> {
        let mut u = Self {
            global: Vec::new(),
            by_namespace: BTreeMap::new(),
            selected: HashSet::new(),
            logged: Mutex::new(HashSet::new()),
            denials,
        };
        for p in policies.iter().filter(|p| !p.dry_run) {
            let key = format!("{}/{}", p.namespace, p.name);
            match p.scope {
                PolicyScope::Global => u.global.push(key),
                PolicyScope::Namespace => u
                    .by_namespace
                    .entry(p.namespace.clone())
                    .or_default()
                    .push(key),
                PolicyScope::WorkloadSelector => {
                    u.selected.insert(key);
                }
            }
        }
        (!u.global.is_empty() || !u.by_namespace.is_empty() || !u.selected.is_empty()).then_some(u)
    }

    /// The first policy in force that applies to workload `w`, as ztunnel picks them for a destination: the global
    /// ones, its namespace's, and the WORKLOAD_SELECTOR ones it lists.
    pub(crate) fn applying<'a>(&'a self, w: &'a WorkloadMeta) -> Option<&'a str> {
        self.global
            .first()
            .or_else(|| self.by_namespace.get(&w.namespace).and_then(|v| v.first()))
            .or_else(|| {
                w.authorization_policies
                    .iter()
                    .find(|k| self.selected.contains(*k))
            })
            .map(String::as_str)
    }

    /// Count a connection denied because `policy` is unenforced, and log the policy the first time.
    pub(crate) fn denied(&self, policy: &str, workload: &WorkloadMeta) {
        self.denials
            .get_or_create(&vec![("policy".to_owned(), policy.to_owned())])
            .inc();
        let first = self
            .logged
            .lock()
            .map(|mut l| l.insert(policy.to_owned()))
            .unwrap_or(false);
        if first {
            tracing::error!(policy, workload = %workload.uid,
                "authorization policy applies to a local workload but no serving policy plugin enforces Istio's \
                 AuthorizationPolicy (none that selects the connection asks for the policies): its connections are \
                 denied; serve istio-authz (or a plugin that enforces them), or pass --allow-unenforced-policies");
        }
    }

    /// Every policy in force (for `/config_dump` when no plugin at all enforces them).
    pub(crate) fn keys(&self) -> BTreeSet<String> {
        self.global
            .iter()
            .chain(self.by_namespace.values().flatten())
            .chain(&self.selected)
            .cloned()
            .collect()
    }
}

/// The reason a connection to a workload `policy` applies to is denied.
pub(crate) fn reason(policy: &str) -> String {
    format!(
        "authorization policy {policy} applies but no serving policy plugin enforces Istio's AuthorizationPolicy \
         (fail-closed; --allow-unenforced-policies opts out)"
    )
}
