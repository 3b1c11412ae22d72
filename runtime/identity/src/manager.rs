//! The secret manager: one certificate per SPIFFE identity, fetched on demand (concurrent requests coalesced into
//! one CA call), kept in memory only, refreshed before expiry, and forgotten when no local workload needs it.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use futures_util::FutureExt;
use futures_util::future::{BoxFuture, Shared};
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;
use serde::Serialize;

use crate::ca::{CaClient, CertRequest};
use crate::cert::{CertSummary, WorkloadCert, new_csr};
use crate::spiffe::SpiffeId;
use crate::Error;

type Pending = Shared<BoxFuture<'static, Result<Arc<WorkloadCert>, Error>>>;

#[derive(Default)]
struct Entry {
    cert: Option<Arc<WorkloadCert>>,
    pending: Option<Pending>,
    last_error: Option<String>,
    /// When the next background refresh is due.
    refresh_at: Option<Instant>,
    failures: u32,
}

/// Counters for metrics.
#[derive(Debug, Default)]
pub struct IdentityCounters {
    /// CA calls made.
    pub fetches: std::sync::atomic::AtomicU64,
    /// CA calls that failed.
    pub failures: std::sync::atomic::AtomicU64,
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
    /// First retry delay after a failed renewal; doubled per failure.
    pub backoff_initial: Duration,
    /// Longest retry delay.
    pub backoff_max: Duration,
}

impl Default for ManagerConfig {
    fn default() -> Self {
        Self {
            validity: Duration::from_secs(24 * 3600),
            refresh_fraction: 0.5,
            refresh_jitter: 0.05,
            backoff_initial: Duration::from_millis(500),
            backoff_max: Duration::from_secs(150),
        }
    }
}

/// What `/config_dump` shows per identity.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CertificateDump {
    /// SPIFFE id.
    pub identity: String,
    /// Initializing | Available | Unavailable.
    pub state: &'static str,
    /// The chain as issued (leaf first).
    pub cert_chain: Vec<CertSummary>,
    /// Trust roots (PEM).
    pub root_certs: Vec<String>,
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
}

impl std::fmt::Debug for SecretManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecretManager").field("ca", &self.ca).finish_non_exhaustive()
    }
}

impl SecretManager {
    /// A manager that obtains certificates from `ca`.
    pub fn new(ca: Arc<dyn CaClient>, cfg: ManagerConfig) -> Arc<Self> {
        Arc::new(Self {
            ca,
            cfg,
            entries: Mutex::new(HashMap::new()),
            counters: Arc::default(),
        })
    }

    /// Counters (CA calls, failures).
    pub fn counters(&self) -> &Arc<IdentityCounters> {
        &self.counters
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<SpiffeId, Entry>> {
        self.entries.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The certificate for `id`: the cached one while valid, otherwise a fetch (shared with every concurrent
    /// caller for the same identity).
    pub async fn fetch(self: &Arc<Self>, id: &SpiffeId) -> Result<Arc<WorkloadCert>, Error> {
        let pending = {
            let mut entries = self.lock();
            let e = entries.entry(id.clone()).or_default();
            if let Some(c) = &e.cert
                && c.not_after() > SystemTime::now()
            {
                return Ok(c.clone());
            }
            self.pending_for(id, e)
        };
        pending.await
    }

    fn pending_for(self: &Arc<Self>, id: &SpiffeId, e: &mut Entry) -> Pending {
        if let Some(p) = &e.pending {
            return p.clone();
        }
        let me = self.clone();
        let id2 = id.clone();
        let fut: BoxFuture<'static, Result<Arc<WorkloadCert>, Error>> =
            Box::pin(async move { me.fetch_from_ca(id2).await });
        let shared = fut.shared();
        e.pending = Some(shared.clone());
        shared
    }

    async fn fetch_from_ca(self: Arc<Self>, id: SpiffeId) -> Result<Arc<WorkloadCert>, Error> {
        use std::sync::atomic::Ordering::Relaxed;
        self.counters.fetches.fetch_add(1, Relaxed);
        let result = self.issue(&id).await;
        let mut entries = self.lock();
        // The identity may have been forgotten while we waited: then don't resurrect it.
        let Some(e) = entries.get_mut(&id) else {
            return result;
        };
        e.pending = None;
        match &result {
            Ok(cert) => {
                tracing::info!(identity = %id, serial = cert.serial(), expires = %crate::cert::rfc3339(cert.not_after()), "certificate issued");
                e.refresh_at = Some(self.refresh_deadline(cert));
                e.cert = Some(cert.clone());
                e.last_error = None;
                e.failures = 0;
            }
            Err(err) => {
                self.counters.failures.fetch_add(1, Relaxed);
                e.failures = e.failures.saturating_add(1);
                let backoff = self
                    .cfg
                    .backoff_initial
                    .saturating_mul(1u32 << e.failures.min(16).saturating_sub(1))
                    .min(self.cfg.backoff_max);
                e.refresh_at = Some(Instant::now() + backoff);
                e.last_error = Some(err.to_string());
                tracing::warn!(identity = %id, error = %err, retry_in = ?backoff, "certificate fetch failed");
            }
        }
        result
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
        Ok(Arc::new(WorkloadCert::new(
            id.clone(),
            csr.key,
            &issued.chain_pem,
            roots,
            root_pems,
        )?))
    }

    fn refresh_deadline(&self, cert: &WorkloadCert) -> Instant {
        let life = cert
            .not_after()
            .duration_since(cert.not_before())
            .unwrap_or_default();
        let jitter = self.cfg.refresh_jitter * rand::random::<f64>();
        let at = life.mul_f64((self.cfg.refresh_fraction + jitter).min(0.95));
        let elapsed = SystemTime::now()
            .duration_since(cert.not_before())
            .unwrap_or_default();
        Instant::now() + at.saturating_sub(elapsed)
    }

    /// Start fetching `id` in the background (a new local workload) without waiting.
    pub fn prefetch(self: &Arc<Self>, id: &SpiffeId) {
        let me = self.clone();
        let id = id.clone();
        tokio::spawn(async move {
            let _ = me.fetch(&id).await;
        });
    }

    /// Keep only `wanted` identities (those with a workload on this node); forget the rest and prefetch the new.
    pub fn retain(self: &Arc<Self>, wanted: &HashSet<SpiffeId>) {
        let new: Vec<SpiffeId> = {
            let mut entries = self.lock();
            entries.retain(|id, _| {
                let keep = wanted.contains(id);
                if !keep {
                    tracing::info!(identity = %id, "forgetting certificate: no local workload uses it");
                }
                keep
            });
            wanted.iter().filter(|id| !entries.contains_key(*id)).cloned().collect()
        };
        for id in new {
            self.prefetch(&id);
        }
    }

    /// Renew certificates whose refresh time has come; the old certificate keeps serving meanwhile.
    pub fn refresh_due(self: &Arc<Self>) {
        let now = Instant::now();
        let due: Vec<Pending> = {
            let mut entries = self.lock();
            let ids: Vec<SpiffeId> = entries
                .iter()
                .filter(|(_, e)| e.pending.is_none() && e.refresh_at.is_some_and(|t| t <= now))
                .map(|(id, _)| id.clone())
                .collect();
            ids.iter()
                .filter_map(|id| entries.get_mut(id).map(|e| self.pending_for(id, e)))
                .collect()
        };
        for p in due {
            tokio::spawn(p);
        }
    }

    /// Run `refresh_due` every `tick` until the returned task is aborted.
    pub fn spawn_refresher(self: &Arc<Self>, tick: Duration) -> tokio::task::JoinHandle<()> {
        let me = self.clone();
        tokio::spawn(async move {
            let mut iv = tokio::time::interval(tick);
            iv.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                iv.tick().await;
                me.refresh_due();
            }
        })
    }

    /// State of every identity, for `/config_dump`.
    pub fn dump(&self) -> Vec<CertificateDump> {
        let entries = self.lock();
        let mut out: Vec<CertificateDump> = entries
            .iter()
            .map(|(id, e)| CertificateDump {
                identity: id.to_string(),
                state: match (&e.cert, &e.last_error) {
                    (Some(_), _) => "Available",
                    (None, Some(_)) => "Unavailable",
                    (None, None) => "Initializing",
                },
                cert_chain: e.cert.as_ref().map(|c| c.summaries().to_vec()).unwrap_or_default(),
                root_certs: e.cert.as_ref().map(|c| c.root_pems().to_vec()).unwrap_or_default(),
                last_error: e.last_error.clone(),
            })
            .collect();
        out.sort_by(|a, b| a.identity.cmp(&b.identity));
        out
    }

    /// Seconds until the soonest certificate expires (None with no certificate).
    pub fn soonest_expiry(&self) -> Option<Duration> {
        let now = SystemTime::now();
        self.lock()
            .values()
            .filter_map(|e| e.cert.as_ref().map(|c| c.remaining(now)))
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
