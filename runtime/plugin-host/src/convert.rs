//! Conversions from the data path's and the state's types into the WIT types plugins see.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use ipnet::IpNet;
use weft_hooks::{CloseRecord, ConnectionRecord, Direction, Verdict, WorkloadMeta};
use weft_state as state;

use crate::bindings::types as wit;

pub(crate) fn ip(ip: IpAddr) -> wit::IpAddress {
    match ip {
        IpAddr::V4(v4) => wit::IpAddress::Ipv4(u32::from(v4)),
        IpAddr::V6(v6) => {
            let bits = u128::from(v6);
            wit::IpAddress::Ipv6(((bits >> 64) as u64, bits as u64))
        }
    }
}

fn socket(sa: SocketAddr) -> wit::SocketAddress {
    wit::SocketAddress {
        address: ip(sa.ip()),
        port: sa.port(),
    }
}

/// The scalar part of a connection (workloads travel separately).
pub(crate) fn connection(c: &ConnectionRecord) -> wit::Connection {
    wit::Connection {
        id: c.id,
        direction: match c.direction {
            Direction::Inbound => wit::Direction::Inbound,
            Direction::Outbound => wit::Direction::Outbound,
        },
        source: socket(c.src),
        destination: socket(c.dst),
        peer_identity: c.peer_identity.as_deref().map(str::to_owned),
        destination_service: c.dst_service.clone(),
        hbone: c.hbone,
    }
}

pub(crate) fn workload_meta(w: &WorkloadMeta) -> wit::WorkloadMeta {
    wit::WorkloadMeta {
        uid: w.uid.clone(),
        name: w.name.clone(),
        namespace: w.namespace.clone(),
        service_account: w.service_account.clone(),
        trust_domain: w.trust_domain.clone(),
        node: w.node.clone(),
        workload_name: w.workload_name.clone(),
        canonical_name: w.canonical_name.clone(),
        canonical_revision: w.canonical_revision.clone(),
        cluster_id: w.cluster_id.clone(),
        region: w.region.clone(),
        zone: w.zone.clone(),
        labels: w.labels.clone(),
        authorization_policies: w.authorization_policies.clone(),
    }
}

/// A batch of telemetry events in their WIT form, with the records they came from. Each workload's metadata is
/// converted (and later lowered into every plugin) once per batch, however many of the batch's events name it;
/// events refer to it by its index in `workloads`. Workloads are told apart by their `Arc`: the batch holds every
/// record it converted, so no address is freed and reused while the index is alive.
///
/// In merging mode (every serving plugin takes `telemetry-batches`), a connection whose open and close both fall
/// in the batch becomes one `opened-closed` event at the place of its close; its open's slot is dropped by
/// [`EventBatch::seal`]. Otherwise every open and close is its own event, in order.
pub(crate) struct EventBatch {
    /// The record of each event (for plugins with a workload selector), in step with `events`.
    pub records: Vec<Arc<ConnectionRecord>>,
    pub workloads: Vec<wit::WorkloadMeta>,
    pub events: Vec<wit::BatchEvent>,
    index: HashMap<*const WorkloadMeta, u32>,
    merge: bool,
    /// Opens of this batch not closed yet (merging mode): connection id → slot.
    open: HashMap<u64, usize>,
    /// Slots of opens merged into a later `opened-closed`, dropped by [`EventBatch::seal`].
    merged: Vec<usize>,
}

impl EventBatch {
    pub fn with_capacity(n: usize) -> Self {
        Self {
            records: Vec::with_capacity(n),
            workloads: Vec::new(),
            events: Vec::with_capacity(n),
            index: HashMap::new(),
            merge: false,
            open: HashMap::new(),
            merged: Vec::new(),
        }
    }

    /// Whether the next events merge opens and closes (set on an empty batch).
    pub fn set_merging(&mut self, merge: bool) {
        debug_assert!(self.events.is_empty());
        self.merge = merge;
    }

    pub fn opened(&mut self, c: Arc<ConnectionRecord>) {
        let conn = self.connection(&c);
        if self.merge {
            self.open.insert(c.id, self.events.len());
        }
        self.events.push(wit::BatchEvent::Opened(conn));
        self.records.push(c);
    }

    pub fn closed(&mut self, c: Arc<ConnectionRecord>, close: &CloseRecord) {
        let info = close_info(close);
        let event = match self.open.remove(&c.id) {
            Some(at) => {
                self.merged.push(at);
                // The open's converted connection moves over; its slot keeps a placeholder until `seal`.
                match std::mem::replace(&mut self.events[at], placeholder()) {
                    wit::BatchEvent::Opened(conn) => wit::BatchEvent::OpenedClosed((conn, info)),
                    other => {
                        // Never: `open` only names slots holding an open. Put it back and report the close alone.
                        self.events[at] = other;
                        self.merged.pop();
                        wit::BatchEvent::Closed((self.connection(&c), info))
                    }
                }
            }
            None => wit::BatchEvent::Closed((self.connection(&c), info)),
        };
        self.events.push(event);
        self.records.push(c);
    }

    /// Drops the slots of merged opens; call before delivering.
    pub fn seal(&mut self) {
        if self.merged.is_empty() {
            return;
        }
        let mut dead = vec![false; self.events.len()];
        for &at in &self.merged {
            dead[at] = true;
        }
        let mut i = 0;
        self.events.retain(|_| {
            i += 1;
            !dead[i - 1]
        });
        let mut i = 0;
        self.records.retain(|_| {
            i += 1;
            !dead[i - 1]
        });
        self.merged.clear();
    }

    /// Events taken into the batch so far (a merged open counts until `seal`: the batch bound counts what the
    /// worker took).
    pub fn len(&self) -> usize {
        self.events.len()
    }

    pub fn clear(&mut self) {
        self.index.clear();
        self.events.clear();
        self.workloads.clear();
        self.records.clear();
        self.open.clear();
        self.merged.clear();
    }

    fn connection(&mut self, c: &ConnectionRecord) -> wit::EventConnection {
        wit::EventConnection {
            conn: connection(c),
            source_workload: c.src_workload.as_ref().map(|w| self.workload(w)),
            destination_workload: c.dst_workload.as_ref().map(|w| self.workload(w)),
        }
    }

    fn workload(&mut self, w: &Arc<WorkloadMeta>) -> u32 {
        let next = u32::try_from(self.workloads.len()).unwrap_or(u32::MAX);
        *self.index.entry(Arc::as_ptr(w)).or_insert_with(|| {
            self.workloads.push(workload_meta(w));
            next
        })
    }
}

/// A connection as a telemetry event names it, with no batch to index its workloads in (tests).
#[cfg(test)]
pub(crate) fn connection_event(c: &ConnectionRecord) -> wit::EventConnection {
    wit::EventConnection {
        conn: connection(c),
        source_workload: None,
        destination_workload: None,
    }
}

/// What a merged open's slot holds until [`EventBatch::seal`] drops it (nothing allocated).
fn placeholder() -> wit::BatchEvent {
    let nowhere = wit::SocketAddress {
        address: wit::IpAddress::Ipv4(0),
        port: 0,
    };
    wit::BatchEvent::Opened(wit::EventConnection {
        conn: wit::Connection {
            id: 0,
            direction: wit::Direction::Inbound,
            source: nowhere,
            destination: nowhere,
            peer_identity: None,
            destination_service: None,
            hbone: false,
        },
        source_workload: None,
        destination_workload: None,
    })
}

/// A batch as `telemetry.on-events` takes it (plugins without `telemetry-batches`): an `opened-closed` becomes its
/// open and its close.
pub(crate) fn plain_events(events: &[wit::BatchEvent]) -> Vec<wit::Event> {
    let mut out = Vec::with_capacity(events.len());
    for e in events {
        match e {
            wit::BatchEvent::Opened(c) => out.push(wit::Event::Opened(c.clone())),
            wit::BatchEvent::Closed(x) => out.push(wit::Event::Closed(x.clone())),
            wit::BatchEvent::OpenedClosed((c, close)) => {
                out.push(wit::Event::Opened(c.clone()));
                out.push(wit::Event::Closed((c.clone(), close.clone())));
            }
        }
    }
    out
}

pub(crate) fn close_info(close: &CloseRecord) -> wit::CloseInfo {
    wit::CloseInfo {
        bytes_sent: close.bytes_sent,
        bytes_received: close.bytes_received,
        duration_ns: close.duration.as_nanos().min(u128::from(u64::MAX)) as u64,
        verdict: match &close.verdict {
            Verdict::Allow => wit::Verdict::Allow,
            Verdict::Deny { by, reason } => wit::Verdict::Deny((by.clone(), reason.clone())),
        },
        error: close.error.clone(),
        response_flags: close.response_flags.to_string(),
    }
}

fn string_match(m: &state::StringMatch) -> wit::StringMatch {
    match m {
        state::StringMatch::Exact(s) => wit::StringMatch::Exact(s.clone()),
        state::StringMatch::Prefix(s) => wit::StringMatch::Prefix(s.clone()),
        state::StringMatch::Suffix(s) => wit::StringMatch::Suffix(s.clone()),
        state::StringMatch::Presence => wit::StringMatch::Presence,
    }
}

fn sa_match(m: &state::ServiceAccountMatch) -> wit::ServiceAccountMatch {
    wit::ServiceAccountMatch {
        namespace: m.namespace.clone(),
        service_account: m.service_account.clone(),
    }
}

fn cidr(n: &IpNet) -> wit::Cidr {
    wit::Cidr {
        address: ip(n.addr()),
        prefix_len: n.prefix_len(),
    }
}

fn policy_match(m: &state::PolicyMatch) -> wit::PolicyMatch {
    let sm = |v: &[state::StringMatch]| v.iter().map(string_match).collect();
    let sa = |v: &[state::ServiceAccountMatch]| v.iter().map(sa_match).collect();
    let ips = |v: &[IpNet]| v.iter().map(cidr).collect();
    wit::PolicyMatch {
        namespaces: sm(&m.namespaces),
        not_namespaces: sm(&m.not_namespaces),
        principals: sm(&m.principals),
        not_principals: sm(&m.not_principals),
        service_accounts: sa(&m.service_accounts),
        not_service_accounts: sa(&m.not_service_accounts),
        source_ips: ips(&m.source_ips),
        not_source_ips: ips(&m.not_source_ips),
        destination_ips: ips(&m.destination_ips),
        not_destination_ips: ips(&m.not_destination_ips),
        destination_ports: m.destination_ports.clone(),
        not_destination_ports: m.not_destination_ports.clone(),
    }
}

/// An authorization policy in its WIT form (converted once per state change, never per decision).
pub(crate) fn policy(p: &state::Policy) -> wit::AuthorizationPolicy {
    wit::AuthorizationPolicy {
        name: p.name.clone(),
        namespace: p.namespace.clone(),
        scope: match p.scope {
            state::PolicyScope::Global => wit::PolicyScope::Global,
            state::PolicyScope::Namespace => wit::PolicyScope::Namespace,
            state::PolicyScope::WorkloadSelector => wit::PolicyScope::WorkloadSelector,
        },
        action: match p.action {
            state::PolicyAction::Allow => wit::PolicyAction::Allow,
            state::PolicyAction::Deny => wit::PolicyAction::Deny,
        },
        dry_run: p.dry_run,
        rules: p
            .rules
            .iter()
            .map(|rule| wit::PolicyRule {
                clauses: rule
                    .iter()
                    .map(|clause| wit::PolicyClause {
                        matches: clause.iter().map(policy_match).collect(),
                    })
                    .collect(),
            })
            .collect(),
    }
}
