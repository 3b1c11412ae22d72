//! One type URL on one stream: the subscription (wildcard and names), what the node has, and the responses it has
//! not answered; applying a request's subscription change and matching its ACK or NACK.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use weft_proto::envoy::service::discovery::v3::{DeltaDiscoveryRequest, Resource as WireResource};

use super::MAX_PENDING;

/// A resource's name and version as shared strings ([`super::ServedResource::ids`]).
pub(super) type Ids = (Arc<str>, Arc<str>);

/// What a response carried, kept until the node answers it.
#[derive(Debug, Clone)]
pub struct Sent {
    /// Upserts: name → version.
    pub resources: Vec<(String, String)>,
    /// Removals.
    pub removed: Vec<String>,
    /// When it was sent.
    pub at: tokio::time::Instant,
}

/// How a request answered a response.
#[derive(Debug, Clone)]
pub enum Answer {
    /// No `error_detail`, and the nonce names a response still pending: the node applied it.
    Ack {
        /// The response's nonce.
        nonce: String,
        /// What it carried.
        sent: Sent,
    },
    /// `error_detail` set: the node refused the response the nonce names (`sent`), or, when the nonce names no
    /// pending response, reports a refusal of its own (an unsolicited NACK, e.g. a rollback).
    Nack {
        /// The nonce it carried (may be empty).
        nonce: String,
        /// What the answered response carried, when it is still pending.
        sent: Option<Sent>,
        /// Why.
        error: weft_proto::google::rpc::Status,
    },
    /// `error_detail` with code 0 (OK) and no nonce: not an answer but a report the node sends on its own (e.g.
    /// weft's `ShadowReport`), in `details`. No pending response is touched.
    Report {
        /// What it carried.
        report: weft_proto::google::rpc::Status,
    },
    /// An ACK of a nonce that names no pending response (unknown, answered before, or forgotten beyond
    /// [`MAX_PENDING`]): nothing to record.
    Stale {
        /// The nonce it carried.
        nonce: String,
    },
}

/// A request's change to a subscription, to be answered with [`super::DeltaStream::respond`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SubscriptionChange {
    /// The first request of this type on the stream (answered even when there is nothing to send).
    pub initial: bool,
    /// Names subscribed by this request that were not subscribed before (reported as removed when not offered).
    pub newly_named: Vec<String>,
}

/// The Delta state of one type URL on one stream.
#[derive(Debug, Default)]
pub struct TypeSubscription {
    wildcard: bool,
    names: BTreeSet<String>,
    /// What the node has (or was sent): name → version, as the resources' shared strings (see
    /// [`super::ServedResource::ids`]): with thousands of streams, one copy of each name and version.
    sent: HashMap<Arc<str>, Arc<str>>,
    /// Responses not yet answered, by nonce.
    pending: BTreeMap<u64, Sent>,
}

impl TypeSubscription {
    /// Subscribed to everything.
    pub fn wildcard(&self) -> bool {
        self.wildcard
    }

    /// The names subscribed to (besides the wildcard), in order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.names.iter().map(String::as_str)
    }

    /// The version of `name` the node has (was sent, or said it had on connect).
    pub fn has(&self, name: &str) -> Option<&str> {
        self.sent.get(name).map(|v| &**v)
    }

    /// Responses sent and not yet answered (at most [`MAX_PENDING`]).
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Whether `name` is in the subscription.
    fn wants(&self, name: &str) -> bool {
        self.wildcard || self.names.contains(name)
    }

    /// Match an ACK or NACK to the pending response its nonce names (which is then no longer pending).
    pub(super) fn answer(&mut self, req: &DeltaDiscoveryRequest) -> Answer {
        let nonce = req.response_nonce.clone();
        if let Some(report) = &req.error_detail
            && report.code == 0
            && nonce.is_empty()
        {
            return Answer::Report {
                report: report.clone(),
            };
        }
        let sent = nonce
            .parse::<u64>()
            .ok()
            .and_then(|n| self.pending.remove(&n));
        match (&req.error_detail, sent) {
            (None, Some(sent)) => Answer::Ack { nonce, sent },
            (None, None) => Answer::Stale { nonce },
            (Some(error), sent) => Answer::Nack {
                nonce,
                sent,
                error: error.clone(),
            },
        }
    }

    /// Apply the request's subscribes and unsubscribes (`initial`: the first request of this type).
    pub(super) fn apply(
        &mut self,
        req: &DeltaDiscoveryRequest,
        initial: bool,
    ) -> Option<SubscriptionChange> {
        let mut newly_named = Vec::new();
        if initial {
            self.wildcard = req.resource_names_subscribe.is_empty()
                || req.resource_names_subscribe.iter().any(|n| n == "*");
            for n in req.resource_names_subscribe.iter().filter(|n| *n != "*") {
                self.names.insert(n.clone());
                newly_named.push(n.clone());
            }
            self.sent = req
                .initial_resource_versions
                .iter()
                .map(|(k, v)| (Arc::from(k.as_str()), Arc::from(v.as_str())))
                .collect();
        } else {
            for n in &req.resource_names_subscribe {
                if n == "*" {
                    self.wildcard = true;
                } else if self.names.insert(n.clone()) {
                    newly_named.push(n.clone());
                }
            }
            for n in &req.resource_names_unsubscribe {
                if n == "*" {
                    self.wildcard = false;
                } else {
                    self.names.remove(n);
                    self.sent.remove(n.as_str());
                }
            }
        }
        let changed = initial
            || !req.resource_names_subscribe.is_empty()
            || !req.resource_names_unsubscribe.is_empty();
        changed.then_some(SubscriptionChange {
            initial,
            newly_named,
        })
    }

    /// What differs between `offered` (within the subscription) and what the node has: the resources to send (with
    /// their shared name and version, for [`TypeSubscription::record`]) and the names to remove (sorted), including
    /// names just subscribed that are not offered.
    pub(super) fn diff<R: super::ServedResource>(
        &self,
        offered: &BTreeMap<String, super::Offered<R>>,
        change: Option<&SubscriptionChange>,
    ) -> (Vec<WireResource>, Vec<Ids>, Vec<String>) {
        let in_scope = |name: &str| offered.contains_key(name) && self.wants(name);
        let mut resources = Vec::new();
        let mut ids = Vec::new();
        // What the node has of the names in scope: when that is all it has, nothing is to be removed.
        let mut held_in_scope = 0;
        for (name, o) in offered {
            if !self.wants(name) {
                continue;
            }
            let has = self.sent.get(name.as_str());
            held_in_scope += usize::from(has.is_some());
            if let super::Offered::Serve(r) = o
                && has.map(|v| &**v) != Some(r.version())
            {
                resources.push(WireResource {
                    version: r.version().to_owned(),
                    resource: Some(r.body().clone()),
                    name: name.clone(),
                    ..Default::default()
                });
                ids.push(r.ids(name));
            }
        }
        let mut removed: Vec<String> = if held_in_scope == self.sent.len() {
            Vec::new()
        } else {
            self.sent
                .keys()
                .filter(|n| !in_scope(n))
                .map(|n| n.to_string())
                .collect()
        };
        for n in change.map_or(&[][..], |c| &c.newly_named) {
            if !in_scope(n) && !removed.contains(n) {
                removed.push(n.clone());
            }
        }
        removed.sort();
        (resources, ids, removed)
    }

    /// Note a response (nonce `nonce`) as sent: the node now has its resources and not its removals, and it is
    /// pending until answered (the oldest pending is forgotten beyond [`MAX_PENDING`]).
    pub(super) fn record(
        &mut self,
        nonce: u64,
        resources: &[WireResource],
        ids: Vec<Ids>,
        removed: Vec<String>,
    ) -> Sent {
        self.sent.extend(ids);
        for n in &removed {
            self.sent.remove(n.as_str());
        }
        let sent = Sent {
            resources: resources
                .iter()
                .map(|r| (r.name.clone(), r.version.clone()))
                .collect(),
            removed,
            at: tokio::time::Instant::now(),
        };
        self.pending.insert(nonce, sent.clone());
        while self.pending.len() > MAX_PENDING {
            self.pending.pop_first();
        }
        sent
    }
}
