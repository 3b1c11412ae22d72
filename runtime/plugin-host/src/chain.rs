//! The plugin chain the data path sees: policy plugins per direction, ordered by priority, and telemetry plugins.
//! Swapped whole (`arc-swap`) on every change; a connection's call sees one consistent chain.

use std::sync::Arc;

use weft_hooks::{ConnectionRecord, Direction, Verdict};
use weft_state::{FailurePolicy, PluginKind, PluginSpec};

use crate::plugin::PluginVersion;

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
}

impl Chain {
    /// Builds the chain from the serving versions and the specs that never loaded.
    pub fn build(serving: &[Arc<PluginVersion>], broken: &[(Arc<PluginSpec>, String)]) -> Chain {
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
        }
    }

    /// Runs the policy chain: every selected plugin must allow; the first deny wins. A plugin is not called about a
    /// connection outside its declared scope (it allows those).
    pub fn authorize(&self, conn: &ConnectionRecord) -> Verdict {
        let links = match conn.direction {
            Direction::Inbound => &self.inbound,
            Direction::Outbound => &self.outbound,
        };
        for link in links {
            if !crate::plugin::selects(link.spec(), conn) {
                continue;
            }
            let verdict = match link {
                Link::Serving(v) if !v.scope.covers(conn) => {
                    // The plugin declared it allows everything outside its scope.
                    v.ctx.counters.out_of_scope.inc();
                    continue;
                }
                Link::Serving(v) => v.authorize(conn),
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
        Verdict::Allow
    }
}
