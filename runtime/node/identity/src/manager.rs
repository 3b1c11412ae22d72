//! The secret manager: one certificate per SPIFFE identity, kept in memory only. Concurrent requests for one
//! identity share one CA call; CA calls are bounded in number and served by priority (a waiting connection, then
//! a prefetch for a new local workload, then background renewals); certificates are renewed at half their
//! lifetime plus jitter; a failed renewal is retried with exponential backoff while the current certificate keeps
//! serving; an identity no local workload uses any more is forgotten.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use futures_util::FutureExt;
use futures_util::future::{BoxFuture, Shared};
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;
use serde::Serialize;
use tokio::sync::Notify;

use crate::Error;
use crate::ca::{CaClient, CertRequest};
use crate::cert::{CertSummary, WorkloadCert, new_csr, rfc3339};
use crate::clock::{SystemClock, WallClock};
use crate::sched::{Priority, PriorityCell, Scheduler};
use crate::spiffe::SpiffeId;

type Pending = Shared<BoxFuture<'static, Result<Arc<WorkloadCert>, Error>>>;

struct InFlight {
    fut: Pending,
    priority: Arc<PriorityCell>,
    task: tokio::task::AbortHandle,
}

#[derive(Default)]
struct Entry {
    cert: Option<Arc<WorkloadCert>>,
    pending: Option<InFlight>,
    last_error: Option<Error>,
    last_failure: Option<Instant>,
    /// When the next renewal (or retry) is due.
    refresh_at: Option<Instant>,
    failures: u32,
}

impl Entry {
    fn valid_cert(&self, now: SystemTime) -> Option<&Arc<WorkloadCert>> {
        self.cert.as_ref().filter(|c| c.not_after() > now)
    }
}

/// Counters for metrics.
#[derive(Debug, Default)]
pub struct IdentityCounters {
    /// CA calls made.
    pub fetches: AtomicU64,
    /// CA calls that failed (refused, unreachable, or an answer that did not validate).
    pub failures: AtomicU64,
    /// CA calls the CA refused (e.g. PermissionDenied).
    pub refused: AtomicU64,
    /// Certificates renewed while the previous one was still valid.
    pub renewals: AtomicU64,
    /// Callers that joined a CA call already in flight for the same identity instead of making their own.
    pub coalesced: AtomicU64,
}

/// Knobs.
#[derive(Debug, Clone)]
pub struct ManagerConfig {
    /// Lifetime to request.
    pub validity: Duration,
    /// Fraction of the lifetime after which a certificate is renewed (0.5 = half-life).
    pub refresh_fraction: f64,
    /// Random extra delay before renewal, as a fraction of the lifetime (spreads a node's renewals).
    pub refresh_jitter: f64,
    /// First retry delay after a failed fetch; doubled per failure. A connection arriving within this delay of a
    /// failure gets that failure at once instead of a new CA call.
    pub backoff_initial: Duration,
    /// Longest retry delay.
    pub backoff_max: Duration,
    /// CA calls in flight at most.
    pub max_in_flight: usize,
    /// Deadline of one CA call (so a dead CA never holds a slot or a waiting connection forever).
    pub ca_timeout: Duration,
    /// Wall time, against which certificate validity is judged. Renewal and retry timers use tokio's clock, so a
    /// test that pauses tokio's clock and gives a [`crate::clock::TokioWallClock`] here controls all of time.
    pub clock: Arc<dyn WallClock>,
}

impl Default for ManagerConfig {
    fn default() -> Self {
        Self {
            validity: Duration::from_secs(24 * 3600),
            refresh_fraction: 0.5,
            refresh_jitter: 0.05,
            backoff_initial: Duration::from_millis(500),
            backoff_max: Duration::from_secs(150),
            max_in_flight: 8,
            ca_timeout: Duration::from_secs(10),
            clock: Arc::new(SystemClock),
        }
    }
}

/// What `/config_dump` shows per identity.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CertificateDump {
    /// SPIFFE id.
    pub identity: String,
    /// Initializing (first fetch under way) | Available (a valid certificate) | Unavailable (none, last fetch
    /// failed).
    pub state: &'static str,
    /// Leaf serial number (decimal, as ztunnel's), when a certificate is held.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub serial_number: Option<String>,
    /// Leaf not-before (RFC 3339).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub valid_from: Option<String>,
    /// Leaf not-after (RFC 3339).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expiration_time: Option<String>,
    /// The leaf and its intermediates (ztunnel's `certChain`; the roots are in `root_certs`).
    pub cert_chain: Vec<CertSummary>,
    /// Trust roots (ztunnel's shape: each with its PEM, serial number and validity).
    pub root_certs: Vec<CertSummary>,
    /// A CA call is in flight (or queued) for it, at this priority.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pending: Option<Priority>,
    /// Failed fetches in a row.
    pub consecutive_failures: u32,
    /// Next renewal or retry (RFC 3339).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_refresh: Option<String>,
    /// The last error, if the last fetch failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

/// The per-node secret manager.
pub struct SecretManager {
    ca: Arc<dyn CaClient>,
    cfg: ManagerConfig,
    entries: Mutex<HashMap<SpiffeId, Entry>>,
    counters: Arc<IdentityCounters>,
    sched: Arc<Scheduler>,
    /// Where CA calls run: the runtime current when the manager was built (the control runtime), if any.
    runtime: Option<tokio::runtime::Handle>,
    /// Wakes the refresher when a renewal time changes.
    wake: Notify,
}

impl std::fmt::Debug for SecretManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecretManager")
            .field("ca", &self.ca)
            .field("sched", &self.sched)
            .finish_non_exhaustive()
    }
}

impl SecretManager {
    /// A manager that obtains certificates from `ca`. CA calls run on the runtime current at this call (if any;
    /// otherwise on the caller's runtime).
    pub fn new(ca: Arc<dyn CaClient>, cfg: ManagerConfig) -> Arc<Self> {
        Arc::new(Self {
            ca,
            sched: Scheduler::new(cfg.max_in_flight),
            cfg,
            entries: Mutex::new(HashMap::new()),
            counters: Arc::default(),
            runtime: tokio::runtime::Handle::try_current().ok(),
            wake: Notify::new(),
        })
    }

    /// Counters (CA calls, failures, ...).
    pub fn counters(&self) -> &Arc<IdentityCounters> {
        &self.counters
    }

    /// (CA calls in flight, CA calls waiting for a slot).
    pub fn ca_calls(&self) -> (usize, usize) {
        self.sched.stats()
    }

    /// The CA client.
    pub fn ca(&self) -> &Arc<dyn CaClient> {
        &self.ca
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<SpiffeId, Entry>> {
        self.entries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The certificate for `id`, for a connection that waits for it: the cached one while valid; otherwise the
    /// CA call in flight for it (raised to real-time priority), or a new one. Within `backoff_initial` of a failed
    /// call it fails at once with that call's error.
    pub async fn fetch(self: &Arc<Self>, id: &SpiffeId) -> Result<Arc<WorkloadCert>, Error> {
        let pending = {
            let mut entries = self.lock();
            let e = entries.entry(id.clone()).or_default();
            if let Some(c) = e.valid_cert(self.cfg.clock.now()) {
                return Ok(c.clone());
            }
            if let Some(p) = &e.pending {
                p.priority.raise(Priority::RealTime);
                self.counters.coalesced.fetch_add(1, Relaxed);
                p.fut.clone()
            } else if let (Some(err), Some(at)) = (&e.last_error, e.last_failure)
                && at.elapsed() < self.cfg.backoff_initial
            {
                return Err(err.clone());
            } else {
                self.start(id, e, Priority::RealTime)
            }
        };
        pending.await
    }

    /// Start a CA call for `id` (the caller checked that none is in flight). The call runs as its own task, so a
    /// caller that gives up (a connection timing out) neither cancels it nor leaves it holding a CA slot.
    fn start(self: &Arc<Self>, id: &SpiffeId, e: &mut Entry, prio: Priority) -> Pending {
        let priority = PriorityCell::new(prio);
        let work = self.clone().fetch_from_ca(id.clone(), priority.clone());
        let handle = match &self.runtime {
            Some(rt) => rt.spawn(work),
            None => tokio::spawn(work),
        };
        let task = handle.abort_handle();
        let id2 = id.clone();
        let fut: BoxFuture<'static, Result<Arc<WorkloadCert>, Error>> = Box::pin(async move {
            match handle.await {
                Ok(r) => r,
                Err(j) if j.is_cancelled() => Err(Error::Forgotten(id2.to_string())),
                Err(j) => Err(Error::Ca(format!("certificate fetch task failed: {j}"))),
            }
        });
        let fut = fut.shared();
        e.pending = Some(InFlight {
            fut: fut.clone(),
            priority,
            task,
        });
        fut
    }

    async fn fetch_from_ca(
        self: Arc<Self>,
        id: SpiffeId,
        prio: Arc<PriorityCell>,
    ) -> Result<Arc<WorkloadCert>, Error> {
        let permit = self.sched.acquire(prio.clone()).await;
        self.counters.fetches.fetch_add(1, Relaxed);
        let result = match tokio::time::timeout(self.cfg.ca_timeout, self.issue(&id)).await {
            Ok(r) => r,
            Err(_) => Err(Error::CaUnavailable(format!(
                "no answer within {:?}",
                self.cfg.ca_timeout
            ))),
        };
        drop(permit);
        let mut entries = self.lock();
        // The identity may have been forgotten while we waited: then don't resurrect it.
        let Some(e) = entries.get_mut(&id) else {
            return result;
        };
        e.pending = None;
        let now = self.cfg.clock.now();
        match &result {
            Ok(cert) => {
                let renewal = e.valid_cert(now).is_some();
                if renewal {
                    self.counters.renewals.fetch_add(1, Relaxed);
                }
                e.refresh_at = Some(self.refresh_deadline(cert));
                tracing::info!(identity = %id, serial = cert.serial(), expires = %rfc3339(cert.not_after()),
                    priority = ?prio.get(), renewal, "certificate issued");
                e.cert = Some(cert.clone());
                e.last_error = None;
                e.last_failure = None;
                e.failures = 0;
            }
            Err(err) => {
                self.counters.failures.fetch_add(1, Relaxed);
                if matches!(err, Error::CaRefused { .. }) {
                    self.counters.refused.fetch_add(1, Relaxed);
                }
                e.failures = e.failures.saturating_add(1);
                let backoff = self.backoff(e.failures);
                e.refresh_at = Some(Instant::now() + backoff);
                e.last_error = Some(err.clone());
                e.last_failure = Some(Instant::now());
                let keeps = e.valid_cert(now).map(|c| rfc3339(c.not_after()));
                tracing::warn!(identity = %id, error = %err, retry_in = ?backoff, failures = e.failures,
                    current_certificate_valid_until = keeps.as_deref().unwrap_or("none"), "certificate fetch failed");
            }
        }
        drop(entries);
        self.wake.notify_one();
        result
    }

    fn backoff(&self, failures: u32) -> Duration {
        let doublings = failures.clamp(1, 17) - 1;
        self.cfg
            .backoff_initial
            .saturating_mul(1u32 << doublings)
            .min(self.cfg.backoff_max)
    }

    async fn issue(&self, id: &SpiffeId) -> Result<Arc<WorkloadCert>, Error> {
        let csr = new_csr(id)?;
        let req = CertRequest {
            identity: id.clone(),
            csr_pem: csr.csr_pem,
            validity: self.cfg.validity,
        };
        let issued = self.ca.sign(&req).await?;
        let mut root_pems = issued.roots_pem;
        if root_pems.is_empty() {
            root_pems = self.ca.trust_roots();
        }
        let roots = Arc::new(root_store(&root_pems)?);
        Ok(Arc::new(WorkloadCert::new_at(
            id.clone(),
            csr.key,
            &issued.chain_pem,
            roots,
            root_pems,
            self.cfg.clock.now(),
        )?))
    }

    /// Renewal time: `refresh_fraction` (+ jitter) of the lifetime left when the certificate arrived. Measured from
    /// arrival rather than not-before, since CAs back-date not-before for clock skew.
    fn refresh_deadline(&self, cert: &WorkloadCert) -> Instant {
        let now = self.cfg.clock.now();
        let start = cert.not_before().max(now);
        let life = cert.not_after().duration_since(start).unwrap_or_default();
        let jitter = self.cfg.refresh_jitter * rand::random::<f64>();
        let fraction = (self.cfg.refresh_fraction + jitter).clamp(0.0, 0.95);
        Instant::now() + life.mul_f64(fraction)
    }

    /// Start fetching `id` (a new local workload) at warm-up priority without waiting.
    pub fn prefetch(self: &Arc<Self>, id: &SpiffeId) {
        let mut entries = self.lock();
        let e = entries.entry(id.clone()).or_default();
        if e.pending.is_none() && e.valid_cert(self.cfg.clock.now()).is_none() {
            drop(self.start(id, e, Priority::Warmup));
        }
    }

    /// Keep only `wanted` identities (those with a workload on this node): forget the rest (cancelling their CA
    /// calls) and prefetch the new ones.
    pub fn retain(self: &Arc<Self>, wanted: &HashSet<SpiffeId>) {
        let new: Vec<SpiffeId> = {
            let mut entries = self.lock();
            entries.retain(|id, e| {
                let keep = wanted.contains(id);
                if !keep {
                    tracing::info!(identity = %id, "forgetting certificate: no local workload uses it");
                    if let Some(p) = &e.pending {
                        p.task.abort();
                    }
                }
                keep
            });
            wanted
                .iter()
                .filter(|id| !entries.contains_key(*id))
                .cloned()
                .collect()
        };
        for id in new {
            self.prefetch(&id);
        }
    }

    /// Renew certificates (and retry failed fetches) whose time has come; a current certificate keeps serving
    /// meanwhile. Returns when the next one is due.
    pub fn refresh_due(self: &Arc<Self>) -> Option<Instant> {
        let now = Instant::now();
        let wall = self.cfg.clock.now();
        let mut next: Option<Instant> = None;
        let mut entries = self.lock();
        let ids: Vec<SpiffeId> = entries.keys().cloned().collect();
        for id in ids {
            let Some(e) = entries.get_mut(&id) else {
                continue;
            };
            if e.pending.is_some() {
                continue;
            }
            match e.refresh_at {
                Some(t) if t <= now => {
                    let prio = if e.valid_cert(wall).is_some() {
                        Priority::Background
                    } else {
                        Priority::Warmup
                    };
                    drop(self.start(&id, e, prio));
                }
                Some(t) => next = Some(next.map_or(t, |n| n.min(t))),
                None => {}
            }
        }
        next
    }

    /// Run `refresh_due` whenever a renewal is due (checked at least every `tick`) until the task is aborted.
    pub fn spawn_refresher(self: &Arc<Self>, tick: Duration) -> tokio::task::JoinHandle<()> {
        let me = self.clone();
        tokio::spawn(async move {
            loop {
                let next = me.refresh_due();
                let until = next
                    .unwrap_or_else(|| Instant::now() + tick)
                    .min(Instant::now() + tick);
                tokio::select! {
                    () = tokio::time::sleep_until(until) => {}
                    () = me.wake.notified() => {}
                }
            }
        })
    }

    /// State of every identity, for `/config_dump`.
    pub fn dump(&self) -> Vec<CertificateDump> {
        let entries = self.lock();
        let now = self.cfg.clock.now();
        let inow = Instant::now();
        let mut out: Vec<CertificateDump> = entries
            .iter()
            .map(|(id, e)| {
                let valid = e.valid_cert(now);
                let state = match (valid, &e.pending) {
                    (Some(_), _) => "Available",
                    (None, Some(_)) => "Initializing",
                    (None, None) if e.last_error.is_some() => "Unavailable",
                    (None, None) => "Initializing",
                };
                let cert = e.cert.as_ref();
                CertificateDump {
                    identity: id.to_string(),
                    state,
                    serial_number: cert.map(|c| c.serial().to_owned()),
                    valid_from: cert.map(|c| rfc3339(c.not_before())),
                    expiration_time: cert.map(|c| rfc3339(c.not_after())),
                    cert_chain: cert.map(|c| c.summaries().to_vec()).unwrap_or_default(),
                    root_certs: cert
                        .map(|c| c.root_summaries().to_vec())
                        .unwrap_or_default(),
                    pending: e.pending.as_ref().map(|p| p.priority.get()),
                    consecutive_failures: e.failures,
                    next_refresh: e
                        .refresh_at
                        .map(|t| rfc3339(now + t.saturating_duration_since(inow))),
                    last_error: e.last_error.as_ref().map(ToString::to_string),
                }
            })
            .collect();
        out.sort_by(|a, b| a.identity.cmp(&b.identity));
        out
    }

    /// Time until the soonest valid certificate expires (None with no valid certificate).
    pub fn soonest_expiry(&self) -> Option<Duration> {
        let now = self.cfg.clock.now();
        self.lock()
            .values()
            .filter_map(|e| e.valid_cert(now).map(|c| c.remaining(now)))
            .min()
    }
}

/// A root store from PEM certificates.
pub fn root_store(pems: &[String]) -> Result<rustls::RootCertStore, Error> {
    let mut store = rustls::RootCertStore::empty();
    for pem in pems {
        for der in CertificateDer::pem_slice_iter(pem.as_bytes()) {
            let der = der.map_err(|e| Error::BadCertificate(format!("bad root PEM: {e}")))?;
            store
                .add(der)
                .map_err(|e| Error::BadCertificate(format!("bad root certificate: {e}")))?;
        }
    }
    if store.is_empty() {
        return Err(Error::BadCertificate("no trust roots".into()));
    }
    Ok(store)
}

#[cfg(test)]
#[path = "manager_tests.rs"]
mod tests;
