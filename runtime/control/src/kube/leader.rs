//! Leader election by a `coordination.k8s.io/v1` Lease (`weft-control-leader` in the controller's namespace), as
//! client-go's leaderelection does it: a replica takes the Lease when it is free or its holder has not renewed it
//! for `leaseDurationSeconds` as this replica observed (its own clock, never the holder's timestamps, so clock skew
//! does not matter), renews it every retry period, and steps down when it could not renew for two thirds of the
//! duration. Every write carries the resourceVersion it read: of two replicas racing, one gets 409 Conflict and
//! stays a follower. On a clean stop the leader releases the Lease so another replica takes over at once.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use tokio_util::sync::CancellationToken;

use crate::kube::KubeOptions;

/// The Lease's name.
pub const LEASE: &str = "weft-control-leader";

fn now() -> MicroTime {
    MicroTime(k8s_openapi::jiff::Timestamp::now())
}

/// What this replica last saw of the Lease, and when it saw it change.
#[derive(Debug, Default)]
struct Observed {
    record: Option<(Option<String>, Option<String>)>,
    at: Option<Instant>,
}

fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

/// One try: `Ok(true)` when this replica holds the Lease afterwards.
async fn try_lead(
    api: &Api<Lease>,
    opts: &KubeOptions,
    seen: &mut Observed,
) -> Result<bool, kube::Error> {
    let me = opts.replica.as_str();
    // Rounded up: a Lease saying less than the duration would let another replica take it over while this one,
    // unable to renew, still leads (it steps down only after two thirds of the duration).
    let secs = opts.lease_duration.as_secs() + u64::from(opts.lease_duration.subsec_nanos() > 0);
    let duration = i32::try_from(secs.max(1)).unwrap_or(i32::MAX);
    let Some(mut lease) = api.get_opt(LEASE).await? else {
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(LEASE.into()),
                namespace: Some(opts.namespace.clone()),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(me.into()),
                lease_duration_seconds: Some(duration),
                acquire_time: Some(now()),
                renew_time: Some(now()),
                lease_transitions: Some(0),
                ..Default::default()
            }),
        };
        return match api.create(&PostParams::default(), &lease).await {
            Ok(_) => Ok(true),
            Err(e) if is_conflict(&e) => Ok(false),
            Err(e) => Err(e),
        };
    };
    let spec = lease.spec.clone().unwrap_or_default();
    let holder = spec.holder_identity.clone().filter(|h| !h.is_empty());
    let record = (
        holder.clone(),
        spec.renew_time.as_ref().map(|t| t.0.to_string()),
    );
    if seen.record.as_ref() != Some(&record) {
        seen.record = Some(record);
        seen.at = Some(Instant::now());
    }
    let held_by_other = holder.as_deref().is_some_and(|h| h != me);
    let their_duration = Duration::from_secs(
        u64::try_from(spec.lease_duration_seconds.unwrap_or(duration)).unwrap_or(1),
    );
    if held_by_other && seen.at.is_some_and(|at| at.elapsed() < their_duration) {
        return Ok(false);
    }
    let mut next = spec;
    if holder.as_deref() != Some(me) {
        next.acquire_time = Some(now());
        next.lease_transitions = Some(next.lease_transitions.unwrap_or(0) + 1);
        next.holder_identity = Some(me.into());
    }
    next.lease_duration_seconds = Some(duration);
    next.renew_time = Some(now());
    lease.spec = Some(next);
    match api.replace(LEASE, &PostParams::default(), &lease).await {
        Ok(_) => Ok(true),
        Err(e) if is_conflict(&e) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Give the Lease up (a clean stop): holder cleared, so the next try of another replica takes it.
async fn release(api: &Api<Lease>, opts: &KubeOptions) {
    let Ok(Some(mut lease)) = api.get_opt(LEASE).await else {
        return;
    };
    let Some(spec) = lease.spec.as_mut() else {
        return;
    };
    if spec.holder_identity.as_deref() != Some(opts.replica.as_str()) {
        return;
    }
    spec.holder_identity = None;
    spec.lease_duration_seconds = Some(1);
    spec.renew_time = Some(now());
    match api.replace(LEASE, &PostParams::default(), &lease).await {
        Ok(_) => tracing::info!(lease = LEASE, "released the leader Lease"),
        Err(e) => tracing::warn!(lease = LEASE, error = %e, "could not release the leader Lease"),
    }
}

/// Take part in the election until stopped; `leader` says whether this replica leads.
pub async fn run(
    client: Client,
    opts: KubeOptions,
    leader: tokio::sync::watch::Sender<bool>,
    stop: CancellationToken,
) {
    let api: Api<Lease> = Api::namespaced(client, &opts.namespace);
    let mut seen = Observed::default();
    let mut renewed: Option<Instant> = None;
    let deadline = opts.lease_duration * 2 / 3;
    loop {
        // Bounded: a request that gets no answer (a stalled connection) must not keep this replica leading past
        // the point where another may take the Lease over.
        let tried = match tokio::time::timeout(deadline, try_lead(&api, &opts, &mut seen)).await {
            Ok(r) => r.map_err(|e| e.to_string()),
            Err(_) => Err(format!("no answer within {deadline:?}")),
        };
        let leads = match tried {
            Ok(true) => {
                renewed = Some(Instant::now());
                true
            }
            Ok(false) => false,
            Err(e) => {
                let keep = *leader.borrow() && renewed.is_some_and(|r| r.elapsed() < deadline);
                tracing::warn!(lease = LEASE, error = %e, still_leading = keep, "leader Lease: API error");
                keep
            }
        };
        if leader.send_if_modified(|l| std::mem::replace(l, leads) != leads) {
            if leads {
                tracing::info!(lease = LEASE, replica = %opts.replica, "leading: this replica writes WeftPlugin status");
            } else {
                tracing::info!(lease = LEASE, replica = %opts.replica, holder = ?seen.record.as_ref().and_then(|r| r.0.clone()), "following: another replica writes WeftPlugin status");
            }
        }
        tokio::select! {
            () = tokio::time::sleep(opts.retry_period) => {}
            () = stop.cancelled() => {
                if *leader.borrow() {
                    leader.send_replace(false);
                    // Bounded: a stalled API must not hold up the shutdown (the Lease then lapses on its own).
                    if tokio::time::timeout(opts.lease_duration, release(&api, &opts)).await.is_err() {
                        tracing::warn!(lease = LEASE, "releasing the leader Lease timed out; it lapses on its own");
                    }
                }
                return;
            }
        }
    }
}
