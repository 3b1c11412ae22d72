//! The rollout thread and the swap back: judges probations (woken by the call that crossed a threshold, and
//! once a second for windows that ended), restores the previous version in one chain swap, counts, logs and
//! reports the rollback, and refuses the rolled-back version from then on.

use std::sync::{Arc, mpsc};
use std::time::Duration;

use weft_state::PluginKind;

use super::chain::Chain;
use super::enforce::Unenforced;
use super::plugins::{Applied, Plugins};
use super::rollout::{Refusal, RollbackEvent};
use crate::versions::probation::Wake;
use crate::versions::version::PluginVersion;
use crate::wit::bindings::types as wit;

/// How often the thread looks for windows that ended with no call to notice.
const SWEEP: Duration = Duration::from_secs(1);

/// Starts the rollout thread: it judges the probations of `plugins` when woken and once a [`SWEEP`], and ends on
/// [`Wake::Stop`].
pub(crate) fn start_thread(
    plugins: Arc<Plugins>,
    woken: mpsc::Receiver<Wake>,
) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("weft-plugin-rollout".into())
        .spawn(move || {
            loop {
                match woken.recv_timeout(SWEEP) {
                    Ok(Wake::Stop) | Err(mpsc::RecvTimeoutError::Disconnected) => return,
                    Ok(Wake::Check) | Err(mpsc::RecvTimeoutError::Timeout) => {
                        plugins.check();
                    }
                }
            }
        })?;
    Ok(())
}

impl Plugins {
    /// Rebuilds the data path's chain and the plugin metric sets from `applied` (serving versions, and rejected
    /// specs with nothing serving).
    pub(crate) fn publish(&self, applied: &Applied) {
        let serving: Vec<Arc<PluginVersion>> = applied.serving.values().cloned().collect();
        let broken: Vec<_> = applied
            .rejected
            .iter()
            .filter(|(name, _)| !applied.serving.contains_key(*name))
            .map(|(_, (spec, reason))| (spec.clone(), reason.clone()))
            .collect();
        let unenforced = (!self.loading.allow_unenforced_policies)
            .then(|| Unenforced::build(&applied.policies, self.metrics.unenforced_denials.clone()))
            .flatten()
            .map(Arc::new);
        let mut chain = Chain::build(&serving, &broken, unenforced);
        let shadows = applied
            .shadows
            .iter()
            .filter(|(name, _)| applied.serving.contains_key(*name));
        chain.shadows = shadows
            .clone()
            .filter(|(_, s)| s.version.spec.kind == PluginKind::Policy)
            .map(|(_, s)| s.clone())
            .collect();
        let telemetry_shadows: Vec<Arc<PluginVersion>> = shadows
            .clone()
            .filter(|(_, s)| s.version.spec.kind == PluginKind::Telemetry)
            .map(|(_, s)| s.version.clone())
            .collect();
        chain.telemetry_shadows = telemetry_shadows.clone();
        if !chain.shadows.is_empty() {
            chain.shadow_queue = Some(self.loading.shadow_queue.clone());
        }
        self.chain.store(Arc::new(chain));
        self.hub.publish(
            applied
                .serving
                .iter()
                .map(|(n, v)| (n.as_str(), &v.ctx.metrics)),
        );
        self.shadow_hub.publish(
            telemetry_shadows
                .iter()
                .map(|v| (v.spec.name.as_str(), &v.ctx.metrics)),
        );
    }

    /// Rolls back every probation that fired and ends every one whose window passed.
    pub(crate) fn check(&self) -> Vec<RollbackEvent> {
        let now = self.loading.clock.now();
        let mut applied = self.lock();
        let mut events = Vec::new();
        let names: Vec<String> = applied.rollout.probations.keys().cloned().collect();
        for name in names {
            let Some(p) = applied.rollout.probations.get(&name) else {
                continue;
            };
            let current_is_it = applied.serving.get(&name).is_some_and(|v| {
                v.probation
                    .get()
                    .is_some_and(|q| Arc::ptr_eq(q, &p.probation))
            });
            if !current_is_it {
                applied.rollout.probations.remove(&name);
                continue;
            }
            if p.probation.fired() {
                if let Some(e) = self.roll_back(&mut applied, &name, now) {
                    events.push(e);
                }
            } else if p.probation.expired(now) {
                tracing::info!(plugin = %name, "plugin version passed probation");
                applied.rollout.probations.remove(&name);
            }
        }
        if !events.is_empty() {
            self.publish(&applied);
            let recheck = events.iter().any(|e| {
                applied
                    .serving
                    .get(&e.plugin)
                    .is_some_and(|v| v.spec.kind == PluginKind::Policy && v.spec.recheck)
            });
            drop(applied);
            if recheck {
                self.changes.send_modify(|v| *v += 1);
            }
            for e in &events {
                let _ = self.rollbacks.send(e.clone());
            }
        }
        events
    }

    fn roll_back(&self, applied: &mut Applied, name: &str, now: Duration) -> Option<RollbackEvent> {
        let on = applied.rollout.probations.remove(name)?;
        let failed = applied.serving.get(name)?.clone();
        let mut previous = on.previous;
        // The policies may have changed since the swap: hand the restored version today's.
        if previous
            .wants
            .contains(wit::StateKinds::AUTHORIZATION_POLICIES)
            && !previous
                .state
                .as_ref()
                .is_some_and(|s| Arc::ptr_eq(s, &applied.policy_state))
        {
            match previous.with_state(&applied.policy_state) {
                Ok(v) => previous = Arc::new(v),
                Err(e) => tracing::warn!(plugin = %name, error = %e,
                    "restored plugin version refused the current policies; it serves with the ones it had"),
            }
        }
        let event = RollbackEvent::new(name, &on.probation, &failed.sha256, &previous.sha256, now);
        let reason = event.reason();
        tracing::error!(
            plugin = %name,
            rolled_back = %failed.sha256,
            restored = %previous.sha256,
            calls = event.calls,
            failures = event.failures,
            traps = event.traps,
            timeouts = event.timeouts,
            after = ?event.after,
            max_failure_ratio = event.max_failure_ratio,
            "plugin version rolled back"
        );
        self.metrics.rollback(name);
        applied.rollout.refused.insert(
            name.to_string(),
            Refusal {
                sha256: failed.sha256.clone(),
                // Same code as the restored version: only this config is refused.
                config: (failed.sha256 == previous.sha256).then(|| failed.spec.config.clone()),
                event: event.clone(),
            },
        );
        applied
            .rejected
            .insert(name.to_string(), (failed.spec.clone(), reason));
        applied.serving.insert(name.to_string(), previous);
        Some(event)
    }
}
