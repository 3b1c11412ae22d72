//! The Delta ADS client of one source: one stream at a time to the server, wildcard subscriptions to its types,
//! a task per type that runs the type's handler and answers (ACK/NACK) once it returns, and reconnection with
//! backoff that tells the server, in `initial_resource_versions`, what the node already holds.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

use prost_types::Any;
use tokio::sync::{Notify, mpsc, watch};
use tracing::{Instrument, debug, info, info_span, warn};
use weft_proto::envoy::config::core::v3::Node;
use weft_proto::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use weft_proto::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DeltaDiscoveryResponse};
use weft_proto::google::rpc::Status;

use crate::backoff::Backoff;
use crate::config::{MAX_MESSAGE_SIZE, SourceConfig};
use crate::connect;
use crate::error::{Error, status_message};
use crate::handler::{Handler, NACK_CODE, Rejection, nack_message};
use crate::pending::Pending;
use crate::status::{AckRecord, Disconnect, NackRecord, SourceStatus, Tracker, rfc3339};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A source's client before it starts: its server and the types it subscribes to.
pub struct AdsClient {
    cfg: SourceConfig,
    types: Vec<(String, Arc<dyn Handler>)>,
}

impl std::fmt::Debug for AdsClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdsClient")
            .field("source", &self.cfg.name)
            .field("address", &self.cfg.address)
            .field(
                "types",
                &self.types.iter().map(|(t, _)| t).collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl AdsClient {
    /// A client for one source.
    pub fn new(cfg: SourceConfig) -> Self {
        Self {
            cfg,
            types: Vec::new(),
        }
    }

    /// Subscribe to every resource of `type_url` (a wildcard subscription), handled by `handler`. Types are
    /// requested in the order they are added.
    pub fn subscribe(mut self, type_url: impl Into<String>, handler: Arc<dyn Handler>) -> Self {
        let type_url = type_url.into();
        self.types.retain(|(t, _)| *t != type_url);
        self.types.push((type_url, handler));
        self
    }

    /// Check the settings and start the stream task and the type tasks on the current tokio runtime. The client
    /// runs until [`XdsHandle::stop`].
    pub fn start(self) -> Result<XdsHandle, Error> {
        self.cfg.uri()?;
        if self.types.is_empty() {
            return Err(Error::Config(format!(
                "xDS source {} subscribes to no type",
                self.cfg.name
            )));
        }
        let node = self.cfg.node.to_proto();
        let order: Vec<String> = self.types.iter().map(|(t, _)| t.clone()).collect();
        let tracker = Tracker::new(&self.cfg.name, &self.cfg.address, node.id.clone(), &order);
        let slots = self
            .types
            .into_iter()
            .map(|(t, handler)| {
                (
                    t,
                    Arc::new(TypeSlot {
                        handler,
                        pending: Mutex::new(None),
                        notify: Notify::new(),
                        versions: Mutex::new(BTreeMap::new()),
                        last_nonce: Mutex::new((0, String::new())),
                    }),
                )
            })
            .collect();
        let shared = Arc::new(Shared {
            cfg: self.cfg,
            node,
            order,
            slots,
            tracker: Mutex::new(tracker),
            changes: watch::channel(0).0,
            stream: Mutex::new(None),
            stop: watch::channel(false).0,
        });
        for (type_url, slot) in &shared.slots {
            let span =
                info_span!("xds_type", source = %shared.cfg.name, type_url = %short(type_url));
            tokio::spawn(worker(shared.clone(), type_url.clone(), slot.clone()).instrument(span));
        }
        tokio::spawn(run(shared.clone()));
        Ok(XdsHandle { shared })
    }
}

/// A running source: its status, the unsolicited NACK, and stop.
#[derive(Clone)]
pub struct XdsHandle {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for XdsHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XdsHandle")
            .field("source", &self.shared.cfg.name)
            .finish_non_exhaustive()
    }
}

/// What became of an unsolicited NACK.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NackSent {
    /// Sent on the open stream.
    Sent,
    /// No open stream has delivered this type yet. The resource's version is forgotten all the same, so the
    /// server sends it again after the reconnect and the handler can refuse it then.
    NotSent,
}

impl XdsHandle {
    /// The source's name.
    pub fn name(&self) -> &str {
        &self.shared.cfg.name
    }

    /// A snapshot of the source's status.
    pub fn status(&self) -> SourceStatus {
        self.shared.status()
    }

    /// A receiver that changes whenever the status does.
    pub fn watch(&self) -> watch::Receiver<u64> {
        self.shared.changes.subscribe()
    }

    /// Wait until the status satisfies `pred`, and return that status.
    pub async fn wait_for(&self, pred: impl Fn(&SourceStatus) -> bool) -> SourceStatus {
        let mut rx = self.watch();
        loop {
            let s = self.status();
            if pred(&s) {
                return s;
            }
            if rx.changed().await.is_err() {
                return self.status();
            }
        }
    }

    /// Every subscribed type has had its first response handled.
    pub fn is_synced(&self) -> bool {
        lock(&self.shared.tracker).status.synced
    }

    /// NACK one resource of `type_url` on the handler's own initiative (e.g. a plugin version rolled back after it
    /// had been ACKed): `error_detail` is `name: reason` with `details`, on the latest nonce of the type. The
    /// resource's version is forgotten, so a reconnect asks for it again rather than claiming to hold it.
    pub fn nack(
        &self,
        type_url: &str,
        rejection: &Rejection,
        details: Vec<Any>,
    ) -> Result<NackSent, Error> {
        let Some(slot) = self.shared.slots.get(type_url) else {
            return Err(Error::Config(format!(
                "xDS source {} does not subscribe to {type_url}",
                self.shared.cfg.name
            )));
        };
        lock(&slot.versions).remove(&rejection.name);
        let (connection, nonce) = lock(&slot.last_nonce).clone();
        let message = rejection.to_string();
        let req = DeltaDiscoveryRequest {
            type_url: type_url.to_owned(),
            response_nonce: nonce.clone(),
            error_detail: Some(Status {
                code: NACK_CODE,
                message: message.clone(),
                details,
            }),
            ..Default::default()
        };
        if !self.shared.send(connection, req) {
            warn!(source = %self.shared.cfg.name, type_url, error = %message,
                "unsolicited NACK not sent: no stream open (the resource is asked for again on reconnect)");
            return Ok(NackSent::NotSent);
        }
        warn!(source = %self.shared.cfg.name, type_url, nonce, error = %message, "sent unsolicited NACK");
        self.shared.update(|t| {
            if let Some(ty) = t.ty(type_url) {
                ty.nacks += 1;
                ty.last_nack = Some(NackRecord {
                    nonce,
                    error: message,
                    at: rfc3339(SystemTime::now()),
                    solicited: false,
                });
            }
        });
        Ok(NackSent::Sent)
    }

    /// Send a report on the node's own initiative (e.g. a plugin's `ShadowReport`): a request of `type_url` with no
    /// nonce and `error_detail` of code 0 (OK) carrying `details`, which weft-control records and never takes for a
    /// NACK. `false`: no stream is open (the caller sends a fresh report later).
    pub fn report(&self, type_url: &str, message: &str, details: Vec<Any>) -> Result<bool, Error> {
        if !self.shared.slots.contains_key(type_url) {
            return Err(Error::Config(format!(
                "xDS source {} does not subscribe to {type_url}",
                self.shared.cfg.name
            )));
        }
        let req = DeltaDiscoveryRequest {
            type_url: type_url.to_owned(),
            error_detail: Some(Status {
                code: 0,
                message: message.to_owned(),
                details,
            }),
            ..Default::default()
        };
        let sent = match lock(&self.shared.stream).as_ref() {
            Some(s) => s.tx.send(req).is_ok(),
            None => false,
        };
        Ok(sent)
    }

    /// Stop the client: the stream is closed and the tasks end. What the handlers applied stays applied.
    pub fn stop(&self) {
        self.shared.stop.send_replace(true);
    }
}

struct TypeSlot {
    handler: Arc<dyn Handler>,
    pending: Mutex<Option<Pending>>,
    notify: Notify,
    /// Versions of the resources held (applied and not refused), sent as `initial_resource_versions`.
    versions: Mutex<BTreeMap<String, String>>,
    /// The connection and nonce of the latest response of this type.
    last_nonce: Mutex<(u64, String)>,
}

struct StreamSlot {
    connection: u64,
    tx: mpsc::UnboundedSender<DeltaDiscoveryRequest>,
}

struct Shared {
    cfg: SourceConfig,
    node: Node,
    order: Vec<String>,
    slots: BTreeMap<String, Arc<TypeSlot>>,
    tracker: Mutex<Tracker>,
    changes: watch::Sender<u64>,
    stream: Mutex<Option<StreamSlot>>,
    stop: watch::Sender<bool>,
}

impl Shared {
    fn update(&self, f: impl FnOnce(&mut Tracker)) {
        f(&mut lock(&self.tracker));
        self.changes.send_modify(|v| *v += 1);
    }

    fn status(&self) -> SourceStatus {
        let mut s = lock(&self.tracker).status.clone();
        for t in &mut s.types {
            if let Some(slot) = self.slots.get(&t.type_url) {
                t.resources = lock(&slot.versions).len();
                t.queued = lock(&slot.pending).as_ref().map_or(0, |p| p.responses);
            }
        }
        s
    }

    /// Send on the stream of `connection`, if it is still the open one.
    fn send(&self, connection: u64, req: DeltaDiscoveryRequest) -> bool {
        match lock(&self.stream).as_ref() {
            Some(s) if s.connection == connection => s.tx.send(req).is_ok(),
            _ => false,
        }
    }

    fn stopped(&self) -> bool {
        *self.stop.borrow()
    }
}

/// The short name of a type URL for logs (`istio.workload.Address`).
fn short(type_url: &str) -> &str {
    type_url.rsplit('/').next().unwrap_or(type_url)
}

/// The stream task: connect, serve the stream, back off, again, until stopped.
async fn run(shared: Arc<Shared>) {
    let mut backoff = Backoff::new(shared.cfg.initial_backoff, shared.cfg.max_backoff);
    let mut stop = shared.stop.subscribe();
    let mut connection = 0u64;
    while !shared.stopped() {
        connection += 1;
        let span = info_span!("xds", source = %shared.cfg.name, connection);
        let (productive, err) = stream(&shared, connection).instrument(span).await;
        *lock(&shared.stream) = None;
        if shared.stopped() {
            break;
        }
        let delay = backoff.next(productive);
        let reason = err.to_string();
        shared.update(|t| {
            t.status.terminations.count(&err);
            let record = Some(Disconnect {
                at: rfc3339(SystemTime::now()),
                reason: reason.clone(),
            });
            if t.status.connected {
                t.status.last_disconnect = record;
            } else {
                t.status.connect_failures += 1;
                t.status.last_connect_error = record;
            }
            t.status.connected = false;
            t.status.connected_since = None;
        });
        if productive {
            info!(source = %shared.cfg.name, address = %shared.cfg.address, error = %reason, retry_in = ?delay,
                "xDS stream ended; reconnecting (the last good state keeps serving)");
        } else {
            warn!(source = %shared.cfg.name, address = %shared.cfg.address, error = %reason, retry_in = ?delay,
                "xDS connection failed; retrying (the last good state keeps serving)");
        }
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            _ = stop.wait_for(|s| *s) => break,
        }
    }
    debug!(source = %shared.cfg.name, "xDS client stopped");
}

/// One stream: returns whether it delivered a response, and why it ended.
async fn stream(shared: &Arc<Shared>, connection: u64) -> (bool, Error) {
    let channel = match connect::channel(&shared.cfg).await {
        Ok(c) => c,
        Err(e) => return (false, e),
    };
    let (tx, rx) = mpsc::unbounded_channel();
    for type_url in &shared.order {
        let versions = shared
            .slots
            .get(type_url)
            .map(|s| lock(&s.versions).clone())
            .unwrap_or_default();
        debug!(type_url = %short(type_url), resources = versions.len(), "sending initial request");
        let _ = tx.send(DeltaDiscoveryRequest {
            node: Some(shared.node.clone()),
            type_url: type_url.clone(),
            initial_resource_versions: versions.into_iter().collect(),
            ..Default::default()
        });
    }
    let outbound =
        futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|m| (m, rx)) });
    let mut request = tonic::Request::new(outbound);
    if let Err(e) = connect::insert_headers(&shared.cfg, request.metadata_mut()).await {
        return (false, e);
    }
    let mut client = AggregatedDiscoveryServiceClient::new(channel)
        .max_decoding_message_size(MAX_MESSAGE_SIZE)
        .max_encoding_message_size(MAX_MESSAGE_SIZE);
    let mut responses = match client.delta_aggregated_resources(request).await {
        Ok(r) => r.into_inner(),
        Err(s) => {
            return (
                false,
                Error::Connect {
                    address: shared.cfg.address.clone(),
                    message: format!("{:?}: {}", s.code(), status_message(&s)),
                },
            );
        }
    };
    *lock(&shared.stream) = Some(StreamSlot {
        connection,
        tx: tx.clone(),
    });
    shared.update(|t| {
        t.status.connected = true;
        t.status.connections += 1;
        t.status.connected_since = Some(rfc3339(SystemTime::now()));
    });
    info!(address = %shared.cfg.address, node = %shared.node.id, "xDS stream established");
    let mut stop = shared.stop.subscribe();
    let mut productive = false;
    loop {
        tokio::select! {
            msg = responses.message() => match msg {
                Ok(Some(r)) => {
                    productive = true;
                    dispatch(shared, connection, &tx, r);
                }
                Ok(None) => return (productive, Error::Closed),
                Err(s) => return (productive, Error::Status { code: s.code(), message: status_message(&s) }),
            },
            _ = stop.wait_for(|s| *s) => return (productive, Error::Closed),
        }
    }
}

/// Hand a response to its type's task (merged with what is already waiting there).
fn dispatch(
    shared: &Shared,
    connection: u64,
    tx: &mpsc::UnboundedSender<DeltaDiscoveryRequest>,
    r: DeltaDiscoveryResponse,
) {
    debug!(type_url = %short(&r.type_url), nonce = %r.nonce, resources = r.resources.len(),
        removed = r.removed_resources.len(), "received response");
    let Some(slot) = shared.slots.get(&r.type_url) else {
        let message = format!("weft did not subscribe to {}", r.type_url);
        warn!(type_url = %r.type_url, nonce = %r.nonce, "response for a type not subscribed; NACKed");
        let _ = tx.send(DeltaDiscoveryRequest {
            type_url: r.type_url,
            response_nonce: r.nonce,
            error_detail: Some(Status {
                code: NACK_CODE,
                message,
                details: Vec::new(),
            }),
            ..Default::default()
        });
        return;
    };
    let type_url = r.type_url.clone();
    let bytes: u64 = r
        .resources
        .iter()
        .map(|res| res.resource.as_ref().map_or(0, |v| v.value.len() as u64))
        .sum();
    *lock(&slot.last_nonce) = (connection, r.nonce.clone());
    lock(&slot.pending)
        .get_or_insert_with(Pending::default)
        .merge(connection, r);
    slot.notify.notify_one();
    shared.update(|t| {
        if let Some(ty) = t.ty(&type_url) {
            ty.responses += 1;
            ty.received_bytes += bytes;
        }
    });
}

/// A type's task: run the handler on what is waiting, record the versions held, answer.
async fn worker(shared: Arc<Shared>, type_url: String, slot: Arc<TypeSlot>) {
    let mut stop = shared.stop.subscribe();
    loop {
        tokio::select! {
            () = slot.notify.notified() => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        let Some(pending) = lock(&slot.pending).take() else {
            continue;
        };
        let (nonce, connection) = (pending.nonce.clone(), pending.connection);
        let (delta, refused) = pending.into_delta(&type_url);
        let system_version_info = delta.system_version_info.clone();
        let upserted: Vec<(String, String)> = delta
            .upserts
            .iter()
            .map(|u| (u.name.clone(), u.version.clone()))
            .collect();
        let removed = delta.removals.clone();
        let (n_up, n_rm) = (upserted.len(), removed.len());
        let mut rejections = slot.handler.apply(delta).await;
        rejections.extend(refused);
        {
            let mut versions = lock(&slot.versions);
            for name in &removed {
                versions.remove(name);
            }
            for (name, version) in upserted {
                // A refused resource keeps the version of what is still held under its name (if anything), so a
                // reconnect reports what the node really serves.
                if !rejections.iter().any(|r| r.name == name) {
                    versions.insert(name, version);
                }
            }
        }
        let now = rfc3339(SystemTime::now());
        if rejections.is_empty() {
            debug!(nonce, upserts = n_up, removals = n_rm, "ACK");
            let sent = shared.send(
                connection,
                DeltaDiscoveryRequest {
                    type_url: type_url.clone(),
                    response_nonce: nonce.clone(),
                    ..Default::default()
                },
            );
            shared.update(|t| {
                t.mark_synced(&type_url);
                if let (Some(ty), true) = (t.ty(&type_url), sent) {
                    ty.acks += 1;
                    ty.last_ack = Some(AckRecord {
                        nonce,
                        system_version_info,
                        at: now,
                    });
                }
            });
        } else {
            let message = nack_message(&rejections);
            warn!(nonce, upserts = n_up, removals = n_rm, refused = rejections.len(), error = %message,
                "NACK: refused resources keep their last good version; the rest applied");
            let sent = shared.send(
                connection,
                DeltaDiscoveryRequest {
                    type_url: type_url.clone(),
                    response_nonce: nonce.clone(),
                    error_detail: Some(Status {
                        code: NACK_CODE,
                        message: message.clone(),
                        details: Vec::new(),
                    }),
                    ..Default::default()
                },
            );
            shared.update(|t| {
                t.mark_synced(&type_url);
                if let (Some(ty), true) = (t.ty(&type_url), sent) {
                    ty.nacks += 1;
                    ty.last_nack = Some(NackRecord {
                        nonce,
                        error: message,
                        at: now,
                        solicited: true,
                    });
                }
            });
        }
    }
}
