//! One node's Delta ADS stream: subscriptions per type (wildcard or by name), what was sent to the node (name →
//! version, seeded from `initial_resource_versions` so a reconnecting node gets only what differs), and the
//! responses not yet answered (matched to ACKs and NACKs by nonce). On every new snapshot only changed and removed
//! resources go out; a type with nothing to say sends nothing.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::Arc;

use prost::Message as _;
use tokio::sync::{mpsc, watch};
use tonic::{Status, Streaming};
use weft_grpc_server::Caller;
use weft_proto::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, Resource as WireResource,
};
use weft_proto::weft::plugin::v1::RollbackReport;

use crate::metrics::ReasonLabel;
use crate::publish::Publisher;
use crate::registry::{NodeRecord, Registry, Sent};
use crate::resources::{Desired, NodeKey, Snapshot};

/// Responses a node has not answered that a stream remembers (older ones are forgotten: their ACK then only
/// counts as stale).
const MAX_PENDING: usize = 64;

/// The metadata key of the node name.
const NODE_NAME: &str = "NODE_NAME";

#[derive(Debug, Default)]
struct TypeState {
    wildcard: bool,
    names: BTreeSet<String>,
    /// What the node has (or was sent): name → version.
    sent: HashMap<String, String>,
    pending: BTreeMap<u64, Sent>,
}

struct NodeStream {
    registry: Arc<Registry>,
    stream: u64,
    node: NodeKey,
    types: BTreeMap<String, TypeState>,
    nonce: u64,
    tx: mpsc::Sender<Result<DeltaDiscoveryResponse, Status>>,
}

/// Why a stream ended.
enum End {
    Closed(String),
}

fn metadata_string(node: &weft_proto::envoy::config::core::v3::Node, key: &str) -> Option<String> {
    weft_proto::struct_string(node.metadata.as_ref(), key)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
}

fn rollback_reports(status: &weft_proto::google::rpc::Status) -> Vec<RollbackReport> {
    status
        .details
        .iter()
        .filter(|d| d.type_url == weft_proto::type_url::ROLLBACK_REPORT)
        .filter_map(|d| match RollbackReport::decode(d.value.as_slice()) {
            Ok(r) => Some(r),
            Err(e) => {
                tracing::warn!(error = %e, "undecodable RollbackReport in a NACK");
                None
            }
        })
        .collect()
}

/// Serve one stream until the node closes it or it fails.
pub async fn run(
    publisher: Arc<Publisher>,
    registry: Arc<Registry>,
    caller: Caller,
    peer: Option<SocketAddr>,
    mut inbound: Streaming<DeltaDiscoveryRequest>,
    tx: mpsc::Sender<Result<DeltaDiscoveryResponse, Status>>,
) {
    let refuse = |reason: &str, status: Status| {
        registry
            .metrics()
            .refused
            .get_or_create(&ReasonLabel {
                reason: reason.to_owned(),
            })
            .inc();
        tracing::warn!(reason, message = status.message(), "stream refused");
        status
    };
    let first = match inbound.message().await {
        Ok(Some(r)) => r,
        Ok(None) => return,
        Err(e) => return tracing::debug!(error = %e, "stream failed before its first request"),
    };
    let Some(node) = first.node.clone() else {
        let _ = tx
            .send(Err(refuse(
                "no_node",
                Status::invalid_argument("the first request must carry node"),
            )))
            .await;
        return;
    };
    let name = metadata_string(&node, NODE_NAME).unwrap_or_else(|| node.id.clone());
    if let (Some(bound), Some(claimed)) = (&caller.node, metadata_string(&node, NODE_NAME))
        && *bound != claimed
    {
        let msg = format!(
            "the caller's token is bound to node {bound:?}, but the stream claims node {claimed:?}"
        );
        let _ = tx
            .send(Err(refuse("node_mismatch", Status::permission_denied(msg))))
            .await;
        return;
    }
    let stream = registry.connect(NodeRecord {
        stream: 0,
        id: node.id.clone(),
        name: name.clone(),
        cluster: node.cluster.clone(),
        peer,
        caller: caller.identity.to_string(),
        caller_node: caller.node.clone(),
        connected_at: humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string(),
        types: BTreeMap::new(),
        rollbacks: Default::default(),
    });
    let span = tracing::info_span!("node", stream, node = %node.id);
    let mut s = NodeStream {
        registry: registry.clone(),
        stream,
        node: NodeKey {
            id: node.id.clone(),
            name,
        },
        types: BTreeMap::new(),
        nonce: 0,
        tx,
    };
    let mut snapshots: watch::Receiver<Arc<Snapshot>> = publisher.subscribe();
    let end = async {
        let snap = snapshots.borrow_and_update().clone();
        s.handle(first, &snap).await?;
        loop {
            tokio::select! {
                msg = inbound.message() => match msg {
                    Ok(Some(req)) => {
                        let snap = snapshots.borrow().clone();
                        s.handle(req, &snap).await?;
                    }
                    Ok(None) => return Err(End::Closed("closed by the node".into())),
                    Err(e) => return Err(End::Closed(format!("stream error: {e}"))),
                },
                r = snapshots.changed() => {
                    if r.is_err() {
                        return Err(End::Closed("server stopping".into()));
                    }
                    let snap = snapshots.borrow_and_update().clone();
                    let types: Vec<String> = s.types.keys().cloned().collect();
                    for t in types {
                        s.push(&t, &snap, false, &[]).await?;
                    }
                }
            }
        }
    };
    let why = match tracing::Instrument::instrument(end, span.clone()).await {
        Ok(()) => "done".to_owned(),
        Err(End::Closed(why)) => why,
    };
    registry.disconnect(stream, &why);
}

impl NodeStream {
    async fn handle(&mut self, req: DeltaDiscoveryRequest, snap: &Snapshot) -> Result<(), End> {
        let type_url = req.type_url.clone();
        if !Snapshot::serves(&type_url) {
            tracing::warn!(r#type = %type_url, "request for a type weft control does not serve; ignored");
            return Ok(());
        }
        let node_id = self.node.id.clone();
        let is_new = !self.types.contains_key(&type_url);
        let ts = self.types.entry(type_url.clone()).or_default();
        // ACK or NACK.
        if !req.response_nonce.is_empty() || req.error_detail.is_some() {
            let sent = req
                .response_nonce
                .parse::<u64>()
                .ok()
                .and_then(|n| ts.pending.remove(&n));
            match (&req.error_detail, &sent) {
                (None, Some(sent)) => {
                    self.registry
                        .ack(self.stream, &node_id, &type_url, &req.response_nonce, sent);
                }
                (None, None) => {
                    tracing::debug!(nonce = %req.response_nonce, "ACK of an unknown or forgotten response");
                }
                (Some(status), sent) => {
                    let rollbacks = rollback_reports(status);
                    self.registry.nack(
                        self.stream,
                        &node_id,
                        &type_url,
                        &req.response_nonce,
                        sent.as_ref(),
                        status,
                        &rollbacks,
                    );
                }
            }
        }
        // Subscriptions.
        let mut newly_named = Vec::new();
        if is_new {
            ts.wildcard = req.resource_names_subscribe.is_empty()
                || req.resource_names_subscribe.iter().any(|n| n == "*");
            for n in req.resource_names_subscribe.iter().filter(|n| *n != "*") {
                ts.names.insert(n.clone());
                newly_named.push(n.clone());
            }
            ts.sent = req.initial_resource_versions.clone().into_iter().collect();
        } else {
            for n in &req.resource_names_subscribe {
                if n == "*" {
                    ts.wildcard = true;
                } else if ts.names.insert(n.clone()) {
                    newly_named.push(n.clone());
                }
            }
            for n in &req.resource_names_unsubscribe {
                if n == "*" {
                    ts.wildcard = false;
                } else {
                    ts.names.remove(n);
                    ts.sent.remove(n);
                }
            }
        }
        let changed_subs = is_new
            || !req.resource_names_subscribe.is_empty()
            || !req.resource_names_unsubscribe.is_empty();
        if changed_subs {
            self.registry.subscribed(
                self.stream,
                &type_url,
                ts.wildcard,
                ts.names.iter().cloned().collect(),
            );
            self.push(&type_url, snap, is_new, &newly_named).await?;
        }
        Ok(())
    }

    /// Send what differs between `snap` and what the node has, for one type. `force`: send even when nothing
    /// differs (the answer to a new subscription). `newly_named`: names just subscribed to, reported as removed
    /// when they do not exist.
    async fn push(
        &mut self,
        type_url: &str,
        snap: &Snapshot,
        force: bool,
        newly_named: &[String],
    ) -> Result<(), End> {
        let Some(ts) = self.types.get_mut(type_url) else {
            return Ok(());
        };
        let mut desired = snap.desired(type_url, &self.node);
        if !ts.wildcard {
            desired.retain(|name, _| ts.names.contains(name));
        }
        let mut resources = Vec::new();
        for (name, d) in &desired {
            if let Desired::Serve(r) = d
                && ts.sent.get(name) != Some(&r.version)
            {
                resources.push(r.clone());
            }
        }
        let mut removed: Vec<String> = ts
            .sent
            .keys()
            .filter(|n| !desired.contains_key(*n))
            .cloned()
            .collect();
        for n in newly_named {
            if !desired.contains_key(n) && !removed.contains(n) {
                removed.push(n.clone());
            }
        }
        removed.sort();
        if resources.is_empty() && removed.is_empty() && !force {
            return Ok(());
        }
        self.nonce += 1;
        let nonce = self.nonce;
        for r in &resources {
            ts.sent.insert(r.name.clone(), r.version.clone());
        }
        for n in &removed {
            ts.sent.remove(n);
        }
        let sent = Sent {
            resources: resources
                .iter()
                .map(|r| (r.name.clone(), r.version.clone()))
                .collect(),
            removed: removed.clone(),
            at: tokio::time::Instant::now(),
        };
        self.registry.sent(self.stream, type_url, &sent);
        ts.pending.insert(nonce, sent);
        while ts.pending.len() > MAX_PENDING {
            ts.pending.pop_first();
        }
        tracing::debug!(
            r#type = type_url,
            nonce,
            resources = resources.len(),
            removed = removed.len(),
            "push"
        );
        let response = DeltaDiscoveryResponse {
            system_version_info: snap.version.to_string(),
            resources: resources
                .iter()
                .map(|r| WireResource {
                    version: r.version.clone(),
                    resource: Some(r.body.clone()),
                    name: r.name.clone(),
                    ..Default::default()
                })
                .collect(),
            type_url: type_url.to_owned(),
            nonce: nonce.to_string(),
            removed_resources: removed,
        };
        self.tx
            .send(Ok(response))
            .await
            .map_err(|_| End::Closed("the node went away".into()))
    }
}
