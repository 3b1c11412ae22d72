//! One sandboxed plugin instance (a `Store` and the world's exports), the calls into it with a deadline, and the
//! classification of failures. An instance whose call failed is never reused.

use std::sync::Arc;
use std::time::Duration;

use wasmtime::component::{Linker, Resource};
use wasmtime::{Engine, Store, Trap};

use crate::bindings::types as wit;
use crate::bindings::{WorkloadRes, batches, policy, scope, telemetry};
use crate::epoch::EpochClock;
use crate::error::{CallError, ErrorKind, LoadError};
use crate::store::{PluginCtx, StoreData};

/// A component linked against the host and ready to instantiate (an `InstancePre` per world).
#[derive(Clone)]
pub(crate) enum Pre {
    Policy {
        pre: wasmtime::component::InstancePre<StoreData>,
        core: policy::TransportPolicyCoreIndices,
        /// The optional `authorize-scope` export, when the component has it.
        scope: Option<scope::AuthorizeScopeExportIndices>,
    },
    Telemetry {
        pre: wasmtime::component::InstancePre<StoreData>,
        core: telemetry::TelemetrySinkCoreIndices,
        /// The optional `telemetry-batches` export, when the component has it.
        batches: Option<batches::TelemetryBatchesExportIndices>,
    },
}

impl Pre {
    /// Whether a telemetry plugin takes merged batches (`telemetry-batches`).
    pub fn takes_batches(&self) -> bool {
        matches!(
            self,
            Pre::Telemetry {
                batches: Some(_),
                ..
            }
        )
    }
}

enum Exports {
    Policy(
        policy::TransportPolicyCore,
        Option<scope::AuthorizeScopeExport>,
    ),
    Telemetry(
        telemetry::TelemetrySinkCore,
        Option<batches::TelemetryBatchesExport>,
    ),
}

/// Whether `component` exports the interface `weft:plugin/<name>` (any version).
fn exports_interface(
    engine: &Engine,
    component: &wasmtime::component::Component,
    name: &str,
) -> bool {
    let wanted = format!("weft:plugin/{name}");
    component
        .component_type()
        .exports(engine)
        .any(|(n, _)| n.split('@').next() == Some(wanted.as_str()))
}

/// The limits applied to every instance, and the epoch clock its calls are timed by.
#[derive(Debug, Clone)]
pub(crate) struct Limits {
    pub memory: usize,
    pub call_deadline: Duration,
    pub configure_deadline: Duration,
    pub tick: Duration,
    /// Every guest call enters it, so the lazy ticker ticks while the call runs.
    pub clock: EpochClock,
    pub max_reason_len: usize,
}

/// A live instance.
pub(crate) struct Instance {
    store: Store<StoreData>,
    exports: Exports,
    limits: Limits,
    workloads: WorkloadTable,
}

/// How many workload resources an instance keeps in its table between calls: the local workloads of a busy node
/// (as many as the SDK's `WorkloadCache` keeps by default). A workload evicted from here is lent again under a new
/// key, so a plugin's cache of it misses: too few entries would make every decision of a node with more
/// destinations than this ask the host again.
const WORKLOAD_CACHE: usize = 64;

/// The workload resources an instance keeps in its store's table across `authorize` calls, so a decision lends a
/// borrow of an entry already there instead of pushing one (an allocation) and deleting it on every call. Entries
/// are found by the address of the metadata's `Arc`; each entry holds a clone of that `Arc`, so the address cannot
/// be freed and reused while it is cached. At most [`WORKLOAD_CACHE`] entries: a new one evicts the least recently
/// used.
///
/// Each entry pushed gets the next key (`workload.key` to the guest), so a key names one `Arc`, whose metadata
/// never changes, and is never given again in this instance: a guest that keeps what it derived from a workload
/// under its key cannot be handed another workload's (or an older version's) metadata under it. A workload evicted
/// and lent again gets a new key (the guest misses its cache once).
#[derive(Default)]
struct WorkloadTable {
    /// `(Arc::as_ptr as usize, table rep)`, least recently used first.
    entries: std::collections::VecDeque<(usize, u32)>,
    /// Keys given so far.
    keys: u64,
}

impl WorkloadTable {
    /// The table rep of `w`'s resource, pushed (and the least recently used evicted) if it is not cached.
    fn rep(
        &mut self,
        table: &mut wasmtime::component::ResourceTable,
        w: &Arc<weft_hooks::WorkloadMeta>,
    ) -> Result<u32, wasmtime::component::ResourceTableError> {
        let key = Arc::as_ptr(w) as usize;
        if let Some(i) = self.entries.iter().position(|(k, _)| *k == key) {
            // Most recently used goes last: the other workload of the same call, if it misses, evicts the least
            // recently used entry, never this one (whose slot the new entry would take while this call lends it).
            let entry = self.entries[i];
            if i + 1 != self.entries.len() {
                self.entries.remove(i);
                self.entries.push_back(entry);
            }
            return Ok(entry.1);
        }
        if self.entries.len() >= WORKLOAD_CACHE
            && let Some((_, old)) = self.entries.pop_front()
        {
            table.delete(Resource::<WorkloadRes>::new_own(old))?;
        }
        self.keys += 1;
        let rep = table
            .push(WorkloadRes {
                meta: w.clone(),
                key: self.keys,
            })?
            .rep();
        self.entries.push_back((key, rep));
        Ok(rep)
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        self.store.data().ctx.counters.instances.dec();
    }
}

/// Links `component` for its world; a component that does not fit (wrong world, WASI or other imports) fails here.
pub(crate) fn link(
    engine: &Engine,
    component: &wasmtime::component::Component,
    kind: weft_state::PluginKind,
) -> Result<Pre, LoadError> {
    let mut linker: Linker<StoreData> = Linker::new(engine);
    let world = match kind {
        weft_state::PluginKind::Policy => "weft:plugin/transport-policy",
        weft_state::PluginKind::Telemetry => "weft:plugin/telemetry-sink",
    };
    let wrong = |e: wasmtime::Error| LoadError::WrongWorld {
        world,
        reason: describe_imports(engine, component, &format!("{e:#}")),
    };
    crate::wasi::define(engine, component, &mut linker)
        .map_err(|reason| LoadError::WrongWorld { world, reason })?;
    match kind {
        weft_state::PluginKind::Policy => {
            policy::TransportPolicyCore::add_to_linker::<_, wasmtime::component::HasSelf<_>>(
                &mut linker,
                |d| d,
            )
            .map_err(|e| LoadError::Internal(format!("{e:#}")))?;
            let pre = linker.instantiate_pre(component).map_err(wrong)?;
            let core = policy::TransportPolicyCoreIndices::new(&pre).map_err(wrong)?;
            // Optional, but a component that exports it must export it right (an interface of another version
            // or shape is refused, not ignored: the plugin would be asked about connections it declared out of
            // scope, or the other way round).
            let scope = if exports_interface(engine, component, "authorize-scope") {
                Some(scope::AuthorizeScopeExportIndices::new(&pre).map_err(wrong)?)
            } else {
                None
            };
            Ok(Pre::Policy { pre, core, scope })
        }
        weft_state::PluginKind::Telemetry => {
            telemetry::TelemetrySinkCore::add_to_linker::<_, wasmtime::component::HasSelf<_>>(
                &mut linker,
                |d| d,
            )
            .map_err(|e| LoadError::Internal(format!("{e:#}")))?;
            let pre = linker.instantiate_pre(component).map_err(wrong)?;
            let core = telemetry::TelemetrySinkCoreIndices::new(&pre).map_err(wrong)?;
            // Optional; one of another version or shape is refused (see `authorize-scope`).
            let batches = if exports_interface(engine, component, "telemetry-batches") {
                Some(batches::TelemetryBatchesExportIndices::new(&pre).map_err(wrong)?)
            } else {
                None
            };
            Ok(Pre::Telemetry { pre, core, batches })
        }
    }
}

fn describe_imports(
    engine: &Engine,
    component: &wasmtime::component::Component,
    error: &str,
) -> String {
    let ty = component.component_type();
    let foreign: Vec<String> = ty
        .imports(engine)
        .map(|(name, _)| name.to_string())
        .filter(|n| !n.starts_with("weft:plugin/") && !n.starts_with("wasi:"))
        .collect();
    if foreign.is_empty() {
        error.to_string()
    } else {
        format!(
            "{error} (the component imports {}; weft offers only weft:plugin/* and a locked-down WASI)",
            foreign.join(", ")
        )
    }
}

/// The most bytes the host copies out of a guest in one transfer (a call's result, such as a deny reason, or the
/// arguments of one import call, such as a log line or metric label values). This is wasmtime's hostcall fuel:
/// it is charged from the length the guest declares *before* anything is copied, so an oversized string is
/// refused without the host ever allocating it. The data-specific caps (deny reason length, log line length,
/// metric label caps) apply afterwards to what was copied; this bound only stops the copy of something absurd.
pub(crate) const MAX_GUEST_TRANSFER: usize = 1 << 20;

/// Whether a failure is wasmtime refusing a guest-to-host transfer over [`MAX_GUEST_TRANSFER`]. wasmtime keeps
/// that error's type private, so it is recognised by its message (pinned by the `oversized_reason_*` tests).
fn transfer_too_large(e: &wasmtime::Error) -> bool {
    e.chain().any(|c| {
        c.to_string()
            .contains("fuel allocated for hostcalls has been exhausted")
    })
}

/// Classifies a failed call.
fn classify(e: wasmtime::Error, store: &Store<StoreData>) -> CallError {
    if store.data().limiter.memory_hit {
        return CallError {
            kind: ErrorKind::Memory,
            message: format!("{e:#}"),
        };
    }
    if transfer_too_large(&e) {
        return CallError {
            kind: ErrorKind::BadOutput,
            message: format!(
                "the plugin handed the host more than {MAX_GUEST_TRANSFER} bytes in one transfer (e.g. a deny \
                 reason); refused before copying"
            ),
        };
    }
    let kind = match e.downcast_ref::<Trap>() {
        Some(Trap::Interrupt) => ErrorKind::Timeout,
        Some(Trap::StackOverflow) => ErrorKind::StackOverflow,
        _ => ErrorKind::Trap,
    };
    let message = match kind {
        ErrorKind::Timeout => "call exceeded its deadline".to_string(),
        _ => {
            let mut m = format!("{e:#}");
            m.truncate(m.char_indices().nth(300).map_or(m.len(), |(i, _)| i));
            m
        }
    };
    CallError { kind, message }
}

impl Instance {
    /// Instantiates (no call yet).
    pub fn new(
        engine: &Engine,
        pre: &Pre,
        ctx: Arc<PluginCtx>,
        limits: Limits,
    ) -> Result<Self, CallError> {
        let mut store = Store::new(
            engine,
            StoreData::new(ctx.clone(), limits.memory, limits.tick),
        );
        store.limiter(|d| &mut d.limiter);
        store.set_hostcall_fuel(MAX_GUEST_TRANSFER);
        store.epoch_deadline_callback(crate::budget::on_deadline);
        let inst_err = |e: wasmtime::Error| CallError {
            kind: ErrorKind::Instantiate,
            message: format!("{e:#}"),
        };
        // Instantiation runs the component's start code: timed like a `configure`.
        let exports = timed(
            &mut store,
            &limits.clock,
            limits.configure_deadline,
            |store| match pre {
                Pre::Policy { pre, core, scope } => {
                    let instance = pre.instantiate(&mut *store)?;
                    let policy = core.load(&mut *store, &instance)?;
                    let scope = scope
                        .as_ref()
                        .map(|s| s.load(&mut *store, &instance))
                        .transpose()?;
                    Ok(Exports::Policy(policy, scope))
                }
                Pre::Telemetry { pre, core, batches } => {
                    let instance = pre.instantiate(&mut *store)?;
                    let telemetry = core.load(&mut *store, &instance)?;
                    let batches = batches
                        .as_ref()
                        .map(|b| b.load(&mut *store, &instance))
                        .transpose()?;
                    Ok(Exports::Telemetry(telemetry, batches))
                }
            },
        )
        .map_err(inst_err)?;
        ctx.counters.instances.inc();
        Ok(Self {
            store,
            exports,
            limits,
            workloads: WorkloadTable::default(),
        })
    }

    /// `configure` of either world; policy plugins return the state they want.
    pub fn configure(
        &mut self,
        config: &str,
    ) -> Result<Result<wit::StateKinds, String>, CallError> {
        let (exports, limits) = (&self.exports, &self.limits);
        let r = timed(
            &mut self.store,
            &limits.clock,
            limits.configure_deadline,
            |store| match exports {
                Exports::Policy(p, _) => p.weft_plugin_policy().call_configure(store, config),
                Exports::Telemetry(t, _) => t
                    .weft_plugin_telemetry()
                    .call_configure(store, config)
                    .map(|r| r.map(|()| wit::StateKinds::empty())),
            },
        );
        r.map_err(|e| classify(e, &self.store))
    }

    /// `update-state` (policy world only; telemetry ignores state).
    pub fn update_state(
        &mut self,
        update: &wit::StateUpdate,
    ) -> Result<Result<(), String>, CallError> {
        let Exports::Policy(p, _) = &self.exports else {
            return Ok(Ok(()));
        };
        let limits = &self.limits;
        timed(
            &mut self.store,
            &limits.clock,
            limits.configure_deadline,
            |store| p.weft_plugin_policy().call_update_state(store, update),
        )
        .map_err(|e| classify(e, &self.store))
    }

    /// `authorize`. An oversized deny reason is a failure (`bad_output`).
    pub fn authorize(
        &mut self,
        conn: &weft_hooks::ConnectionRecord,
    ) -> Result<wit::Decision, CallError> {
        let Exports::Policy(p, _) = &self.exports else {
            return Ok(wit::Decision::Allow);
        };
        let wit_conn = crate::convert::connection(conn);
        let table_err = |e: wasmtime::component::ResourceTableError| CallError {
            kind: ErrorKind::Trap,
            message: format!("resource table: {e}"),
        };
        let table = &mut self.store.data_mut().table;
        let mut rep = |w: &Option<Arc<weft_hooks::WorkloadMeta>>| match w {
            Some(w) => self.workloads.rep(table, w).map(Some).map_err(table_err),
            None => Ok(None),
        };
        let (src, dst) = (rep(&conn.src_workload)?, rep(&conn.dst_workload)?);
        // Lent as host *borrows*, which wasmtime scopes to the call: the guest cannot keep or drop them, and the
        // entries stay in the table for the next call (handing over own handles instead left one store handle
        // behind per call, and a long-lived instance failed every call after ~50,000).
        let (src, dst) = (
            src.map(Resource::<WorkloadRes>::new_borrow),
            dst.map(Resource::<WorkloadRes>::new_borrow),
        );
        let limits = &self.limits;
        let r = timed(
            &mut self.store,
            &limits.clock,
            limits.call_deadline,
            |store| {
                p.weft_plugin_policy()
                    .call_authorize(store, &wit_conn, src, dst)
            },
        );
        let decision = r.map_err(|e| classify(e, &self.store))?;
        if let wit::Decision::Deny(reason) = &decision
            && reason.len() > self.limits.max_reason_len
        {
            return Err(CallError {
                kind: ErrorKind::BadOutput,
                message: format!(
                    "deny reason of {} bytes exceeds the limit of {}",
                    reason.len(),
                    self.limits.max_reason_len
                ),
            });
        }
        Ok(decision)
    }

    /// `scope` of the optional `authorize-scope` export: `None` when the component does not export it (or is not a
    /// policy plugin).
    pub fn scope(&mut self) -> Result<Option<wit::ConnectionScope>, CallError> {
        let Exports::Policy(_, Some(s)) = &self.exports else {
            return Ok(None);
        };
        let limits = &self.limits;
        timed(
            &mut self.store,
            &limits.clock,
            limits.configure_deadline,
            |store| s.weft_plugin_authorize_scope().call_scope(store),
        )
        .map(Some)
        .map_err(|e| classify(e, &self.store))
    }

    /// Hands a batch to a telemetry plugin: through `telemetry-batches.on-batch` when it exports it, else through
    /// `telemetry.on-events` (the caller merges opens and closes only when every plugin takes batches; an
    /// `opened-closed` found anyway is handed over as its open and its close).
    pub fn on_batch(&mut self, batch: &crate::batch::Batch<'_>) -> Result<(), CallError> {
        let Exports::Telemetry(t, batches) = &self.exports else {
            return Ok(());
        };
        let limits = &self.limits;
        let r = match batches {
            Some(b) => timed(
                &mut self.store,
                &limits.clock,
                limits.call_deadline,
                |store| {
                    b.weft_plugin_telemetry_batches().call_on_batch(
                        store,
                        batch.workloads,
                        batch.strings,
                        batch.events,
                    )
                },
            ),
            None => {
                let plain = crate::batch::plain_events(batch);
                timed(
                    &mut self.store,
                    &limits.clock,
                    limits.call_deadline,
                    |store| {
                        t.weft_plugin_telemetry()
                            .call_on_events(store, batch.workloads, &plain)
                    },
                )
            }
        };
        r.map_err(|e| classify(e, &self.store))
    }
}

/// Runs one guest call under `budget`: the store's deadline is set from it, and the call is counted on `clock`
/// while it runs so the epoch ticker ticks (and can interrupt it).
fn timed<R>(
    store: &mut Store<StoreData>,
    clock: &EpochClock,
    budget: Duration,
    call: impl FnOnce(&mut Store<StoreData>) -> R,
) -> R {
    let ticks = store.data_mut().budget.start(budget);
    store.set_epoch_deadline(ticks);
    clock.enter();
    let r = call(store);
    clock.exit();
    r
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test code: a panic fails the test

    use super::*;

    /// A key names one metadata `Arc` for as long as it is cached, and no key is ever given twice.
    #[test]
    fn every_workload_entry_gets_a_key_never_given_before_in_the_instance() {
        let mut table = wasmtime::component::ResourceTable::new();
        let mut cache = WorkloadTable::default();
        let mut key = |w: &Arc<weft_hooks::WorkloadMeta>| {
            let rep = cache.rep(&mut table, w).unwrap();
            table
                .get(&Resource::<WorkloadRes>::new_own(rep))
                .unwrap()
                .key
        };
        let a = crate::testing::workload("a", "ns", "sa");
        let ka = key(&a);
        assert_eq!(
            key(&a),
            ka,
            "the same metadata, still cached, keeps its key"
        );
        // A changed workload is another Arc: another key, even with equal contents.
        let a2 = Arc::new((*a).clone());
        let ka2 = key(&a2);
        assert_ne!(ka2, ka);
        let mut seen = std::collections::HashSet::from([ka, ka2]);
        for i in 0..WORKLOAD_CACHE {
            let w = crate::testing::workload(&format!("w{i}"), "ns", "sa");
            assert!(seen.insert(key(&w)), "workload {i} got a key given before");
        }
        // `a` was evicted: lent again, it gets a key never given before (its old one names nothing now).
        assert!(
            seen.insert(key(&a)),
            "an evicted workload came back with an old key"
        );
    }

    /// A cached workload keeps its rep; past the cap the oldest entry leaves the cache *and* the table, so the
    /// table never holds more than the cap however many workloads pass.
    #[test]
    fn the_workload_cache_reuses_entries_and_evicts_the_least_recently_used_from_the_table() {
        let mut table = wasmtime::component::ResourceTable::new();
        let mut cache = WorkloadTable::default();
        let ws: Vec<_> = (0..WORKLOAD_CACHE + 5)
            .map(|i| crate::testing::workload(&format!("w{i}"), "ns", "sa"))
            .collect();
        let first = cache.rep(&mut table, &ws[0]).unwrap();
        assert_eq!(cache.rep(&mut table, &ws[0]).unwrap(), first);
        let reps: Vec<u32> = ws
            .iter()
            .map(|w| cache.rep(&mut table, w).unwrap())
            .collect();
        assert_eq!(reps[0], first);
        assert_eq!(cache.entries.len(), WORKLOAD_CACHE);
        // The five oldest were evicted: deleted from the table (their slots may hold newer entries since), the
        // rest readable and naming their workload.
        for (i, rep) in reps.iter().enumerate() {
            let name = table
                .get(&Resource::<WorkloadRes>::new_own(*rep))
                .map(|w| w.meta.name.clone());
            if i < 5 {
                assert_ne!(
                    name.ok(),
                    Some(format!("w{i}")),
                    "entry {i} should have been deleted"
                );
            } else {
                assert_eq!(name.unwrap(), format!("w{i}"));
            }
        }
        // An evicted workload comes back as a new entry.
        let again = cache.rep(&mut table, &ws[0]).unwrap();
        assert_eq!(
            table
                .get(&Resource::<WorkloadRes>::new_own(again))
                .unwrap()
                .meta
                .name,
            "w0"
        );
        assert_eq!(cache.entries.len(), WORKLOAD_CACHE);
    }
}
