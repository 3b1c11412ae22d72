//! Runs the staged rollouts: the publisher hands every plugin set through [`Rollouts::apply`] (a fresh set from
//! the source, or the same set again when the fleet changed or a bake ended), which steps each plugin, keeps the
//! records and persists them when they change; [`Rollouts::spawn`] re-applies on every registry event (coalesced)
//! and at the earliest bake end.
//!
//! With the WeftPlugin controller the replicas do not step: the leader steps over every replica's nodes
//! ([`Rollouts::lead`], from the status loop), records the result in each resource's status, and every replica,
//! the leader included, serves what the recorded state says ([`Rollouts::adopt`], [`Rollouts::mirror`]).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use tokio_util::sync::CancellationToken;

use crate::ads::publish::Publisher;
use crate::ads::registry::Registry;
use crate::ads::resources::{PluginEntry, TypeSet};
use crate::rollout::engine::step;
use crate::rollout::fleet::Fleet;
use crate::rollout::state::{Progress, Record};
use crate::rollout::store::{FileStore, StoreError};

/// How long registry events are gathered before the rollouts are stepped again.
const COALESCE: Duration = Duration::from_millis(50);

/// How long a change of figures alone may wait to be persisted (a stage, a phase or an abort is persisted at once).
const FIGURES_EVERY: Duration = Duration::from_secs(5);

#[derive(Debug, Default)]
struct Inner {
    records: BTreeMap<String, Record>,
    /// When the records were last written, and whether a change of figures is waiting.
    saved_at: Option<SystemTime>,
    unsaved: bool,
    /// Node name → zone, and the mesh generation it was read from (decoding every workload on every step would
    /// cost a big mesh dearly).
    zones: (Option<u64>, BTreeMap<String, String>),
    deadline: Option<SystemTime>,
    save_error: Option<String>,
}

/// Every plugin's rollout.
#[derive(Debug)]
pub struct Rollouts {
    inner: Mutex<Inner>,
    store: Option<FileStore>,
    registry: Arc<Registry>,
    wake: tokio::sync::Notify,
    /// Serve what [`Rollouts::adopt`] was given instead of stepping (the WeftPlugin controller's replicas).
    mirror: bool,
    /// The leader's own records (seeded from the adopted ones when it starts leading).
    led: Mutex<BTreeMap<String, Record>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Rollouts {
    /// The rollouts, resumed from `store` when there is one (without, they are kept in memory only and a restart
    /// starts every staged version over).
    pub fn new(store: Option<FileStore>, registry: Arc<Registry>) -> Result<Self, StoreError> {
        let mut records = match &store {
            Some(s) => {
                let r = s.load()?;
                tracing::info!(path = %s.path().display(), plugins = r.len(), "rollout state loaded");
                r
            }
            None => BTreeMap::new(),
        };
        let now = SystemTime::now();
        for (name, rec) in &mut records {
            if let Some(r) = rec
                .rollout
                .as_mut()
                .filter(|r| r.state == Progress::Progressing)
            {
                tracing::info!(plugin = %name, stage = r.stage + 1, "resuming a staged rollout");
                crate::rollout::engine::event(
                    r,
                    now,
                    format!("weft control restarted; resuming at stage {}", r.stage + 1),
                );
            }
        }
        Ok(Self {
            inner: Mutex::new(Inner {
                records,
                ..Inner::default()
            }),
            store,
            registry,
            wake: tokio::sync::Notify::new(),
            mirror: false,
            led: Mutex::new(BTreeMap::new()),
        })
    }

    /// Rollouts that serve the recorded state they are given ([`Rollouts::adopt`]) and step only when leading
    /// ([`Rollouts::lead`]): the WeftPlugin controller's.
    pub fn mirror(registry: Arc<Registry>) -> Self {
        Self {
            inner: Mutex::new(Inner::default()),
            store: None,
            registry,
            wake: tokio::sync::Notify::new(),
            mirror: true,
            led: Mutex::new(BTreeMap::new()),
        }
    }

    /// Serve these records from now on (what the resources' status says), by plugin.
    pub fn adopt(&self, records: BTreeMap<String, Record>) {
        lock(&self.inner).records = records;
    }

    /// As the leader: step every plugin of `plugins` (as the source gives them) over `fleet` at `now`, on the
    /// leader's own records (a plugin it has none of starts from the adopted one), and return them all.
    pub fn lead(
        &self,
        plugins: &BTreeMap<String, PluginEntry>,
        fleet: &Fleet,
        now: SystemTime,
    ) -> BTreeMap<String, Record> {
        let adopted = lock(&self.inner).records.clone();
        let mut led = lock(&self.led);
        led.retain(|name, _| plugins.contains_key(name));
        for (name, entry) in plugins {
            let rec = led
                .entry(name.clone())
                .or_insert_with(|| adopted.get(name).cloned().unwrap_or_default());
            let mut e = entry.clone();
            step(name, &mut e, rec, fleet, now);
        }
        led.clone()
    }

    /// The plugins whose recorded rollout is in progress.
    pub fn progressing(&self) -> std::collections::BTreeSet<String> {
        lock(&self.inner)
            .records
            .iter()
            .filter(|(_, r)| {
                r.rollout
                    .as_ref()
                    .is_some_and(|r| r.state == Progress::Progressing)
            })
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// No longer leading: forget the leader's records (a later term starts from what the status says).
    pub fn resign(&self) {
        lock(&self.led).clear();
    }

    /// Every record, for the status page.
    pub fn records(&self) -> BTreeMap<String, Record> {
        lock(&self.inner).records.clone()
    }

    /// Where the records are kept (`None`: memory only), and the last error saving them.
    pub fn persistence(&self) -> (Option<String>, Option<String>) {
        (
            self.store.as_ref().map(|s| s.path().display().to_string()),
            lock(&self.inner).save_error.clone(),
        )
    }

    /// Step every plugin of `plugins` (as the source gives them) at `now`: staged entries get their nodes, base and
    /// shadowing; withdrawn ones are removed. `mesh` (its generation and workloads) gives the nodes' zones.
    pub fn apply(
        &self,
        plugins: &mut BTreeMap<String, PluginEntry>,
        mesh: (u64, &TypeSet),
        now: SystemTime,
    ) {
        if self.mirror {
            self.serve(plugins);
            return;
        }
        let mut g = lock(&self.inner);
        let staged = plugins.values().any(|e| e.plan.is_some());
        let fleet = if staged {
            if g.zones.0 != Some(mesh.0) {
                g.zones = (Some(mesh.0), Fleet::zones(mesh.1));
            }
            Fleet::of_registry(&self.registry, &g.zones.1)
        } else {
            Fleet::default()
        };
        let mut progressed = false;
        let before = g.records.len();
        g.records.retain(|name, _| plugins.contains_key(name));
        progressed |= g.records.len() != before;
        let mut changed = g.unsaved;
        let mut deadline: Option<SystemTime> = None;
        let mut withdraw = Vec::new();
        for (name, entry) in plugins.iter_mut() {
            let rec = g.records.entry(name.clone()).or_default();
            let s = step(name, entry, rec, &fleet, now);
            changed |= s.changed;
            progressed |= s.progressed;
            if let Some(d) = s.deadline {
                deadline = Some(deadline.map_or(d, |x| x.min(d)));
            }
            if s.withdraw {
                withdraw.push(name.clone());
            }
        }
        for name in withdraw {
            plugins.remove(&name);
        }
        g.deadline = deadline;
        let due = g
            .saved_at
            .is_none_or(|t| now.duration_since(t).unwrap_or(Duration::ZERO) >= FIGURES_EVERY);
        g.unsaved = self.store.is_some() && changed && !progressed && !due;
        if g.unsaved
            && let Some(t) = g.saved_at
        {
            // Wake to write the figures that wait.
            let at = t + FIGURES_EVERY;
            g.deadline = Some(g.deadline.map_or(at, |d| d.min(at)));
        }
        if (progressed || (changed && due))
            && let Some(store) = &self.store
        {
            g.saved_at = Some(now);
            match store.save(&g.records) {
                Ok(()) => g.save_error = None,
                Err(e) => {
                    tracing::error!(error = %e, "cannot persist the rollout state; a restart would start staged versions over");
                    g.save_error = Some(e.to_string());
                }
            }
        }
        drop(g);
        self.wake.notify_one();
    }

    /// Give each node what the adopted records say (the stable version's pull secret taken from the resource as
    /// it is served now); withdrawn plugins are removed.
    fn serve(&self, plugins: &mut BTreeMap<String, PluginEntry>) {
        let g = lock(&self.inner);
        let empty = Record::default();
        let mut withdraw = Vec::new();
        for (name, entry) in plugins.iter_mut() {
            let rec = g.records.get(name).unwrap_or(&empty);
            let base = rec
                .stable
                .as_ref()
                .and_then(|s| s.resource(name))
                .map(|b| crate::rollout::secret::restore(b, &entry.current));
            if crate::rollout::engine::serve(name, entry, rec, base).withdraw {
                withdraw.push(name.clone());
            }
        }
        drop(g);
        for name in withdraw {
            plugins.remove(&name);
        }
    }

    fn active(&self) -> bool {
        lock(&self.inner).records.values().any(|r| {
            r.rollout
                .as_ref()
                .is_some_and(|r| r.state == Progress::Progressing)
        })
    }

    /// Re-apply the publisher's plugins whenever the fleet changes (while a rollout is in progress) or a bake ends,
    /// until `stop`.
    pub fn spawn(
        self: Arc<Self>,
        publisher: Arc<Publisher>,
        stop: CancellationToken,
    ) -> tokio::task::JoinHandle<()> {
        let mut events = self.registry.subscribe();
        tokio::spawn(async move {
            loop {
                let wait = lock(&self.inner).deadline.map(|d| {
                    d.duration_since(SystemTime::now())
                        .unwrap_or(Duration::ZERO)
                });
                let bake = async {
                    match wait {
                        Some(w) => tokio::time::sleep(w).await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = bake => {}
                    () = self.wake.notified() => continue,
                    r = events.changed() => {
                        if r.is_err() {
                            return;
                        }
                        if !self.active() {
                            continue;
                        }
                        tokio::time::sleep(COALESCE).await;
                        events.borrow_and_update();
                    }
                }
                publisher.reapply();
            }
        })
    }
}
