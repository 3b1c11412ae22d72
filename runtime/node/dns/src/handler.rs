//! One request, start to end: decode, identify the client (only mesh workloads get answers), answer a mesh name
//! authoritatively (A/AAAA, TTL 30, a CNAME when a search domain was stripped), or forward.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use hickory_proto::op::{Message, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA, CNAME};
use hickory_proto::rr::{DNSClass, Name, RData, Record, RecordType};
use weft_state::{LocalPod, MeshState, StateStore, TunnelProtocol, Workload};

use crate::forward::Forwarder;
use crate::lookup::{self, Family};
use crate::message::{self, Inbound, Request};
use crate::metrics::DnsMetrics;
use crate::names;

/// TTL of mesh answers (ztunnel's).
pub const MESH_TTL: u32 = 30;

/// Who may ask, and who they are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Clients {
    /// Node mode: the query's source address must be an HBONE (captured) workload on this node.
    Node {
        /// This node's name.
        node: String,
    },
    /// In-pod mode: the listener lives in one pod's network namespace, so every query is that pod's; it is
    /// answered while the pod is in the mesh state (matched as the pod's data path matches it).
    Pod {
        /// This node's name.
        node: String,
        /// The pod, as the CNI node agent named it.
        pod: LocalPod,
    },
}

impl Clients {
    /// The workload asking from `src`, if it may ask.
    pub fn client(&self, state: &MeshState, src: IpAddr) -> Option<Arc<Workload>> {
        match self {
            Clients::Node { node } => state
                .workload_by_ip(src.to_canonical())
                .filter(|w| w.node == *node && w.protocol == TunnelProtocol::Hbone)
                .cloned(),
            Clients::Pod { node, pod } => state.local_pod(node, pod, Some(src)).cloned(),
        }
    }
}

/// What serving a request needs.
#[derive(Debug)]
pub(crate) struct Handler {
    pub state: Arc<StateStore>,
    pub forwarder: Arc<Forwarder>,
    pub cluster_domain: String,
    pub metrics: Arc<DnsMetrics>,
}

/// The transport a request came over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Transport {
    Udp,
    Tcp,
}

impl Transport {
    fn as_str(self) -> &'static str {
        match self {
            Transport::Udp => "udp",
            Transport::Tcp => "tcp",
        }
    }
}

impl Handler {
    /// The response to `bytes` from `src`, if any.
    pub(crate) async fn handle(
        &self,
        bytes: &[u8],
        src: SocketAddr,
        clients: &Clients,
        transport: Transport,
    ) -> Option<Vec<u8>> {
        let t = transport.as_str();
        let req = match message::decode(bytes) {
            Inbound::Drop(why) => {
                self.metrics.count(t, "dropped");
                tracing::debug!(target: "dns", %src, why, "DNS message dropped");
                return None;
            }
            Inbound::Reject(reply, why) => {
                let result = if why == "not a QUERY" {
                    "notimp"
                } else {
                    "formerr"
                };
                self.metrics.count(t, result);
                tracing::debug!(target: "dns", %src, why, "DNS message rejected");
                return Some(reply);
            }
            Inbound::Query(r) => r,
        };
        let limit = match transport {
            Transport::Udp => req.udp_limit(),
            Transport::Tcp => u16::MAX,
        };
        let state = self.state.current();
        let client = clients.client(&state, src.ip());
        self.metrics.count_istio(
            req.query.query_type(),
            t,
            client
                .as_deref()
                .map(|w| (w.canonical_name.as_str(), w.canonical_revision.as_str())),
        );
        let Some(client) = client else {
            self.metrics.count(t, "refused");
            tracing::debug!(target: "dns", %src, query = %req.query.query_type(), domain = %req.query.name(),
                "DNS query refused: the source is not a mesh workload served here");
            let r = message::error(&req.msg, ResponseCode::Refused);
            return Some(message::encode(&r, limit));
        };
        let (reply, result) = self.answer(&state, &client, &req).await;
        self.metrics.count(t, result);
        tracing::debug!(target: "dns", %src, src.workload = %client.name, src.namespace = %client.namespace,
            query = %req.query.query_type(), domain = %req.query.name(), result, "DNS request");
        Some(message::encode(&reply, limit))
    }

    async fn answer(
        &self,
        state: &MeshState,
        client: &Workload,
        req: &Request,
    ) -> (Message, &'static str) {
        let q = &req.query;
        let family = match q.query_type() {
            RecordType::A => Some(Family::V4),
            RecordType::AAAA => Some(Family::V6),
            _ => None,
        };
        let found = family
            .filter(|_| q.query_class() == DNSClass::IN)
            .zip(names::labels_of(q.name()))
            .and_then(|(f, labels)| {
                lookup::find(state, client, &labels, &self.cluster_domain).map(|found| (f, found))
            });
        let Some((family, found)) = found else {
            return self.forward(req).await;
        };
        // From here on weft is the authority: the name exists in the mesh.
        let empty = |req: &Request| {
            message::with_records(
                &req.msg,
                ResponseCode::NoError,
                true,
                vec![],
                vec![],
                vec![],
            )
        };
        if !lookup::family_allowed(&found.service, family) {
            return (empty(req), "no_records");
        }
        let addrs = lookup::addresses(state, client, &found.service, family);
        if addrs.is_empty() {
            return (empty(req), "no_records");
        }
        let mut answers = Vec::with_capacity(addrs.len() + 1);
        let mut ip_name = q.name().clone();
        if let Some(kept) = found.alias.stripped.filter(|_| !found.wildcard) {
            // Found by stripping a search domain: the query is an alias of the shorter name.
            if let Ok(mut short) = Name::from_labels(q.name().iter().take(kept)) {
                short.set_fqdn(true);
                answers.push(Record::from_rdata(
                    q.name().clone(),
                    MESH_TTL,
                    RData::CNAME(CNAME(short.clone())),
                ));
                ip_name = short;
            }
        }
        for ip in addrs {
            let data = match ip {
                IpAddr::V4(a) => RData::A(A(a)),
                IpAddr::V6(a) => RData::AAAA(AAAA(a)),
            };
            answers.push(Record::from_rdata(ip_name.clone(), MESH_TTL, data));
        }
        let reply = message::with_records(
            &req.msg,
            ResponseCode::NoError,
            true,
            answers,
            vec![],
            vec![],
        );
        (reply, "answered")
    }

    async fn forward(&self, req: &Request) -> (Message, &'static str) {
        match self.forwarder.resolve(&req.query).await {
            Ok((a, _cached)) => {
                let reply = message::with_records(
                    &req.msg,
                    a.code,
                    false,
                    a.answers,
                    a.authorities,
                    a.additionals,
                );
                (reply, "forwarded")
            }
            Err(e) => {
                tracing::debug!(target: "dns", domain = %req.query.name(), error = %e, "forwarding failed");
                (
                    message::error(&req.msg, ResponseCode::ServFail),
                    "forward_failed",
                )
            }
        }
    }
}
