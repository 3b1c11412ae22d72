//! What in-pod mode reports: the pods weft serves and their state (for `/config_dump` and readiness), and its
//! metrics (`weft_inpod_*`).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use serde_json::{Value, json};

use crate::netns::NetnsId;
use crate::protocol::PodInfo;

/// A pod's state in weft.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PodState {
    /// Its listeners are open inside its namespace.
    Serving,
    /// Opening its listeners failed; retried every few seconds.
    Pending,
    /// Removed: its listeners are closed and its connections drain.
    Draining,
}

impl PodState {
    fn as_str(self) -> &'static str {
        match self {
            PodState::Serving => "serving",
            PodState::Pending => "pending",
            PodState::Draining => "draining",
        }
    }
}

/// Something a pod's listener set can say about itself (listeners, live connections).
pub trait Describe: Send + Sync {
    /// A JSON object for `/config_dump`.
    fn describe(&self) -> Value;
    /// The pod's live connections (`/config_dump`'s `workloadState`).
    fn connections(&self) -> Vec<weft_proxy::LiveConnection> {
        Vec::new()
    }
}

struct Entry {
    info: PodInfo,
    state: PodState,
    netns: NetnsId,
    error: Option<String>,
    detail: Option<Arc<dyn Describe>>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct StateLabels {
    state: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct RequestLabels {
    kind: &'static str,
    result: &'static str,
}

/// Shared between the ZDS client (writer) and the admin servers (readers).
pub struct Status {
    pods: Mutex<BTreeMap<(String, u64), Entry>>,
    connected: AtomicBool,
    snapshot_received: AtomicBool,
    pods_gauge: Family<StateLabels, Gauge>,
    requests: Family<RequestLabels, Counter>,
    connections: Counter,
    connected_gauge: Gauge,
    started: Counter,
    start_failures: Counter,
    drained: Counter,
    /// ztunnel's `workload_manager_active_proxy_count`: pods served now.
    active_gauge: Gauge,
    /// ztunnel's `workload_manager_pending_proxy_count`: pods whose listeners wait for a retry.
    pending_gauge: Gauge,
    changes: tokio::sync::watch::Sender<u64>,
}

impl Default for Status {
    fn default() -> Self {
        Self {
            pods: Mutex::default(),
            connected: AtomicBool::default(),
            snapshot_received: AtomicBool::default(),
            pods_gauge: Family::default(),
            requests: Family::default(),
            connections: Counter::default(),
            connected_gauge: Gauge::default(),
            started: Counter::default(),
            start_failures: Counter::default(),
            drained: Counter::default(),
            active_gauge: Gauge::default(),
            pending_gauge: Gauge::default(),
            changes: tokio::sync::watch::channel(0).0,
        }
    }
}

impl std::fmt::Debug for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Status").finish_non_exhaustive()
    }
}

impl Status {
    /// Register the `weft_inpod_*` metrics, and ztunnel's `workload_manager_*` (the same counts under its names).
    pub fn register(&self, r: &mut Registry) {
        let z = r.sub_registry_with_prefix("workload_manager");
        z.register(
            "active_proxy_count",
            "The total number current workloads with active proxies (unstable)",
            self.active_gauge.clone(),
        );
        z.register(
            "pending_proxy_count",
            "The total number current workloads with pending proxies (unstable)",
            self.pending_gauge.clone(),
        );
        z.register(
            "proxies_started",
            "The total number of proxies that were started (unstable)",
            self.started.clone(),
        );
        z.register(
            "proxies_stopped",
            "The total number of proxies that were stopped (unstable)",
            self.drained.clone(),
        );
        let r = r.sub_registry_with_prefix("weft_inpod");
        r.register(
            "pods",
            "Pods weft serves in in-pod mode, by state",
            self.pods_gauge.clone(),
        );
        r.register(
            "zds_requests",
            "ZDS requests from the CNI node agent, by kind and result (error: answered with an error ack)",
            self.requests.clone(),
        );
        r.register(
            "zds_connections",
            "Connections made to the CNI node agent",
            self.connections.clone(),
        );
        r.register(
            "zds_connected",
            "1 while connected to the CNI node agent",
            self.connected_gauge.clone(),
        );
        r.register(
            "pod_listener_sets_started",
            "Pod listener sets opened",
            self.started.clone(),
        );
        r.register(
            "pod_listener_set_failures",
            "Pod listener sets that could not be opened (retried)",
            self.start_failures.clone(),
        );
        r.register(
            "pods_drained",
            "Pods whose listeners closed and connections drained",
            self.drained.clone(),
        );
    }

    pub(crate) fn set_connected(&self, up: bool) {
        self.connected.store(up, Ordering::Release);
        self.connected_gauge.set(i64::from(up));
        if up {
            self.connections.inc();
        }
    }

    pub(crate) fn set_snapshot_received(&self, v: bool) {
        self.snapshot_received.store(v, Ordering::Release);
    }

    pub(crate) fn request(&self, kind: &'static str, ok: bool) {
        let result = if ok { "ok" } else { "error" };
        self.requests
            .get_or_create(&RequestLabels { kind, result })
            .inc();
    }

    pub(crate) fn started(&self) {
        self.started.inc();
    }

    pub(crate) fn start_failed(&self) {
        self.start_failures.inc();
    }

    /// Record `info`'s state; `generation` tells apart a pod re-added while its old listener set still drains.
    pub(crate) fn set(
        &self,
        info: &PodInfo,
        generation: u64,
        state: PodState,
        netns: NetnsId,
        error: Option<String>,
        detail: Option<Arc<dyn Describe>>,
    ) {
        let mut pods = self.lock();
        pods.insert(
            (info.uid.clone(), generation),
            Entry {
                info: info.clone(),
                state,
                netns,
                error,
                detail,
            },
        );
        self.update_gauges(&pods);
        drop(pods);
        self.changes.send_modify(|n| *n += 1);
    }

    pub(crate) fn remove(&self, uid: &str, generation: u64, drained: bool) {
        let mut pods = self.lock();
        pods.remove(&(uid.to_owned(), generation));
        if drained {
            self.drained.inc();
        }
        self.update_gauges(&pods);
        drop(pods);
        self.changes.send_modify(|n| *n += 1);
    }

    /// Notified whenever a pod is added, changes state or is removed.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// The pods whose workloads need certificates: serving, or waiting for a retry.
    pub fn local_pods(&self) -> Vec<weft_proxy::LocalPod> {
        self.lock()
            .values()
            .filter(|e| e.state != PodState::Draining)
            .map(|e| weft_proxy::LocalPod {
                uid: e.info.uid.clone(),
                name: e.info.name.clone(),
                namespace: e.info.namespace.clone(),
                service_account: e.info.service_account.clone(),
            })
            .collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<(String, u64), Entry>> {
        self.pods
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn update_gauges(&self, pods: &BTreeMap<(String, u64), Entry>) {
        for s in [PodState::Serving, PodState::Pending, PodState::Draining] {
            let n = pods.values().filter(|e| e.state == s).count();
            let n = i64::try_from(n).unwrap_or(i64::MAX);
            self.pods_gauge
                .get_or_create(&StateLabels { state: s.as_str() })
                .set(n);
            if s == PodState::Serving {
                self.active_gauge.set(n);
            } else if s == PodState::Pending {
                self.pending_gauge.set(n);
            }
        }
    }

    /// Whether weft is connected to the agent.
    pub fn connected(&self) -> bool {
        self.connected.load(Ordering::Acquire)
    }

    /// Whether the agent's snapshot has been received on the current connection, or on an earlier one.
    pub fn snapshot_received(&self) -> bool {
        self.snapshot_received.load(Ordering::Acquire)
    }

    /// The pods in `state`.
    pub fn pods_in(&self, state: PodState) -> Vec<PodInfo> {
        self.lock()
            .values()
            .filter(|e| e.state == state)
            .map(|e| e.info.clone())
            .collect()
    }

    /// Why weft is not ready in in-pod mode (empty: ready). Like ztunnel: ready once the agent's snapshot arrived
    /// and no pod's listeners failed to open.
    pub fn not_ready(&self) -> Vec<String> {
        let mut out = Vec::new();
        if !self.snapshot_received() {
            out.push("in-pod: no snapshot from the CNI node agent yet".to_owned());
        }
        let pending: Vec<String> = self
            .pods_in(PodState::Pending)
            .into_iter()
            .map(|p| format!("{}/{}", p.namespace, p.name))
            .collect();
        if !pending.is_empty() {
            out.push(format!(
                "in-pod: listeners pending for {}",
                pending.join(", ")
            ));
        }
        out
    }

    /// Every pod (draining ones too), with its state and live connections.
    pub fn pods(&self) -> Vec<(PodInfo, PodState, Vec<weft_proxy::LiveConnection>)> {
        self.lock()
            .values()
            .map(|e| {
                let conns = e
                    .detail
                    .as_ref()
                    .map(|d| d.connections())
                    .unwrap_or_default();
                (e.info.clone(), e.state, conns)
            })
            .collect()
    }

    /// The `/config_dump` section.
    pub fn dump(&self) -> Value {
        let pods: Vec<Value> = self
            .lock()
            .values()
            .map(|e| {
                json!({
                    "uid": e.info.uid,
                    "name": e.info.name,
                    "namespace": e.info.namespace,
                    "serviceAccount": e.info.service_account,
                    "state": e.state,
                    "netns": e.netns.to_string(),
                    "error": e.error,
                    "detail": e.detail.as_ref().map(|d| d.describe()),
                })
            })
            .collect();
        json!({
            "connected": self.connected(),
            "snapshotReceived": self.snapshot_received(),
            "pods": pods,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::pod;

    fn value(text: &str, series: &str) -> Option<String> {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
            .map(str::to_owned)
    }

    #[test]
    fn workload_manager_metrics_have_ztunnels_names_and_count_the_pods() {
        let s = Status::default();
        let mut reg = Registry::default();
        s.register(&mut reg);
        let ns = NetnsId { dev: 1, ino: 2 };
        s.set(&pod("a"), 1, PodState::Serving, ns, None, None);
        s.started();
        s.set(&pod("b"), 1, PodState::Pending, ns, None, None);
        s.set(&pod("c"), 1, PodState::Serving, ns, None, None);
        s.started();
        s.set(&pod("c"), 1, PodState::Draining, ns, None, None);
        s.remove("c", 1, true);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &reg).unwrap();
        let v = |series| value(&text, series);
        assert_eq!(
            v("workload_manager_active_proxy_count").as_deref(),
            Some("1"),
            "{text}"
        );
        assert_eq!(
            v("workload_manager_pending_proxy_count").as_deref(),
            Some("1"),
            "{text}"
        );
        assert_eq!(
            v("workload_manager_proxies_started_total").as_deref(),
            Some("2"),
            "{text}"
        );
        assert_eq!(
            v("workload_manager_proxies_stopped_total").as_deref(),
            Some("1"),
            "{text}"
        );
        // weft's own names stay.
        assert_eq!(
            v("weft_inpod_pod_listener_sets_started_total").as_deref(),
            Some("2"),
            "{text}"
        );
        assert_eq!(
            v("weft_inpod_pods_drained_total").as_deref(),
            Some("1"),
            "{text}"
        );
    }
}
