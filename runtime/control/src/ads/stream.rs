//! One node's Delta ADS stream, the glue between weft-xds's protocol state ([`weft_xds::server::DeltaStream`]:
//! subscriptions, what the node has, ACK/NACK matching, the diffs) and what is weft control's own: the refusals,
//! the node's identity (its name for staged rollout, bound to the caller's token), the snapshot it serves from
//! (what each node should have, see [`Snapshot::desired`]), and the registry's records of every response, ACK,
//! NACK and rollback report. Every request and every new snapshot goes through the Delta state; only what it says
//! to send goes out.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use crate::auth::Caller;
use prost::Message as _;
use tokio::sync::{mpsc, watch};
use tonic::{Status, Streaming};
use weft_proto::envoy::service::discovery::v3::DeltaDiscoveryRequest;
use weft_proto::weft::plugin::v1::RollbackReport;
use weft_xds::server::{Answer, DeltaStream, Push, SubscriptionChange};

use crate::ads::metrics::ReasonLabel;
use crate::ads::publish::Publisher;
use crate::ads::registry::{NodeRecord, Registry};
use crate::ads::resources::{NodeKey, Snapshot};

/// The metadata key of the node name.
const NODE_NAME: &str = "NODE_NAME";

struct NodeStream {
    registry: Arc<Registry>,
    stream: u64,
    node: NodeKey,
    delta: DeltaStream,
    tx: mpsc::Sender<crate::ads::service::Outgoing>,
    /// Per type, the snapshot version the node's state was last diffed against: a new snapshot in which the type
    /// did not change since ([`Snapshot::changed_at`]) has nothing new for it.
    diffed: BTreeMap<String, u64>,
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
    tx: mpsc::Sender<crate::ads::service::Outgoing>,
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
            .send(Box::new(Err(refuse(
                "no_node",
                Status::invalid_argument("the first request must carry node"),
            ))))
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
            .send(Box::new(Err(refuse(
                "node_mismatch",
                Status::permission_denied(msg),
            ))))
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
        shadows: Default::default(),
        counts: Default::default(),
    });
    let span = tracing::info_span!("node", stream, node = %node.id);
    let mut s = NodeStream {
        registry: registry.clone(),
        stream,
        node: NodeKey {
            id: node.id.clone(),
            name,
        },
        delta: DeltaStream::new(),
        tx,
        diffed: BTreeMap::new(),
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
                    let types: Vec<String> = s
                        .delta
                        .type_urls()
                        .filter(|t| s.diffed.get(*t).is_none_or(|v| snap.changed_at(t) > *v))
                        .map(str::to_owned)
                        .collect();
                    for t in types {
                        s.push(&t, &snap, None).await?;
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
        let type_url = req.type_url.as_str();
        if !Snapshot::serves(type_url) {
            tracing::warn!(r#type = %type_url, "request for a type weft control does not serve; ignored");
            return Ok(());
        }
        let received = self.delta.receive(&req);
        match &received.answer {
            None => {}
            Some(Answer::Ack { nonce, sent }) => {
                self.registry
                    .ack(self.stream, &self.node.id, type_url, nonce, sent);
            }
            Some(Answer::Stale { nonce }) => {
                tracing::debug!(%nonce, "ACK of an unknown or forgotten response");
            }
            Some(Answer::Report { report }) => {
                self.registry.report(self.stream, type_url, report);
            }
            Some(Answer::Nack { nonce, sent, error }) => {
                let rollbacks = rollback_reports(error);
                self.registry.nack(
                    self.stream,
                    &self.node.id,
                    type_url,
                    nonce,
                    sent.as_ref(),
                    error,
                    &rollbacks,
                );
            }
        }
        if let Some(change) = &received.change {
            if change.initial && !req.initial_resource_versions.is_empty() {
                // What a reconnecting node already holds (applied, not refused): it runs these versions, though
                // this stream never sent them.
                self.registry
                    .holds(self.stream, type_url, &req.initial_resource_versions);
            }
            if let Some(sub) = self.delta.subscription(type_url) {
                self.registry.subscribed(
                    self.stream,
                    type_url,
                    sub.wildcard(),
                    sub.names().map(str::to_owned).collect(),
                );
            }
            self.push(type_url, snap, Some(change)).await?;
        }
        Ok(())
    }

    /// Send what differs between `snap` and what the node has, for one type (`change`: the subscription change
    /// being answered).
    async fn push(
        &mut self,
        type_url: &str,
        snap: &Snapshot,
        change: Option<&SubscriptionChange>,
    ) -> Result<(), End> {
        let desired = snap.desired(type_url, &self.node);
        match self.diffed.get_mut(type_url) {
            Some(v) => *v = snap.version,
            None => {
                self.diffed.insert(type_url.to_owned(), snap.version);
            }
        }
        let Some(Push { response, sent }) =
            self.delta
                .respond(type_url, &desired, change, &snap.version.to_string())
        else {
            return Ok(());
        };
        self.registry.sent(self.stream, type_url, &sent);
        tracing::debug!(
            r#type = type_url,
            nonce = %response.nonce,
            resources = sent.resources.len(),
            removed = sent.removed.len(),
            "push"
        );
        self.tx
            .send(Box::new(Ok(response)))
            .await
            .map_err(|_| End::Closed("the node went away".into()))
    }
}
