//! Shadow versions of policy plugins: decided beside the serving version on the same connections, off the data
//! path (a queue to one thread at nice 19, bounded per plugin; a full queue skips the decision and counts it),
//! compared with the serving verdict, counted per (plugin, direction, serving verdict, shadow verdict) and sampled
//! where they diverge. Never enforced: a shadow that traps or times out is counted as `error` and nothing else
//! happens.

use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, Sender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use weft_hooks::{ConnectionRecord, Direction, Verdict};
use weft_state::PluginShadow;

use crate::base::clock::Clock;
use crate::metrics::host::{HostMetrics, ShadowLabels};
use crate::versions::version::PluginVersion;

/// A loaded shadow version of a serving policy plugin, as the chain holds it.
pub(crate) struct Shadow {
    /// The serving plugin's name.
    pub plugin: String,
    /// The shadow as the spec gave it (to tell whether a new spec changes it).
    pub spec: Arc<PluginShadow>,
    pub version: Arc<PluginVersion>,
    /// `weft_plugin_shadow_skipped_total{plugin}`.
    skipped: Counter,
    /// Its decisions queued and not yet decided: each plugin's shadow has its own bound, so a slow one cannot
    /// crowd another out of the queue.
    queued: AtomicUsize,
}

impl Shadow {
    pub fn new(
        plugin: &str,
        spec: Arc<PluginShadow>,
        version: Arc<PluginVersion>,
        metrics: &HostMetrics,
    ) -> Self {
        Self {
            plugin: plugin.to_string(),
            spec,
            version,
            skipped: metrics.shadow_skipped(plugin),
            queued: AtomicUsize::new(0),
        }
    }
}

/// One connection for a shadow to decide: the record and what the serving version decided.
pub(crate) struct ShadowJob {
    shadow: Arc<Shadow>,
    conn: ConnectionRecord,
    serving: Verdict,
}

/// The data path's end of the shadow queue (cheap to clone): one channel to the shadow thread, and a bound per
/// plugin on what it may have queued.
#[derive(Clone)]
pub(crate) struct ShadowQueue {
    tx: Sender<ShadowJob>,
    per_plugin: usize,
}

impl ShadowQueue {
    /// Hands a decision to the shadow thread if this plugin's shadow has room; never waits. A full queue skips it
    /// (counted).
    pub fn offer(&self, shadow: &Arc<Shadow>, conn: &ConnectionRecord, serving: &Verdict) {
        if shadow.queued.fetch_add(1, Ordering::AcqRel) >= self.per_plugin {
            shadow.queued.fetch_sub(1, Ordering::AcqRel);
            shadow.skipped.inc();
            return;
        }
        let job = ShadowJob {
            shadow: shadow.clone(),
            conn: conn.clone(),
            serving: serving.clone(),
        };
        if let Err(e) = self.tx.send(job) {
            e.0.shadow.queued.fetch_sub(1, Ordering::AcqRel);
            shadow.skipped.inc();
        }
    }
}

/// Lowers the calling thread (the shadow thread) to nice 19: it gets a core when the data path leaves one, and
/// otherwise a small share, so shadow decisions never take CPU from connections; while the machine is busy they
/// queue, and past the queue's bound they are skipped and counted. (Not the idle class: there a decision could
/// wait seconds for a slice and pass its call's wall-clock cap, an `error` that would read as a divergence.)
#[allow(unsafe_code)]
fn low_priority() {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: gettid has no preconditions; setpriority with PRIO_PROCESS and a thread id changes that thread's
        // nice value only (Linux schedules threads individually).
        let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, 19) };
        if rc != 0 {
            tracing::debug!(error = %std::io::Error::last_os_error(), "shadow thread: cannot lower its priority");
        }
    }
}

/// How divergence samples are kept.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SampleLimits {
    /// Samples kept per plugin (a ring).
    pub ring: usize,
    /// Samples taken per interval, at most.
    pub per_interval: u32,
    pub interval: Duration,
}

/// One connection the shadow decided otherwise than the serving version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DivergenceSample {
    /// The connection's id.
    pub conn: u64,
    /// `inbound` or `outbound`.
    pub direction: &'static str,
    pub src: SocketAddr,
    pub dst: SocketAddr,
    /// The verified peer identity (SPIFFE), when there was one.
    pub src_identity: Option<String>,
    /// The source workload (`namespace/name`), when known.
    pub src_workload: Option<String>,
    /// The destination workload (`namespace/name`), when known.
    pub dst_workload: Option<String>,
    /// `allow` or `deny`.
    pub serving: &'static str,
    /// The serving version's deny reason.
    pub serving_reason: Option<String>,
    /// `allow`, `deny` or `error`.
    pub shadow: &'static str,
    /// The shadow's deny reason, or what failed.
    pub shadow_reason: Option<String>,
}

/// Shadow decisions of one (direction, serving verdict, shadow verdict).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShadowCount {
    pub direction: &'static str,
    pub serving: &'static str,
    pub shadow: &'static str,
    pub count: u64,
}

/// What a plugin's shadow did so far (for `/config_dump` and the control plane).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ShadowReport {
    /// The shadow version's sha256 (`None` while none is loaded).
    pub sha256: Option<String>,
    /// Why the shadow version did not load, if it did not.
    pub load_error: Option<String>,
    pub decisions: Vec<ShadowCount>,
    /// Decisions skipped for a full queue.
    pub skipped: u64,
    /// Divergences not sampled (over the rate limit).
    pub samples_dropped: u64,
    /// The latest divergence samples, oldest first.
    pub samples: Vec<DivergenceSample>,
}

#[derive(Default)]
struct Book {
    sha256: Option<String>,
    load_error: Option<String>,
    counts: BTreeMap<ShadowLabels, (Counter, u64)>,
    skipped: Option<Counter>,
    samples: VecDeque<DivergenceSample>,
    samples_dropped: u64,
    window_start: Duration,
    in_window: u32,
}

/// The shadow figures of every plugin with a shadow, written by the shadow thread.
pub(crate) struct ShadowBook {
    books: Mutex<BTreeMap<String, Book>>,
    metrics: HostMetrics,
    clock: Arc<dyn Clock>,
    limits: SampleLimits,
}

fn word(v: &Verdict) -> (&'static str, Option<String>) {
    match v {
        Verdict::Allow => ("allow", None),
        Verdict::Deny { reason, .. } => ("deny", Some(reason.clone())),
    }
}

fn direction(d: Direction) -> &'static str {
    match d {
        Direction::Inbound => "inbound",
        Direction::Outbound => "outbound",
    }
}

impl ShadowBook {
    pub fn new(metrics: HostMetrics, clock: Arc<dyn Clock>, limits: SampleLimits) -> Self {
        Self {
            books: Mutex::new(BTreeMap::new()),
            metrics,
            clock,
            limits,
        }
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<String, Book>> {
        self.books.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A new shadow version of `plugin` (or none that loaded: `load_error`): its figures start over.
    pub fn start(&self, plugin: &str, sha256: Option<String>, load_error: Option<String>) {
        self.forget(plugin);
        let skipped = sha256.as_ref().map(|_| self.metrics.shadow_skipped(plugin));
        self.lock().insert(
            plugin.to_string(),
            Book {
                sha256,
                load_error,
                skipped,
                window_start: self.clock.now(),
                ..Book::default()
            },
        );
    }

    /// `plugin` has no shadow any more: its figures and series go.
    pub fn forget(&self, plugin: &str) {
        if let Some(book) = self.lock().remove(plugin) {
            let labels: Vec<ShadowLabels> = book.counts.keys().cloned().collect();
            self.metrics.remove_shadow(plugin, &labels);
        }
    }

    /// The plugins with a shadow (or a shadow that failed to load).
    pub fn plugins(&self) -> Vec<String> {
        self.lock().keys().cloned().collect()
    }

    /// What `plugin`'s shadow did so far.
    pub fn report(&self, plugin: &str) -> Option<ShadowReport> {
        let books = self.lock();
        let b = books.get(plugin)?;
        Some(ShadowReport {
            sha256: b.sha256.clone(),
            load_error: b.load_error.clone(),
            decisions: b
                .counts
                .iter()
                .map(|(l, (_, n))| ShadowCount {
                    direction: l.direction,
                    serving: l.serving,
                    shadow: l.shadow,
                    count: *n,
                })
                .collect(),
            skipped: b.skipped.as_ref().map_or(0, |c| c.get()),
            samples_dropped: b.samples_dropped,
            samples: b.samples.iter().cloned().collect(),
        })
    }

    /// Decides `job` with its shadow and books the outcome.
    fn decide(&self, job: ShadowJob) {
        let ShadowJob {
            shadow,
            conn,
            serving,
        } = job;
        let decided = shadow.version.decide(&conn);
        shadow.queued.fetch_sub(1, Ordering::AcqRel);
        let (serving_word, serving_reason) = word(&serving);
        let (shadow_word, shadow_reason) = match &decided {
            Ok(v) => word(v),
            Err(e) => ("error", Some(e.to_string())),
        };
        let labels = ShadowLabels {
            plugin: shadow.plugin.clone(),
            direction: direction(conn.direction),
            serving: serving_word,
            shadow: shadow_word,
        };
        let mut books = self.lock();
        // A job queued before its shadow was replaced or removed is not booked against the new one.
        let Some(book) = books.get_mut(&shadow.plugin) else {
            return;
        };
        if book.sha256.as_deref() != Some(shadow.version.sha256.as_str()) {
            return;
        }
        let entry = book
            .counts
            .entry(labels.clone())
            .or_insert_with(|| (self.metrics.shadow_decisions(&labels), 0));
        entry.0.inc();
        entry.1 += 1;
        if serving_word == shadow_word {
            return;
        }
        let now = self.clock.now();
        if now.saturating_sub(book.window_start) >= self.limits.interval {
            book.window_start = now;
            book.in_window = 0;
        }
        if book.in_window >= self.limits.per_interval || self.limits.ring == 0 {
            book.samples_dropped += 1;
            return;
        }
        book.in_window += 1;
        if book.samples.len() >= self.limits.ring {
            book.samples.pop_front();
        }
        let workload = |w: &Option<Arc<weft_hooks::WorkloadMeta>>| {
            w.as_ref().map(|w| format!("{}/{}", w.namespace, w.name))
        };
        book.samples.push_back(DivergenceSample {
            conn: conn.id,
            direction: labels.direction,
            src: conn.src,
            dst: conn.dst,
            src_identity: conn.peer_identity.as_deref().map(str::to_string),
            src_workload: workload(&conn.src_workload),
            dst_workload: workload(&conn.dst_workload),
            serving: serving_word,
            serving_reason,
            shadow: shadow_word,
            shadow_reason,
        });
    }
}

/// A shadow queue of at most `per_plugin` decisions of each plugin, and its receiving end (for [`run`]). (The
/// channel itself is unbounded: few plugins have a shadow, and each is bounded.)
pub(crate) fn queue(per_plugin: usize) -> (ShadowQueue, Receiver<ShadowJob>) {
    let (tx, rx) = std::sync::mpsc::channel();
    (
        ShadowQueue {
            tx,
            per_plugin: per_plugin.max(1),
        },
        rx,
    )
}

/// The shadow thread's loop: decides queued jobs until every sender is gone (the host dropped).
pub(crate) fn run(rx: Receiver<ShadowJob>, book: Arc<ShadowBook>) {
    low_priority();
    while let Ok(job) = rx.recv() {
        book.decide(job);
    }
}
