//! The contract between weft's data path and connection plugins: what a connection looks like to a hook, what a
//! policy decides, what telemetry is told, and how a policy change reaches live connections.
//!
//! This crate is deliberately tiny and dependency-free (tokio's `sync` only) so that the data path
//! (`weft-proxy`) never links the Wasm runtime: the proxy calls [`ConnectionHooks`], the plugin host implements
//! it, and the binary wires the two together.

pub mod clock;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// Which way a connection flows through this node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    /// A local workload opened it (captured on 15001 or via SOCKS5 on 15080).
    Outbound,
    /// A peer opened it towards a local workload (HBONE on 15008, or plaintext on 15006).
    Inbound,
}

impl Direction {
    /// Lowercase name, as used in logs and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Direction::Outbound => "outbound",
            Direction::Inbound => "inbound",
        }
    }
}

/// What the control plane says about a workload at one end of a connection.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WorkloadMeta {
    /// Unique id (Kubernetes: `cluster//Pod/namespace/name`).
    pub uid: String,
    /// Pod name.
    pub name: String,
    /// Namespace.
    pub namespace: String,
    /// Service account.
    pub service_account: String,
    /// Trust domain of its identity.
    pub trust_domain: String,
    /// Node it runs on.
    pub node: String,
    /// Owning workload name (e.g. the Deployment).
    pub workload_name: String,
    /// The owning workload's kind as ztunnel names it in baggage (`deployment`, `pod`, `job`, `cronjob`); empty
    /// reads as `deployment`.
    pub workload_type: String,
    /// Canonical service (`service.istio.io/canonical-name`).
    pub canonical_name: String,
    /// Canonical revision (`service.istio.io/canonical-revision`).
    pub canonical_revision: String,
    /// Cluster id.
    pub cluster_id: String,
    /// Locality region.
    pub region: String,
    /// Locality zone.
    pub zone: String,
    /// Labels the control plane gives (may be empty).
    pub labels: Vec<(String, String)>,
    /// Names (`namespace/name`) of WORKLOAD_SELECTOR authorization policies that select this workload.
    pub authorization_policies: Vec<String>,
    /// Its SPIFFE identity as [`Self::spiffe_id`] writes it, formed once when the state builds the metadata, so a
    /// connection's record shares it instead of formatting its own (empty where a test built the metadata by hand).
    pub identity: Arc<str>,
}

impl WorkloadMeta {
    /// The workload's SPIFFE identity.
    pub fn spiffe_id(&self) -> String {
        format!(
            "spiffe://{}/ns/{}/sa/{}",
            self.trust_domain, self.namespace, self.service_account
        )
    }
}

/// Everything a hook may know about a connection. Hooks never see payload bytes.
#[derive(Debug, Clone)]
pub struct ConnectionRecord {
    /// Unique per process, increasing.
    pub id: u64,
    /// Outbound or inbound.
    pub direction: Direction,
    /// Source socket address as this node saw it.
    pub src: SocketAddr,
    /// Destination socket address (the original destination: workload `ip:port`).
    pub dst: SocketAddr,
    /// The peer's verified SPIFFE identity (inbound HBONE), or the source workload's own identity (outbound).
    /// `None` for inbound plaintext. Shared: one allocation per HBONE connection or per workload, not per stream.
    pub peer_identity: Option<Arc<str>>,
    /// Source workload, when known.
    pub src_workload: Option<Arc<WorkloadMeta>>,
    /// Destination workload, when known.
    pub dst_workload: Option<Arc<WorkloadMeta>>,
    /// Destination service `namespace/hostname`, when a service VIP was targeted.
    pub dst_service: Option<String>,
    /// Whether the connection travels (or arrived) over HBONE with mutual TLS.
    pub hbone: bool,
}

/// A policy decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Let the connection through.
    Allow,
    /// Refuse it.
    Deny {
        /// The plugin (or built-in) that denied.
        by: String,
        /// Human-readable reason, logged and counted.
        reason: String,
    },
}

impl Verdict {
    /// True for [`Verdict::Allow`].
    pub fn is_allow(&self) -> bool {
        matches!(self, Verdict::Allow)
    }
}

/// What happened to a connection, reported once when it closes.
#[derive(Debug, Clone)]
pub struct CloseRecord {
    /// Bytes sent from the source towards the destination.
    pub bytes_sent: u64,
    /// Bytes received by the source from the destination.
    pub bytes_received: u64,
    /// How long the connection lived.
    pub duration: Duration,
    /// The verdict the connection had (or got on re-check).
    pub verdict: Verdict,
    /// Why it failed, if it did (connect refused, TLS failure, denied, idle timeout, ...).
    pub error: Option<String>,
    /// Istio-style response flag: `-`, `DENY`, `CONNECT`, `TLS_FAILURE`, `H2_HANDSHAKE_FAILURE`, `IDENTITY_ERROR`...
    pub response_flags: &'static str,
}

/// The hooks the data path calls. Implementations must be cheap and must not block for long: `authorize` runs on
/// the connection's task before any payload byte is forwarded; `on_open`/`on_close` must not add latency (queue
/// the event and return).
pub trait ConnectionHooks: Send + Sync + 'static {
    /// Decide whether a connection may proceed. Called once per connection, after the peer identity is known.
    fn authorize(&self, conn: &ConnectionRecord) -> Verdict;
    /// A connection was established (after `authorize` allowed it). The record comes shared, so a hook that keeps
    /// it past the call (the telemetry queue) takes a reference instead of copying it: a copy would touch the
    /// reference counts of the workloads' metadata, which every connection of a workload shares across threads.
    fn on_open(&self, conn: &Arc<ConnectionRecord>);
    /// A connection ended (allowed or not).
    fn on_close(&self, conn: &Arc<ConnectionRecord>, close: &CloseRecord);
    /// A receiver that changes whenever policy changed in a way that may deny live connections; the data path
    /// then calls `authorize` again on each live connection and closes those now denied.
    fn policy_changes(&self) -> tokio::sync::watch::Receiver<u64>;
}

/// Hooks that allow everything and observe nothing (a node with no plugins).
#[derive(Debug)]
pub struct NoHooks {
    changes: tokio::sync::watch::Sender<u64>,
}

impl Default for NoHooks {
    fn default() -> Self {
        Self {
            changes: tokio::sync::watch::channel(0).0,
        }
    }
}

impl ConnectionHooks for NoHooks {
    fn authorize(&self, _conn: &ConnectionRecord) -> Verdict {
        Verdict::Allow
    }
    fn on_open(&self, _conn: &Arc<ConnectionRecord>) {}
    fn on_close(&self, _conn: &Arc<ConnectionRecord>, _close: &CloseRecord) {}
    fn policy_changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changes.subscribe()
    }
}
