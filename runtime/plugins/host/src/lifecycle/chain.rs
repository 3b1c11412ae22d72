//! The plugin chain the data path sees: policy plugins per direction, ordered by priority, and telemetry plugins.
//! Swapped whole (`arc-swap`) on every change; a connection's call sees one consistent chain.

use std::sync::Arc;

use weft_hooks::{ConnectionRecord, Direction, Verdict};
use weft_state::{FailurePolicy, PluginKind, PluginSpec};

use crate::lifecycle::enforce::Unenforced;
use crate::lifecycle::shadow::{Shadow, ShadowQueue};
use crate::versions::version::PluginVersion;
use crate::wit::bindings::types as wit;

/// A policy plugin in the chain: a serving version, or a spec that never loaded and fails closed.
#[derive(Clone)]
pub(crate) enum Link {
    Serving(Arc<PluginVersion>),
    /// No version ever loaded and the failure policy is fail-closed: deny what it selects.
    Broken {
        spec: Arc<PluginSpec>,
        reason: String,
    },
}

impl Link {
    fn spec(&self) -> &PluginSpec {
        match self {
            Link::Serving(v) => &v.spec,
            Link::Broken { spec, .. } => spec,
        }
    }
}

/// The current chain.
#[derive(Default, Clone)]
pub(crate) struct Chain {
    pub inbound: Vec<Link>,
    pub outbound: Vec<Link>,
    pub telemetry: Vec<Arc<PluginVersion>>,
    /// The policies in force, when unenforced ones must fail closed (`None`: none in force, or the operator opted
    /// out).
    pub unenforced: Option<Arc<Unenforced>>,
    /// The shadow versions of serving policy plugins (few; empty when none has one).
    pub shadows: Vec<Arc<Shadow>>,
    /// Where a shadow decision is queued (set when `shadows` is not empty).
    pub shadow_queue: Option<ShadowQueue>,
    /// The shadow versions of serving telemetry plugins: given the same events, their metrics kept apart.
    pub telemetry_shadows: Vec<Arc<PluginVersion>>,
}

impl Chain {
    /// Builds the chain from the serving versions and the specs that never loaded, failing closed for `unenforced`
    /// policies.
    pub fn build(
        serving: &[Arc<PluginVersion>],
        broken: &[(Arc<PluginSpec>, String)],
        unenforced: Option<Arc<Unenforced>>,
    ) -> Chain {
        let mut links: Vec<Link> = serving
            .iter()
            .filter(|v| v.spec.kind == PluginKind::Policy)
            .map(|v| Link::Serving(v.clone()))
            .chain(
                broken
                    .iter()
                    .filter(|(s, _)| {
                        s.kind == PluginKind::Policy
                            && s.failure_policy == FailurePolicy::FailClosed
                    })
                    .map(|(s, r)| Link::Broken {
                        spec: s.clone(),
                        reason: r.clone(),
                    }),
            )
            .collect();
        links.sort_by(|a, b| {
            (a.spec().priority, &a.spec().name).cmp(&(b.spec().priority, &b.spec().name))
        });
        let mut telemetry: Vec<Arc<PluginVersion>> = serving
            .iter()
            .filter(|v| v.spec.kind == PluginKind::Telemetry)
            .cloned()
            .collect();
        telemetry
            .sort_by(|a, b| (a.spec.priority, &a.spec.name).cmp(&(b.spec.priority, &b.spec.name)));
        Chain {
            inbound: links
                .iter()
                .filter(|l| l.spec().directions.inbound)
                .cloned()
                .collect(),
            outbound: links
                .iter()
                .filter(|l| l.spec().directions.outbound)
                .cloned()
                .collect(),
            telemetry,
            unenforced,
            shadows: Vec::new(),
            shadow_queue: None,
            telemetry_shadows: Vec::new(),
        }
    }

    /// Queues `verdict` of the serving version `v` for its shadow, if it has one (never waits).
    fn shadow(&self, v: &PluginVersion, conn: &ConnectionRecord, verdict: &Verdict) {
        if self.shadows.is_empty() {
            return;
        }
        if let Some(queue) = &self.shadow_queue
            && let Some(shadow) = self.shadows.iter().find(|s| s.plugin == v.spec.name)
        {
            queue.offer(shadow, conn, verdict);
        }
    }

    /// Whether no serving inbound policy plugin enforces Istio's AuthorizationPolicy at all (for `/config_dump`).
    pub fn enforces_no_policy(&self) -> bool {
        !self.inbound.iter().any(|l| match l {
            Link::Serving(v) => v.wants.contains(wit::StateKinds::AUTHORIZATION_POLICIES),
            Link::Broken { .. } => false,
        })
    }

    /// Runs the policy chain: every selected plugin must allow; the first deny wins. A plugin is not called about a
    /// connection outside its declared scope (it allows those).
    pub fn authorize(&self, conn: &ConnectionRecord) -> Verdict {
        let links = match conn.direction {
            Direction::Inbound => &self.inbound,
            Direction::Outbound => &self.outbound,
        };
        // Whether a plugin that enforces Istio's AuthorizationPolicy saw (or declared it need not see) this one.
        let mut enforced = false;
        for link in links {
            if !crate::versions::version::selects(link.spec(), conn) {
                continue;
            }
            if let Link::Serving(v) = link {
                enforced |= v.wants.contains(wit::StateKinds::AUTHORIZATION_POLICIES);
            }
            let verdict = match link {
                Link::Serving(v) if !v.scope.covers(conn) => {
                    // The plugin declared it allows everything outside its scope.
                    v.ctx.counters.out_of_scope.inc();
                    continue;
                }
                Link::Serving(v) => {
                    let verdict = v.authorize(conn);
                    self.shadow(v, conn, &verdict);
                    verdict
                }
                Link::Broken { spec, reason } => Verdict::Deny {
                    by: spec.name.clone(),
                    reason: format!("plugin not loaded (fail-closed): {reason}"),
                },
            };
            if let Verdict::Deny { by, reason } = &verdict {
                tracing::debug!(target: "plugin", conn = conn.id, plugin = %by, reason = %reason, "connection denied");
                return verdict;
            }
        }
        // Istio's policies are enforced where the connection arrives, as ztunnel enforces them.
        if !enforced
            && conn.direction == Direction::Inbound
            && let Some(u) = &self.unenforced
            && let Some(w) = &conn.dst_workload
            && let Some(policy) = u.applying(w)
        {
            u.denied(policy, w);
            return Verdict::Deny {
                by: "weft".into(),
                reason: crate::lifecycle::enforce::reason(policy),
            };
        }
        Verdict::Allow
    }
}
