//! Reconciling the plugin set with the config: load new or changed specs off the data path, keep unchanged ones,
//! hand changed control-plane state to the plugins that want it, drop removed ones, then swap the chain in one
//! step. A spec that fails at any step is rejected with its reason while the previous version keeps serving.

use std::collections::BTreeMap;
use std::sync::Arc;

use weft_state::{PluginKind, PluginSpec, Policy};

use super::plugins::{Applied, Plugins};
use super::report::{AppliedVersion, ApplyReport, Outcome, PluginOutcome};
use super::rollout::OnProbation;
use super::shadow::Shadow;
use crate::base::error::LoadError;
use crate::sandbox::store::PluginCtx;
use crate::versions::cache::sha256_hex;
use crate::versions::probation::Probation;
use crate::versions::version::{PluginVersion, PolicyState, compile, read_source};
use crate::wit::bindings::types as wit;
use crate::wit::convert;

impl Plugins {
    /// Reconciles the plugins with `specs` and hands `policies` to the policy plugins that want them, then swaps
    /// the chain; the outcome is published on `reports` under `version` (or the last one). Blocking; serialized.
    pub fn apply(
        &self,
        version: Option<u64>,
        specs: &[Arc<PluginSpec>],
        policies: &[Arc<Policy>],
    ) -> ApplyReport {
        let mut applied = self.lock();
        let policies_changed = applied.generation == 0
            || applied.policies.len() != policies.len()
            || applied
                .policies
                .iter()
                .zip(policies)
                .any(|(a, b)| **a != **b);
        if policies_changed {
            applied.policy_state = Arc::new(policies.iter().map(|p| convert::policy(p)).collect());
            applied.policies = policies.to_vec();
        }
        applied.generation += 1;
        let state = applied.policy_state.clone();

        let mut report = ApplyReport::default();
        let mut recheck = false;
        let mut next: BTreeMap<String, Arc<PluginVersion>> = BTreeMap::new();
        let mut wanted: BTreeMap<String, Arc<PluginSpec>> = BTreeMap::new();
        for spec in specs {
            let name = spec.name.clone();
            if wanted.contains_key(&name) {
                report.plugins.push(PluginOutcome {
                    name,
                    outcome: Outcome::Rejected {
                        reason: "duplicate plugin name in the config".into(),
                        still_serving: None,
                    },
                });
                continue;
            }
            wanted.insert(name.clone(), spec.clone());
            let current = applied.serving.get(&name).cloned();
            // Same spec, and for a file source the same bytes in the file (a rebuilt plugin at the same path is
            // a new version).
            let unchanged_spec = current
                .as_ref()
                .is_some_and(|c| same_serving(&c.spec, spec) && same_code(c, spec));
            let wants_state =
                |v: &PluginVersion| v.wants.contains(wit::StateKinds::AUTHORIZATION_POLICIES);
            let refused = if unchanged_spec {
                None
            } else {
                self.refusal(&applied, spec)
            };
            let result = match &current {
                _ if refused.is_some() => Err(refused.clone().unwrap_or_default()),
                Some(cur) if unchanged_spec && !(policies_changed && wants_state(cur)) => {
                    Ok::<_, String>((cur.clone(), Outcome::Unchanged))
                }
                Some(cur) if unchanged_spec => cur
                    .with_state(&state)
                    .map(|v| (Arc::new(v), Outcome::StateUpdated))
                    .map_err(|e| e.to_string()),
                _ => self
                    .load(
                        spec,
                        &state,
                        current.as_ref().map_or(0, |c| c.pool_target()),
                    )
                    .map(|v| {
                        let sha = v.sha256.clone();
                        (Arc::new(v), Outcome::Loaded { sha256: sha })
                    })
                    .map_err(|e| e.to_string()),
            };
            match result {
                Ok((version, outcome)) => {
                    if outcome != Outcome::Unchanged {
                        self.metrics.load(&name, "loaded");
                        tracing::info!(plugin = %name, sha256 = %version.sha256, ?outcome, "plugin serving");
                        if version.spec.kind == PluginKind::Policy && version.spec.recheck {
                            recheck = true;
                        }
                    }
                    applied.rejected.remove(&name);
                    if let Outcome::Loaded { sha256 } = &outcome {
                        self.start_probation(
                            &mut applied,
                            &name,
                            &version,
                            current.as_ref(),
                            sha256,
                        );
                    }
                    next.insert(name.clone(), version);
                    report.plugins.push(PluginOutcome { name, outcome });
                }
                Err(reason) => {
                    self.metrics.load(&name, "rejected");
                    let still_serving = current.as_ref().map(|c| c.sha256.clone());
                    // The one log line for a rejection (callers read the report and do not log it again): a
                    // warning while the previous version keeps serving, an error when nothing serves for the name
                    // (fail-closed: what it selects is denied; fail-open: it is skipped).
                    match &still_serving {
                        Some(sha) => tracing::warn!(
                            plugin = %name,
                            %reason,
                            still_serving = %sha,
                            "plugin rejected"
                        ),
                        None => tracing::error!(
                            plugin = %name,
                            %reason,
                            still_serving = "nothing",
                            failure_policy = ?spec.failure_policy,
                            "plugin rejected"
                        ),
                    }
                    if let Some(cur) = current {
                        next.insert(name.clone(), cur);
                    } else if spec.kind == PluginKind::Policy && spec.recheck {
                        recheck = true;
                    }
                    applied
                        .rejected
                        .insert(name.clone(), (spec.clone(), reason.clone()));
                    report.plugins.push(PluginOutcome {
                        name,
                        outcome: Outcome::Rejected {
                            reason,
                            still_serving,
                        },
                    });
                }
            }
        }
        for name in applied.serving.keys() {
            if !wanted.contains_key(name) {
                report.plugins.push(PluginOutcome {
                    name: name.clone(),
                    outcome: Outcome::Removed,
                });
                self.hub.remove(name);
                tracing::info!(plugin = %name, "plugin removed");
            }
        }
        applied.rejected.retain(|name, _| wanted.contains_key(name));
        // A removed plugin's probation and refusal go with it (a removal is the control plane's decision).
        applied
            .rollout
            .probations
            .retain(|name, _| wanted.contains_key(name));
        applied
            .rollout
            .refused
            .retain(|name, _| wanted.contains_key(name));
        self.reconcile_shadows(&mut applied, &next, &wanted, &state, policies_changed);
        applied.serving = next;
        applied.specs = wanted;
        // The chain and the plugin metrics: exactly the serving versions (a replaced or removed version's series
        // go).
        self.publish(&applied);
        if recheck {
            self.changes.send_modify(|v| *v += 1);
        }
        report.recheck = recheck;
        report.plugins.sort_by(|a, b| a.name.cmp(&b.name));
        let state_version = version.unwrap_or_else(|| self.reports.borrow().state_version);
        self.reports.send_replace(Arc::new(AppliedVersion {
            state_version,
            report: report.clone(),
        }));
        report
    }

    /// Loads, keeps or drops the shadow version of every serving plugin as its spec says (a policy plugin's decides
    /// beside it; a telemetry plugin's gets the same events, its metrics in the shadow hub). A shadow that fails to
    /// load is reported (`shadow_report`) and logged; the serving version is not affected.
    fn reconcile_shadows(
        &self,
        applied: &mut Applied,
        serving: &BTreeMap<String, Arc<PluginVersion>>,
        wanted: &BTreeMap<String, Arc<PluginSpec>>,
        state: &PolicyState,
        policies_changed: bool,
    ) {
        let book = &self.loading.shadow_book;
        let mut next: BTreeMap<String, Arc<Shadow>> = BTreeMap::new();
        for (name, version) in serving {
            let Some(spec) = wanted.get(name) else {
                continue;
            };
            let Some(shadow) = spec.shadow.as_ref() else {
                continue;
            };
            let telemetry = spec.kind == PluginKind::Telemetry;
            let current = applied.shadows.get(name);
            let keep = current.is_some_and(|c| {
                *c.spec == **shadow
                    && !(policies_changed
                        && c.version
                            .wants
                            .contains(wit::StateKinds::AUTHORIZATION_POLICIES))
            });
            if keep && let Some(c) = current {
                next.insert(name.clone(), c.clone());
                continue;
            }
            let shadow_spec = Arc::new(PluginSpec {
                source: shadow.source.clone(),
                sha256: shadow.sha256.clone(),
                config: shadow.config.clone(),
                rollout: None,
                shadow: None,
                ..(**spec).clone()
            });
            let instances = version.pool_target().min(2);
            // A telemetry shadow's metrics keep the plugin's name, in a hub of their own.
            let loaded = if telemetry {
                self.load_into(&shadow_spec, name, &self.shadow_hub, state, instances)
            } else {
                self.load_as(&shadow_spec, &format!("{name}.shadow"), state, instances)
            };
            match loaded {
                Ok(v) => {
                    let same_code = current
                        .is_some_and(|c| c.version.sha256 == v.sha256 && *c.spec == **shadow);
                    if !same_code {
                        book.start(name, Some(v.sha256.clone()), None);
                    }
                    tracing::info!(plugin = %name, sha256 = %v.sha256, "shadow version loaded (never enforced)");
                    next.insert(
                        name.clone(),
                        Arc::new(Shadow::new(
                            name,
                            shadow.clone(),
                            Arc::new(v),
                            &self.metrics,
                        )),
                    );
                }
                Err(e) => {
                    tracing::warn!(plugin = %name, reason = %e, "shadow version rejected");
                    book.start(name, None, Some(e.to_string()));
                }
            }
        }
        for name in applied.shadows.keys() {
            if !next.contains_key(name) {
                self.hub.remove(&format!("{name}.shadow"));
                self.shadow_hub.remove(name);
            }
        }
        for name in book.plugins() {
            let has_shadow = wanted
                .get(&name)
                .is_some_and(|s| s.shadow.is_some() && serving.contains_key(&name));
            if !has_shadow {
                book.forget(&name);
            }
        }
        applied.shadows = next;
    }

    /// Why `spec` is refused after a rollback of the same version, if it is.
    fn refusal(&self, applied: &Applied, spec: &PluginSpec) -> Option<String> {
        let refusal = applied.rollout.refused.get(&spec.name)?;
        let bytes = read_source(spec).ok()?;
        let sha = sha256_hex(&bytes);
        refusal
            .refuses(&sha, &spec.config)
            .then(|| refusal.event.reason())
    }

    /// Puts a version that replaced a serving one on probation (unless the plugin's rollout is disabled), keeping
    /// the replaced one warm to swap back; a version with other code lifts an earlier refusal.
    fn start_probation(
        &self,
        applied: &mut Applied,
        name: &str,
        version: &Arc<PluginVersion>,
        previous: Option<&Arc<PluginVersion>>,
        sha256: &str,
    ) {
        if applied
            .rollout
            .refused
            .get(name)
            .is_some_and(|r| r.sha256 != sha256)
        {
            applied.rollout.refused.remove(name);
        }
        applied.rollout.probations.remove(name);
        let policy = version.spec.rollout.unwrap_or(self.loading.rollout);
        let Some(previous) = previous else {
            return;
        };
        if policy.disabled || policy.window.is_zero() {
            return;
        }
        let probation = Arc::new(Probation::new(
            policy,
            self.loading.clock.clone(),
            self.wake.clone(),
        ));
        let _ = version.probation.set(probation.clone());
        tracing::info!(plugin = %name, sha256, previous = %previous.sha256, window = ?policy.window,
            max_failure_ratio = policy.max_failure_ratio(), min_calls = policy.min_calls,
            "plugin version on probation");
        applied.rollout.probations.insert(
            name.to_string(),
            OnProbation {
                probation,
                previous: previous.clone(),
            },
        );
    }

    /// Loads a new version of `spec`: compiles and links its code, then makes its context (its metric series) and
    /// its pre-warmed instances.
    fn load(
        &self,
        spec: &Arc<PluginSpec>,
        state: &PolicyState,
        instances: usize,
    ) -> Result<PluginVersion, LoadError> {
        self.load_as(spec, &spec.name, state, instances)
    }

    /// Loads a version of `spec` whose host metrics and plugin metrics go under `series` (a shadow's are apart
    /// from its serving version's).
    fn load_as(
        &self,
        spec: &Arc<PluginSpec>,
        series: &str,
        state: &PolicyState,
        instances: usize,
    ) -> Result<PluginVersion, LoadError> {
        self.load_into(spec, series, &self.hub, state, instances)
    }

    /// [`Self::load_as`], its plugin metrics in `hub`.
    fn load_into(
        &self,
        spec: &Arc<PluginSpec>,
        series: &str,
        hub: &Arc<crate::metrics::plugin::MetricsHub>,
        state: &PolicyState,
        instances: usize,
    ) -> Result<PluginVersion, LoadError> {
        let loading = &self.loading;
        let code = compile(spec, &loading.cache, &loading.instances.engine)?;
        let ctx = PluginCtx::new(series, spec.kind, &self.metrics, hub, &loading.imports);
        PluginVersion::load(
            spec.clone(),
            code,
            ctx,
            state,
            instances,
            &loading.instances,
        )
    }
}

/// Whether two specs serve the same version (a change of the shadow alone does not touch the serving one).
fn same_serving(current: &PluginSpec, spec: &PluginSpec) -> bool {
    let serving = |s: &PluginSpec| PluginSpec {
        shadow: None,
        ..s.clone()
    };
    serving(current) == serving(spec)
}

fn same_code(current: &PluginVersion, spec: &PluginSpec) -> bool {
    match &spec.source {
        weft_state::PluginSource::Inline(_) => true,
        weft_state::PluginSource::Path(p) => {
            std::fs::read(p).is_ok_and(|bytes| sha256_hex(&bytes) == current.sha256)
        }
    }
}
