//! Per-node records: who is connected (node id, node name, authenticated caller, peer), and per type what each
//! node ACKed (so which version of each plugin it runs), what it NACKed and why, and the rollbacks it reported.
//! Every ACK and NACK is also a log line and a metric. Read by the status endpoint, tests and the bench.

use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use serde::Serialize;
use tokio::sync::watch;
use weft_proto::weft::plugin::v1::RollbackReport;

use crate::ads::metrics::{Metrics, PluginLabel, TypeLabel};

/// What a response carried, matched with its ACK or NACK by the stream's Delta state.
pub use weft_xds::server::Sent;

/// How many rollbacks and NACKs a node record keeps.
const KEEP: usize = 16;

fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}

/// A NACKed resource.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Nacked {
    /// The version the node refused.
    pub version: String,
    /// Its reason (the node's `name: reason` line, or the whole message).
    pub reason: String,
    /// When (RFC 3339).
    pub at: String,
}

/// One NACK as received.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NackRecord {
    /// The response it answers (empty: an unsolicited NACK, e.g. a rollback).
    pub nonce: String,
    /// `error_detail.code`.
    pub code: i32,
    /// `error_detail.message`.
    pub message: String,
    /// When (RFC 3339).
    pub at: String,
}

/// A rollback a node reported.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RollbackRecord {
    /// The plugin.
    pub plugin: String,
    /// sha256 of the code rolled back.
    pub rolled_back_sha256: String,
    /// sha256 of the code serving again (empty: none).
    pub restored_sha256: String,
    /// Calls in the probation window.
    pub calls: u64,
    /// Failed calls.
    pub failures: u64,
    /// Traps.
    pub traps: u64,
    /// Deadline overruns.
    pub timeouts: u64,
    /// Time from the swap to the rollback, in seconds.
    pub after_seconds: f64,
    /// The threshold that was passed.
    pub max_failure_ratio: f64,
    /// When it was reported (RFC 3339).
    pub at: String,
}

impl RollbackRecord {
    fn from_report(r: &RollbackReport) -> Self {
        let after = r
            .after
            .as_ref()
            .map_or(0.0, |d| d.seconds as f64 + f64::from(d.nanos) / 1e9);
        Self {
            plugin: r.plugin.clone(),
            rolled_back_sha256: r.rolled_back_sha256.clone(),
            restored_sha256: r.restored_sha256.clone(),
            calls: r.calls,
            failures: r.failures,
            traps: r.traps,
            timeouts: r.timeouts,
            after_seconds: after,
            max_failure_ratio: r.max_failure_ratio,
            at: rfc3339(SystemTime::now()),
        }
    }
}

/// One type on one node.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TypeRecord {
    /// Subscribed to everything.
    pub wildcard: bool,
    /// Names subscribed to (besides the wildcard).
    pub names: Vec<String>,
    /// What the node ACKed: name → version. A removal it ACKed drops the name. Kept for the types whose every
    /// resource is followed per node ([`tracks_resources`]: plugins, what staged rollouts and the status read);
    /// empty for the mesh types, whose per-name records would cost every node a copy of the whole mesh.
    pub acked: BTreeMap<String, String>,
    /// What it refused last, by name (cleared by a later ACK of that name).
    pub nacked: BTreeMap<String, Nacked>,
    /// Responses sent and not yet answered.
    pub pending: usize,
    /// ACKs received.
    pub acks: u64,
    /// NACKs received.
    pub nacks: u64,
    /// The last NACKs, newest last.
    pub recent_nacks: VecDeque<NackRecord>,
}

/// A connected node.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeRecord {
    /// Stream id (unique in this process).
    pub stream: u64,
    /// xDS node id.
    pub id: String,
    /// Node name (`NODE_NAME` metadata, else the node id): what staged rollouts select.
    pub name: String,
    /// `node.cluster`.
    pub cluster: String,
    /// The TCP peer.
    pub peer: Option<SocketAddr>,
    /// The authenticated caller's identity.
    pub caller: String,
    /// The node the caller's token is bound to, if it says.
    pub caller_node: Option<String>,
    /// When the stream started (RFC 3339).
    pub connected_at: String,
    /// Per type URL.
    pub types: BTreeMap<String, TypeRecord>,
    /// Rollbacks reported on this stream, newest last.
    pub rollbacks: VecDeque<RollbackRecord>,
    /// The latest shadow report of each plugin on this stream.
    pub shadows: BTreeMap<String, crate::ads::shadow::ShadowRecord>,
    /// The latest call counts of each plugin on this stream.
    pub counts: BTreeMap<String, crate::ads::counts::CountsRecord>,
}

/// Split a NACK message into per-resource reasons: lines (or `; `-separated parts) of the form `name: reason`
/// naming a resource of `names`. Empty when the message names none of them.
pub fn per_resource_reasons<'a>(
    message: &str,
    names: impl Iterator<Item = &'a str> + Clone,
) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for part in message.split(['\n', ';']) {
        let part = part.trim();
        if let Some((name, _)) = part.split_once(": ")
            && names.clone().any(|n| n == name.trim())
        {
            out.insert(name.trim().to_owned(), part.to_owned());
        }
    }
    out
}

/// Whether the registry records, per node, which version of each resource of `type_url` it ACKed (extension
/// configs: which plugin version each node runs). For the mesh types (every node gets the same resources) only the
/// counts, the pending responses and what was refused are kept.
pub fn tracks_resources(type_url: &str) -> bool {
    type_url == weft_proto::type_url::EXTENSION_CONFIG
}

/// Everyone connected.
#[derive(Debug)]
pub struct Registry {
    nodes: Mutex<BTreeMap<u64, NodeRecord>>,
    next: AtomicU64,
    events: watch::Sender<u64>,
    metrics: Arc<Metrics>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Registry {
    /// An empty registry.
    pub fn new(metrics: Arc<Metrics>) -> Self {
        Self {
            nodes: Mutex::new(BTreeMap::new()),
            next: AtomicU64::new(1),
            events: watch::channel(0).0,
            metrics,
        }
    }

    /// The metrics.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    fn bump(&self) {
        self.events.send_modify(|n| *n += 1);
    }

    /// A receiver whose value changes on every connect, disconnect, ACK and NACK.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.events.subscribe()
    }

    /// Record a new stream; returns its id.
    pub fn connect(&self, mut record: NodeRecord) -> u64 {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        record.stream = id;
        tracing::info!(stream = id, node = %record.id, name = %record.name, caller = %record.caller, peer = ?record.peer, "node connected");
        lock(&self.nodes).insert(id, record);
        self.metrics.connected.inc();
        self.metrics.streams.inc();
        self.bump();
        id
    }

    /// Forget a stream.
    pub fn disconnect(&self, stream: u64, why: &str) {
        if let Some(r) = lock(&self.nodes).remove(&stream) {
            tracing::info!(stream, node = %r.id, reason = why, "node disconnected");
            self.metrics.connected.dec();
        }
        self.bump();
    }

    fn with_type<R>(
        &self,
        stream: u64,
        type_url: &str,
        f: impl FnOnce(&mut TypeRecord) -> R,
    ) -> Option<R> {
        let mut g = lock(&self.nodes);
        let node = g.get_mut(&stream)?;
        if !node.types.contains_key(type_url) {
            node.types
                .insert(type_url.to_owned(), TypeRecord::default());
        }
        node.types.get_mut(type_url).map(f)
    }

    /// Record a subscription state.
    pub fn subscribed(&self, stream: u64, type_url: &str, wildcard: bool, names: Vec<String>) {
        self.with_type(stream, type_url, |t| {
            t.wildcard = wildcard;
            t.names = names;
        });
    }

    /// Record what a node says it holds when it subscribes (`initial_resource_versions`: name → version).
    pub fn holds(
        &self,
        stream: u64,
        type_url: &str,
        versions: &std::collections::HashMap<String, String>,
    ) {
        if !tracks_resources(type_url) {
            return;
        }
        self.with_type(stream, type_url, |t| {
            for (name, version) in versions {
                t.acked.insert(name.clone(), version.clone());
            }
        });
        self.bump();
    }

    /// Record a response sent.
    pub fn sent(&self, stream: u64, type_url: &str, sent: &Sent) {
        let label = TypeLabel::of(type_url);
        self.metrics.responses.get_or_create(&label).inc();
        self.metrics
            .resources_sent
            .get_or_create(&label)
            .inc_by(sent.resources.len() as u64);
        self.metrics
            .removals_sent
            .get_or_create(&label)
            .inc_by(sent.removed.len() as u64);
        self.with_type(stream, type_url, |t| t.pending += 1);
    }

    /// Record an ACK of `sent`.
    pub fn ack(&self, stream: u64, node: &str, type_url: &str, nonce: &str, sent: &Sent) {
        let label = TypeLabel::of(type_url);
        self.metrics.acks.get_or_create(&label).inc();
        self.metrics
            .ack_latency
            .get_or_create(&label)
            .observe(sent.at.elapsed().as_secs_f64());
        tracing::info!(stream, %node, r#type = %label.r#type, nonce, resources = sent.resources.len(), removed = sent.removed.len(), "ACK");
        let per_resource = tracks_resources(type_url);
        self.with_type(stream, type_url, |t| {
            t.pending = t.pending.saturating_sub(1);
            t.acks += 1;
            if t.nacked.is_empty() && !per_resource {
                return;
            }
            for (name, version) in &sent.resources {
                if per_resource {
                    t.acked.insert(name.clone(), version.clone());
                }
                t.nacked.remove(name);
            }
            for name in &sent.removed {
                t.acked.remove(name);
                t.nacked.remove(name);
            }
        });
        self.bump();
    }

    /// Record a NACK: of `sent` when it answers a response, unsolicited otherwise. Resources the message names
    /// (`name: reason`) are refused and the others of `sent` applied; when it names none, all of `sent` is
    /// taken as refused. Rollback reports in the details are recorded.
    #[allow(clippy::too_many_arguments)]
    pub fn nack(
        &self,
        stream: u64,
        node: &str,
        type_url: &str,
        nonce: &str,
        sent: Option<&Sent>,
        status: &weft_proto::google::rpc::Status,
        rollbacks: &[RollbackReport],
    ) {
        let label = TypeLabel::of(type_url);
        self.metrics.nacks.get_or_create(&label).inc();
        if let Some(s) = sent {
            self.metrics
                .ack_latency
                .get_or_create(&label)
                .observe(s.at.elapsed().as_secs_f64());
        }
        tracing::warn!(stream, %node, r#type = %label.r#type, nonce, code = status.code, error = %status.message, rollbacks = rollbacks.len(), "NACK");
        let now = rfc3339(SystemTime::now());
        let mut g = lock(&self.nodes);
        let Some(rec) = g.get_mut(&stream) else {
            return;
        };
        let t = rec.types.entry(type_url.to_owned()).or_default();
        t.nacks += 1;
        t.recent_nacks.push_back(NackRecord {
            nonce: nonce.to_owned(),
            code: status.code,
            message: status.message.clone(),
            at: now.clone(),
        });
        while t.recent_nacks.len() > KEEP {
            t.recent_nacks.pop_front();
        }
        if let Some(s) = sent {
            t.pending = t.pending.saturating_sub(1);
            let reasons =
                per_resource_reasons(&status.message, s.resources.iter().map(|(n, _)| n.as_str()));
            for (name, version) in &s.resources {
                let reason = match (reasons.is_empty(), reasons.get(name)) {
                    (true, _) => Some(status.message.clone()),
                    (false, Some(r)) => Some(r.clone()),
                    (false, None) => None,
                };
                match reason {
                    Some(reason) => {
                        t.nacked.insert(
                            name.clone(),
                            Nacked {
                                version: version.clone(),
                                reason,
                                at: now.clone(),
                            },
                        );
                    }
                    None => {
                        if tracks_resources(type_url) {
                            t.acked.insert(name.clone(), version.clone());
                        }
                        t.nacked.remove(name);
                    }
                }
            }
            if !reasons.is_empty() {
                for name in &s.removed {
                    t.acked.remove(name);
                }
            }
        }
        for r in rollbacks {
            self.metrics
                .rollbacks
                .get_or_create(&PluginLabel {
                    plugin: r.plugin.clone(),
                })
                .inc();
            tracing::warn!(stream, %node, plugin = %r.plugin, rolled_back = %r.rolled_back_sha256, restored = %r.restored_sha256, calls = r.calls, failures = r.failures, "node rolled a plugin version back");
            // The version it ACKed is the one it no longer runs.
            if let Some(version) = t.acked.remove(&r.plugin) {
                t.nacked.insert(
                    r.plugin.clone(),
                    Nacked {
                        version,
                        reason: format!(
                            "rolled back after {} of {} calls failed (threshold {})",
                            r.failures, r.calls, r.max_failure_ratio
                        ),
                        at: now.clone(),
                    },
                );
            }
            rec.rollbacks.push_back(RollbackRecord::from_report(r));
            while rec.rollbacks.len() > KEEP {
                rec.rollbacks.pop_front();
            }
        }
        drop(g);
        self.bump();
    }

    /// A report the node sent on its own (`error_detail` code 0): its shadow reports and call counts are kept, by
    /// plugin.
    pub fn report(&self, stream: u64, type_url: &str, report: &weft_proto::google::rpc::Status) {
        let shadows = crate::ads::shadow::reports(&report.details);
        let counts = crate::ads::counts::counts(&report.details);
        if shadows.is_empty() && counts.is_empty() {
            tracing::debug!(stream, r#type = %type_url, message = %report.message, "report with nothing weft control reads; ignored");
            return;
        }
        let mut g = lock(&self.nodes);
        let Some(rec) = g.get_mut(&stream) else {
            return;
        };
        for r in &shadows {
            let record = crate::ads::shadow::ShadowRecord::from_report(r);
            tracing::debug!(stream, node = %rec.name, plugin = %r.plugin, decisions = record.total(), divergences = record.divergences, "shadow report");
            rec.shadows.insert(r.plugin.clone(), record);
        }
        for (plugin, c) in counts {
            rec.counts.insert(plugin, c);
        }
        drop(g);
        self.bump();
    }

    /// Every connected node.
    pub fn nodes(&self) -> Vec<NodeRecord> {
        lock(&self.nodes).values().cloned().collect()
    }

    /// Look at every connected node's record in turn, under the registry's lock (no copy of the records, which
    /// with thousands of nodes costs more than what is read from them; `f` must not call back into the registry).
    pub fn visit(&self, mut f: impl FnMut(&NodeRecord)) {
        for r in lock(&self.nodes).values() {
            f(r);
        }
    }

    /// How many connected nodes ACKed `version` of `name` (of `type_url`).
    pub fn acked_count(&self, type_url: &str, name: &str, version: &str) -> usize {
        lock(&self.nodes)
            .values()
            .filter(|n| {
                n.types
                    .get(type_url)
                    .and_then(|t| t.acked.get(name))
                    .is_some_and(|v| v == version)
            })
            .count()
    }

    /// How many nodes are connected.
    pub fn connected(&self) -> usize {
        lock(&self.nodes).len()
    }

    /// Wait until `cond` holds for the registry (re-checked on every event), or `timeout`.
    pub async fn wait_for(
        &self,
        timeout: Duration,
        mut cond: impl FnMut(&Registry) -> bool,
    ) -> bool {
        let mut rx = self.subscribe();
        let wait = async {
            loop {
                if cond(self) {
                    return;
                }
                if rx.changed().await.is_err() {
                    return;
                }
            }
        };
        tokio::time::timeout(timeout, wait).await.is_ok()
    }
}
