//! A plugin version: its spec, its linked component, the config and control-plane state it was configured with,
//! and its pool of configured instances. Immutable once serving: a new config, code or state makes a new version.

use std::sync::{Arc, OnceLock};
use std::time::{Instant, SystemTime};

use weft_hooks::{ConnectionRecord, Verdict};
use weft_state::{FailurePolicy, PluginKind, PluginSource, PluginSpec};

use wasmtime::Engine;

use super::cache::{CompileCache, sha256_hex};
use super::factory::Factory;
use super::pool::{Pool, PoolStatus};
use super::probation::{CallOutcome, Probation};
use super::scope::Scope;
use crate::base::error::{CallError, ErrorKind, LoadError};
use crate::guest::instance::{Instance, Limits};
use crate::guest::link::{Pre, link};
use crate::sandbox::limiter::LogLimiter;
use crate::sandbox::store::PluginCtx;
use crate::wit::batch::Batch;
use crate::wit::bindings::types as wit;

/// Instances a telemetry plugin's pool keeps (at most; fewer when the host is configured to pre-warm fewer). One
/// thread calls telemetry plugins, the host's telemetry thread, one batch at a time: an instance for it and a spare
/// that the next batch finds ready when a call traps and its instance is thrown away, while the refill thread
/// replaces it. (Sized like a policy plugin's pool, for every data-path thread twice over, a node kept ten, each
/// with its linear memory and its host-side state resident for nothing.)
const TELEMETRY_INSTANCES: usize = 2;

/// The authorization policies in WIT form, shared by every version that wants them.
pub(crate) type PolicyState = Arc<Vec<wit::AuthorizationPolicy>>;

/// How the instances of every version are made and how many a version keeps: the same for all plugins (from the
/// host config).
#[derive(Clone)]
pub(crate) struct InstanceSettings {
    /// The engine instances are created in.
    pub engine: Engine,
    /// The sandbox limits and deadlines of every instance, and the epoch clock their calls are timed by.
    pub limits: Limits,
    /// Instances created when a version loads, and kept by its refill (telemetry plugins: at most
    /// [`TELEMETRY_INSTANCES`]).
    pub prewarm: usize,
    /// Idle instances a version keeps at most.
    pub max_idle: usize,
    /// [`crate::HostConfig::release_memory`], for the refill thread.
    pub release_memory: Option<fn()>,
}

/// A spec's code, checked and linked: ready to instantiate.
pub(crate) struct Code {
    pub sha256: String,
    pub pre: Pre,
}

/// A loaded, configured plugin version.
pub(crate) struct PluginVersion {
    pub spec: Arc<PluginSpec>,
    pub sha256: String,
    pub loaded_at: SystemTime,
    pub wants: wit::StateKinds,
    /// The state this version was configured with (only when it wants it).
    pub state: Option<PolicyState>,
    pub ctx: Arc<PluginCtx>,
    /// Which connections this version is asked about (policy plugins; `All` for telemetry).
    pub scope: Scope,
    pre: Pre,
    settings: InstanceSettings,
    /// The configured instances, refilled in the background.
    pool: Arc<Pool>,
    /// Rate limit for the host's own warnings about this plugin (failures, denials).
    pub warn_limiter: LogLimiter,
    /// Set when this version replaced a serving one and is on probation (counted on every call until it ends).
    pub probation: OnceLock<Arc<Probation>>,
}

impl Drop for PluginVersion {
    fn drop(&mut self) {
        self.pool.close();
    }
}

/// Reads the code of a spec.
pub(crate) fn read_source(spec: &PluginSpec) -> Result<Arc<Vec<u8>>, LoadError> {
    match &spec.source {
        PluginSource::Inline(bytes) => Ok(bytes.clone()),
        PluginSource::Path(p) => std::fs::read(p)
            .map(Arc::new)
            .map_err(|source| LoadError::Read {
                path: p.display().to_string(),
                source,
            }),
    }
}

/// Reads a spec's code, checks its sha256, compiles it (through `cache`) and links it for its world.
pub(crate) fn compile(
    spec: &PluginSpec,
    cache: &CompileCache,
    engine: &Engine,
) -> Result<Code, LoadError> {
    let bytes = read_source(spec)?;
    let sha = sha256_hex(&bytes);
    if let Some(expected) = &spec.sha256
        && !expected.trim().eq_ignore_ascii_case(&sha)
    {
        return Err(LoadError::Sha256Mismatch {
            expected: expected.trim().to_ascii_lowercase(),
            actual: sha,
        });
    }
    let component = cache.get(&sha, &bytes)?;
    let pre = link(engine, &component, spec.kind)?;
    Ok(Code { sha256: sha, pre })
}

impl PluginVersion {
    /// Loads compiled `code` of `spec`: instantiates and configures the pre-warmed instances (at least
    /// `instances`: what the previous version of this plugin grew to) and hands them the state. Any failure rejects
    /// the version. Runs on the caller's (apply) thread, never the data path.
    pub fn load(
        spec: Arc<PluginSpec>,
        code: Code,
        ctx: Arc<PluginCtx>,
        policies: &PolicyState,
        instances: usize,
        settings: &InstanceSettings,
    ) -> Result<Self, LoadError> {
        Self::prewarm(settings, spec, code, ctx, Some(policies.clone()), instances)
    }

    /// The same code and config with new control-plane state (a new version; the old one keeps serving until
    /// this one is swapped in).
    pub fn with_state(&self, policies: &PolicyState) -> Result<Self, LoadError> {
        let code = Code {
            sha256: self.sha256.clone(),
            pre: self.pre.clone(),
        };
        let v = Self::prewarm(
            &self.settings,
            self.spec.clone(),
            code,
            self.ctx.clone(),
            Some(policies.clone()),
            self.pool.target(),
        )?;
        // Same code and config: its probation carries on.
        if let Some(p) = self.probation.get() {
            let _ = v.probation.set(p.clone());
        }
        Ok(v)
    }

    /// Creates, configures and parks the pre-warmed instances (the first one tells what state the plugin wants),
    /// then starts the pool's refill thread.
    fn prewarm(
        settings: &InstanceSettings,
        spec: Arc<PluginSpec>,
        code: Code,
        ctx: Arc<PluginCtx>,
        policies: Option<PolicyState>,
        instances: usize,
    ) -> Result<Self, LoadError> {
        let Code { sha256, pre } = code;
        let mut factory = Factory {
            engine: settings.engine.clone(),
            pre: pre.clone(),
            ctx: ctx.clone(),
            limits: settings.limits.clone(),
            config: spec.config.clone(),
            state: None,
        };
        let (mut first, wants) = factory.configured()?;
        let state = if wants.contains(wit::StateKinds::AUTHORIZATION_POLICIES) {
            policies
        } else {
            None
        };
        if let Some(state) = &state {
            Factory::push_state(&mut first, state)?;
        }
        // Asked once, of the configured instance with the state: every instance of this version has the same
        // config and state, so the same scope.
        let scope = Scope::declared(first.scope().map_err(|error| LoadError::Call {
            stage: "authorize-scope",
            error,
        })?);
        if scope != Scope::All {
            tracing::debug!(plugin = %spec.name, scope = %scope.describe(), "policy plugin is asked only about connections in its scope");
        }
        factory.state = state.clone();
        let wanted = settings.prewarm.max(instances);
        let wanted = match spec.kind {
            PluginKind::Policy => wanted,
            PluginKind::Telemetry => wanted.min(TELEMETRY_INSTANCES),
        };
        // A policy version whose scope takes in no connection is never called on the data path: one configured
        // instance (kept for what the host asks outside calls) is all it needs. New state makes a new version,
        // which asks for its scope again and gets the full pool when that takes in connections.
        let target = if scope.is_empty() {
            1
        } else {
            wanted.clamp(1, settings.max_idle.max(1))
        };
        let mut idle = vec![first];
        for _ in 1..target {
            idle.push(factory.create()?);
        }
        let pool = Pool::start(
            factory,
            idle,
            target,
            settings.max_idle,
            settings.release_memory,
        )?;
        Ok(PluginVersion {
            spec,
            sha256,
            loaded_at: SystemTime::now(),
            wants,
            state,
            ctx,
            scope,
            pre,
            settings: settings.clone(),
            pool,
            warn_limiter: LogLimiter::new(5),
            probation: OnceLock::new(),
        })
    }

    /// A new instance, configured and given this version's state, created on the caller's thread (benchmarks).
    fn new_instance(&self) -> Result<Instance, LoadError> {
        Factory {
            engine: self.settings.engine.clone(),
            pre: self.pre.clone(),
            ctx: self.ctx.clone(),
            limits: self.settings.limits.clone(),
            config: self.spec.config.clone(),
            state: self.state.clone(),
        }
        .create()
    }

    /// How many instances this version's pool keeps.
    pub fn pool_target(&self) -> usize {
        self.pool.target()
    }

    /// The pool's state (status).
    pub fn pool_status(&self) -> PoolStatus {
        self.pool.status()
    }

    /// Runs a call on a pooled instance: an instance whose call failed is thrown away (and replaced in the
    /// background); with no idle instance the call fails at once (`no_instance`).
    fn with_instance<T>(
        &self,
        call: impl FnOnce(&mut Instance) -> Result<T, CallError>,
    ) -> Result<T, CallError> {
        let mut inst = self.pool.checkout()?;
        let r = call(&mut inst);
        if r.is_ok() {
            self.pool.checkin(inst);
        } else {
            self.pool.discard(inst);
        }
        r
    }

    /// Runs `authorize` on a pooled instance; failures apply the failure policy.
    pub fn authorize(&self, conn: &ConnectionRecord) -> Verdict {
        let started = Instant::now();
        let result = self.with_instance(|inst| inst.authorize(conn));
        self.finish(conn, started, result)
    }

    /// Runs `authorize` on a pooled instance and returns what the plugin decided, a failure as it is (a shadow
    /// version: no failure policy, no probation). A connection outside the declared scope is allowed without a call.
    pub fn decide(&self, conn: &ConnectionRecord) -> Result<Verdict, CallError> {
        if !self.scope.covers(conn) {
            return Ok(Verdict::Allow);
        }
        let started = Instant::now();
        let result = self.with_instance(|inst| inst.authorize(conn));
        let c = &self.ctx.counters;
        c.calls.inc();
        c.latency.observe(started.elapsed().as_secs_f64());
        match result {
            Ok(wit::Decision::Allow) => Ok(Verdict::Allow),
            Ok(wit::Decision::Deny(reason)) => {
                c.denials.inc();
                Ok(Verdict::Deny {
                    by: self.spec.name.clone(),
                    reason,
                })
            }
            Err(e) => {
                c.error(e.kind).inc();
                Err(e)
            }
        }
    }

    /// Runs `authorize` on a brand-new instance (benchmarks and tests: what reuse saves).
    pub fn authorize_fresh(&self, conn: &ConnectionRecord) -> Verdict {
        let started = Instant::now();
        let result = self
            .new_instance()
            .map_err(|e| CallError {
                kind: ErrorKind::Instantiate,
                message: e.to_string(),
            })
            .and_then(|mut inst| inst.authorize(conn));
        self.finish(conn, started, result)
    }

    fn finish(
        &self,
        conn: &ConnectionRecord,
        started: Instant,
        result: Result<wit::Decision, CallError>,
    ) -> Verdict {
        let c = &self.ctx.counters;
        c.calls.inc();
        c.latency.observe(started.elapsed().as_secs_f64());
        self.record(&result);
        match result {
            Ok(wit::Decision::Allow) => Verdict::Allow,
            Ok(wit::Decision::Deny(reason)) => {
                c.denials.inc();
                Verdict::Deny {
                    by: self.spec.name.clone(),
                    reason,
                }
            }
            Err(e) => {
                c.error(e.kind).inc();
                let fail_open = self.spec.failure_policy == FailurePolicy::FailOpen;
                if self.warn_limiter_allows() {
                    tracing::warn!(
                        plugin = %self.spec.name,
                        conn = conn.id,
                        error = %e,
                        applied = if fail_open { "fail-open: allow" } else { "fail-closed: deny" },
                        "policy plugin call failed"
                    );
                }
                if fail_open {
                    Verdict::Allow
                } else {
                    Verdict::Deny {
                        by: self.spec.name.clone(),
                        reason: format!("plugin failed ({}): {}", e.kind.as_str(), e.message),
                    }
                }
            }
        }
    }

    /// Counts a call for this version's probation, if it is on one.
    fn record<T>(&self, result: &Result<T, CallError>) {
        if let Some(p) = self.probation.get() {
            p.record(match result {
                Ok(_) => CallOutcome::Ok,
                Err(e) => CallOutcome::Failed(e.kind),
            });
        }
    }

    pub fn warn_limiter_allows(&self) -> bool {
        self.warn_limiter.allow()
    }

    /// Hands a batch to a telemetry plugin; a failure drops the batch (counted).
    pub fn on_batch(&self, batch: &Batch<'_>) {
        let started = Instant::now();
        let c = &self.ctx.counters;
        c.calls.inc();
        let result = self.with_instance(|inst| inst.on_batch(batch));
        c.latency.observe(started.elapsed().as_secs_f64());
        self.record(&result);
        if let Err(e) = result {
            c.error(e.kind).inc();
            if self.warn_limiter_allows() {
                tracing::warn!(plugin = %self.spec.name, events = batch.events.len(), error = %e,
                    "telemetry plugin call failed; batch dropped");
            }
        }
    }

    /// Whether this telemetry plugin takes merged batches (it exports `telemetry-batches`).
    pub fn takes_batches(&self) -> bool {
        self.pre.takes_batches()
    }

    /// Whether this plugin applies to a connection (direction for policy plugins, and the workload selector on
    /// the connection's local workload: destination inbound, source outbound).
    pub fn selects(&self, conn: &ConnectionRecord) -> bool {
        selects(&self.spec, conn)
    }
}

/// See [`PluginVersion::selects`]. An empty selector selects everything; a non-empty one needs a known local
/// workload.
pub(crate) fn selects(spec: &PluginSpec, conn: &ConnectionRecord) -> bool {
    let sel = &spec.selector;
    if sel.namespaces.is_empty() && sel.workloads.is_empty() {
        return true;
    }
    let local = match conn.direction {
        weft_hooks::Direction::Inbound => conn.dst_workload.as_deref(),
        weft_hooks::Direction::Outbound => conn.src_workload.as_deref(),
    };
    let Some(w) = local else {
        return false;
    };
    (sel.namespaces.is_empty() || sel.namespaces.contains(&w.namespace))
        && (sel.workloads.is_empty() || sel.workloads.iter().any(|n| *n == w.name || *n == w.uid))
}
