//! One sandboxed plugin instance (a `Store` and the world's exports) and the typed calls into it (`configure`,
//! `update-state`, `authorize`, `authorize-scope`, the telemetry batches), each under a deadline. An instance whose
//! call failed is never reused.

use std::sync::Arc;
use std::time::Duration;

use wasmtime::component::Resource;
use wasmtime::{Engine, Store};

use super::failure::{MAX_GUEST_TRANSFER, classify};
use super::link::Pre;
use super::workloads::WorkloadTable;
use crate::base::error::{CallError, ErrorKind};
use crate::sandbox::epoch::EpochClock;
use crate::sandbox::store::{PluginCtx, StoreData};
use crate::wit::batch::Batch;
use crate::wit::bindings::types as wit;
use crate::wit::bindings::{WorkloadRes, batches, policy, scope, telemetry};

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

impl Drop for Instance {
    fn drop(&mut self) {
        self.store.data().ctx.counters.instances.dec();
    }
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
        store.epoch_deadline_callback(crate::sandbox::store::on_deadline);
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
        let wit_conn = crate::wit::convert::connection(conn);
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
    pub fn on_batch(&mut self, batch: &Batch<'_>) -> Result<(), CallError> {
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
                let plain = crate::wit::batch::plain_events(batch);
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
