//! The nodes as a staged rollout sees them, from the registry of connected streams: per node name, its zone (from
//! the workloads the mesh state places on it), and per plugin what it ACKed and refused, the rollbacks, shadow
//! reports and call counts it sent. A node with several streams is merged into one.

use std::collections::BTreeMap;

use crate::ads::counts::CountsRecord;
use crate::ads::registry::{Nacked, NodeRecord};
use crate::ads::shadow::ShadowRecord;
use crate::kube::report::NodeReport;
use weft_proto::type_url;

/// One node.
#[derive(Debug, Clone, Default)]
pub struct NodeView {
    /// Its zone, when the mesh state says (empty otherwise).
    pub zone: String,
    /// Plugin → the version it ACKed.
    pub acked: BTreeMap<String, String>,
    /// Plugin → what it refused last.
    pub nacked: BTreeMap<String, Nacked>,
    /// Rollbacks it reported.
    pub rollbacks: Vec<RolledBack>,
    /// Plugin → its latest shadow report.
    pub shadows: BTreeMap<String, ShadowRecord>,
    /// Plugin → its latest counts.
    pub counts: BTreeMap<String, CountsRecord>,
}

/// A rollback a node reported.
#[derive(Debug, Clone, PartialEq)]
pub struct RolledBack {
    /// The plugin.
    pub plugin: String,
    /// The code rolled back.
    pub sha256: String,
    /// Its figures, for people.
    pub summary: String,
}

/// Every node with a plugin stream, by node name.
#[derive(Debug, Clone, Default)]
pub struct Fleet {
    /// By node name.
    pub nodes: BTreeMap<String, NodeView>,
}

impl Fleet {
    /// The fleet of these streams (only those subscribed to plugins), with the zone of each node name.
    pub fn of(records: &[NodeRecord], zones: &BTreeMap<String, String>) -> Self {
        let mut fleet = Self::default();
        for r in records {
            fleet.add(r, zones);
        }
        fleet
    }

    /// The fleet of the registry's streams, read in place.
    pub fn of_registry(
        registry: &crate::ads::registry::Registry,
        zones: &BTreeMap<String, String>,
    ) -> Self {
        let mut fleet = Self::default();
        registry.visit(|r| fleet.add(r, zones));
        fleet
    }

    /// Merge one stream into its node (a stream not subscribed to plugins adds nothing).
    fn add(&mut self, r: &NodeRecord, zones: &BTreeMap<String, String>) {
        let Some(t) = r.types.get(type_url::EXTENSION_CONFIG) else {
            return;
        };
        let v = self.nodes.entry(r.name.clone()).or_default();
        v.zone = zones.get(&r.name).cloned().unwrap_or_default();
        v.acked.extend(t.acked.clone());
        v.nacked.extend(t.nacked.clone());
        v.rollbacks.extend(r.rollbacks.iter().map(|rb| RolledBack {
            plugin: rb.plugin.clone(),
            sha256: rb.rolled_back_sha256.clone(),
            summary: format!(
                "{} of {} calls failed ({} traps, {} timeouts) in {:.1}s",
                rb.failures, rb.calls, rb.traps, rb.timeouts, rb.after_seconds
            ),
        }));
        v.shadows.extend(r.shadows.clone());
        v.counts.extend(r.counts.clone());
    }

    /// The fleet as the replicas' reports give it: every replica's nodes, what the WeftPlugin controller's leader
    /// steps rollouts over.
    pub fn of_reports(reports: &BTreeMap<String, NodeReport>) -> Self {
        let nodes = reports
            .iter()
            .map(|(name, r)| {
                let v = NodeView {
                    zone: String::new(),
                    acked: r.plugins.clone(),
                    nacked: r
                        .nacked
                        .iter()
                        .map(|(p, (version, reason))| {
                            (
                                p.clone(),
                                Nacked {
                                    version: version.clone(),
                                    reason: reason.clone(),
                                    at: String::new(),
                                },
                            )
                        })
                        .collect(),
                    rollbacks: r
                        .rollbacks
                        .iter()
                        .map(|rb| RolledBack {
                            plugin: rb.plugin.clone(),
                            sha256: rb.sha256.clone(),
                            summary: rb.reason.clone(),
                        })
                        .collect(),
                    shadows: r.shadows.clone(),
                    counts: r.counts.clone(),
                };
                (name.clone(), v)
            })
            .collect();
        Self { nodes }
    }

    /// The zone of each node name that runs a workload with a zone in `addresses`.
    pub fn zones(addresses: &crate::ads::resources::TypeSet) -> BTreeMap<String, String> {
        use weft_proto::istio::workload::{Address, address};
        let mut out = BTreeMap::new();
        for r in addresses.values() {
            let Ok(a) = weft_proto::from_any::<Address>(type_url::ADDRESS, &r.body) else {
                continue;
            };
            if let Some(address::Type::Workload(w)) = a.r#type
                && !w.node.is_empty()
                && let Some(l) = w.locality
                && !l.zone.is_empty()
            {
                out.entry(w.node).or_insert(l.zone);
            }
        }
        out
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a test panics to fail
mod tests {
    use std::sync::Arc;

    use weft_proto::istio::workload::{Address, Locality, Workload, address};

    use super::*;
    use crate::ads::resources::Resource;

    fn workload(uid: &str, node: &str, zone: &str) -> (String, Arc<Resource>) {
        let a = Address {
            r#type: Some(address::Type::Workload(Workload {
                uid: uid.into(),
                node: node.into(),
                locality: (!zone.is_empty()).then(|| Locality {
                    zone: zone.into(),
                    ..Locality::default()
                }),
                ..Workload::default()
            })),
        };
        (uid.into(), Arc::new(Resource::address(uid.into(), &a)))
    }

    #[test]
    fn the_replicas_reports_make_the_same_fleet() {
        use crate::kube::report::{NodeReport, RollbackSeen};
        let report = NodeReport {
            plugins: [("ns.p".to_owned(), "v2".to_owned())].into(),
            nacked: [("ns.q".to_owned(), ("v9".to_owned(), "bad".to_owned()))].into(),
            rollbacks: vec![RollbackSeen {
                plugin: "ns.p".into(),
                sha256: "ab".into(),
                reason: "4 of 4 calls failed".into(),
                at: String::new(),
            }],
            ..NodeReport::default()
        };
        let f = Fleet::of_reports(&[("node-a".to_owned(), report)].into());
        let v = &f.nodes["node-a"];
        assert_eq!(v.acked["ns.p"], "v2");
        assert_eq!(
            (
                v.nacked["ns.q"].version.as_str(),
                v.nacked["ns.q"].reason.as_str()
            ),
            ("v9", "bad")
        );
        assert_eq!(v.rollbacks[0].summary, "4 of 4 calls failed");
    }

    #[test]
    fn a_node_s_zone_is_that_of_the_workloads_it_runs() {
        let set: crate::ads::resources::TypeSet = [
            workload("w1", "node-a", "zone-1"),
            workload("w2", "node-b", "zone-2"),
            workload("w3", "node-c", ""),
            workload("w4", "", "zone-3"),
        ]
        .into_iter()
        .collect();
        let z = Fleet::zones(&set);
        assert_eq!(z.get("node-a").map(String::as_str), Some("zone-1"));
        assert_eq!(z.get("node-b").map(String::as_str), Some("zone-2"));
        assert_eq!(z.len(), 2, "{z:?}");
    }
}
