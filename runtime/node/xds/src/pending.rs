//! Responses of one type waiting for its handler, merged into one delta: the stream reader never waits for a
//! handler, memory stays bounded by the size of the resource set, and only the latest nonce is answered (the xDS
//! protocol lets a client skip answering a nonce it has superseded).

use std::collections::{BTreeMap, BTreeSet};

use weft_proto::envoy::service::discovery::v3::DeltaDiscoveryResponse;

use crate::handler::{Delta, Rejection, Upsert};

/// What is waiting for the handler.
#[derive(Debug, Default)]
pub(crate) struct Pending {
    upserts: BTreeMap<String, Upsert>,
    removals: BTreeSet<String>,
    /// Resources the client itself refused (no body), NACKed with the handler's rejections.
    refused: BTreeMap<String, Rejection>,
    system_version_info: String,
    /// The latest response's nonce and the connection it came on.
    pub(crate) nonce: String,
    pub(crate) connection: u64,
    pub(crate) responses: usize,
}

impl Pending {
    /// Merge a response in (removals first, then upserts, so an upsert and a removal of the same name in one
    /// response leaves the upsert).
    pub(crate) fn merge(&mut self, connection: u64, r: DeltaDiscoveryResponse) {
        for name in r.removed_resources {
            self.upserts.remove(&name);
            self.refused.remove(&name);
            self.removals.insert(name);
        }
        for res in r.resources {
            self.removals.remove(&res.name);
            match res.resource {
                Some(resource) => {
                    self.refused.remove(&res.name);
                    self.upserts.insert(
                        res.name.clone(),
                        Upsert {
                            name: res.name,
                            version: res.version,
                            resource,
                        },
                    );
                }
                None => {
                    self.upserts.remove(&res.name);
                    self.refused.insert(
                        res.name.clone(),
                        Rejection::new(&res.name, "the resource has no body"),
                    );
                }
            }
        }
        self.system_version_info = r.system_version_info;
        self.nonce = r.nonce;
        self.connection = connection;
        self.responses += 1;
    }

    /// The delta for the handler and the resources refused before it.
    pub(crate) fn into_delta(self, type_url: &str) -> (Delta, Vec<Rejection>) {
        (
            Delta {
                type_url: type_url.to_owned(),
                system_version_info: self.system_version_info,
                upserts: self.upserts.into_values().collect(),
                removals: self.removals.into_iter().collect(),
                responses: self.responses,
            },
            self.refused.into_values().collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use weft_proto::envoy::service::discovery::v3::Resource;

    fn res(name: &str, version: &str) -> Resource {
        Resource {
            name: name.into(),
            version: version.into(),
            resource: Some(prost_types::Any {
                type_url: "t".into(),
                value: version.as_bytes().to_vec(),
            }),
            ..Default::default()
        }
    }

    fn resp(nonce: &str, resources: Vec<Resource>, removed: &[&str]) -> DeltaDiscoveryResponse {
        DeltaDiscoveryResponse {
            nonce: nonce.into(),
            resources,
            removed_resources: removed.iter().map(|s| s.to_string()).collect(),
            type_url: "t".into(),
            ..Default::default()
        }
    }

    #[test]
    fn later_responses_win_and_removals_cancel_upserts() {
        let mut p = Pending::default();
        p.merge(1, resp("n1", vec![res("a", "1"), res("b", "1")], &["c"]));
        p.merge(1, resp("n2", vec![res("a", "2"), res("c", "1")], &["b"]));
        let mut no_body = res("d", "1");
        no_body.resource = None;
        p.merge(2, resp("n3", vec![no_body], &[]));
        assert_eq!((p.nonce.as_str(), p.connection, p.responses), ("n3", 2, 3));
        let (d, refused) = p.into_delta("t");
        let ups: Vec<(&str, &str)> = d
            .upserts
            .iter()
            .map(|u| (u.name.as_str(), u.version.as_str()))
            .collect();
        assert_eq!(ups, [("a", "2"), ("c", "1")]);
        assert_eq!(d.removals, ["b"]);
        assert_eq!(refused, [Rejection::new("d", "the resource has no body")]);
        assert_eq!(d.responses, 3);
    }
}
