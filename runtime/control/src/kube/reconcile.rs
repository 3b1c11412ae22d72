//! From the watched WeftPlugins and Pods to the plugins served: each resource checked and resolved on its own (a
//! refused one is refused alone: its last accepted spec keeps being served, and it says why), pull secrets read,
//! then one publish of the whole set. Runs on every change of the stores (coalesced), and every minute for
//! what is not watched (Secrets, cached between passes).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::api::DynamicObject;
use kube::{Api, Client, ResourceExt as _};
use tokio_util::sync::CancellationToken;

use crate::ads::publish::{Publisher, SourceKind};
use crate::ads::resources::PluginEntry;
use crate::kube::KubeOptions;
use crate::kube::spec::{self, Extracted, Selection};
use crate::kube::watch::{ByName, PodInfo, Stores};

/// How often Secrets (not watched: the controller may only `get` them) are read again.
const RESYNC: Duration = Duration::from_secs(60);

/// What the controller concluded about one resource, for its status.
#[derive(Debug, Clone, PartialEq)]
pub struct ResourceState {
    /// `metadata.generation`.
    pub generation: i64,
    /// `metadata.uid`.
    pub uid: String,
    /// `None`: accepted; else why it is refused.
    pub refused: Option<String>,
    /// The xDS name its plugin is served as.
    pub xds_name: String,
    /// The version served (of the accepted spec, or the last accepted one); none: nothing is served.
    pub serving: Option<Serving>,
    /// Its status as last read from the API.
    pub status: Option<serde_json::Value>,
}

/// What is served for a resource.
#[derive(Debug, Clone, PartialEq)]
pub struct Serving {
    /// The resource version the nodes get.
    pub version: String,
    /// The code's sha256, when known.
    pub sha256: Option<String>,
    /// The nodes it is for (none: every node).
    pub nodes: Option<BTreeSet<String>>,
    /// A staged rollout's nodes.
    pub staged: Option<Vec<String>>,
}

/// Every resource's state, by (namespace, name).
#[derive(Debug, Default)]
pub struct Resources {
    inner: Mutex<BTreeMap<(String, String), ResourceState>>,
    changed: tokio::sync::watch::Sender<u64>,
}

impl Resources {
    fn lock(&self) -> MutexGuard<'_, BTreeMap<(String, String), ResourceState>> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// All of them.
    pub fn all(&self) -> BTreeMap<(String, String), ResourceState> {
        self.lock().clone()
    }

    /// How many.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    /// A receiver woken by every change.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changed.subscribe()
    }

    fn replace(&self, next: BTreeMap<(String, String), ResourceState>) {
        let mut g = self.lock();
        if *g != next {
            *g = next;
            drop(g);
            self.changed.send_modify(|n| *n += 1);
        }
    }
}

/// What reconciliation works with.
pub struct Context {
    /// The API.
    pub client: Client,
    /// The options.
    pub opts: KubeOptions,
    /// The watched objects.
    pub stores: Arc<Stores>,
    /// Where the plugins are published.
    pub publisher: Arc<Publisher>,
    /// The resources' states.
    pub resources: Arc<Resources>,
    /// The staged rollouts, served as the resources' status records them.
    pub rollouts: Arc<crate::rollout::driver::Rollouts>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("opts", &self.opts)
            .finish_non_exhaustive()
    }
}

/// The last accepted spec of each resource (by uid: a resource deleted and created again starts afresh).
type LastGood = BTreeMap<String, Extracted>;

/// Reconcile on every change until stopped; `synced` turns true after the first publish from complete lists.
pub async fn run(ctx: Context, synced: tokio::sync::watch::Sender<bool>, stop: CancellationToken) {
    let mut changes = ctx.stores.subscribe();
    let mut last_good = LastGood::new();
    let mut cache = SecretCache::default();
    loop {
        if ctx.stores.listed() {
            let (plugins, pods) = ctx.stores.snapshot();
            let secrets = cache
                .refresh(&ctx.client, needed_secrets(&plugins, &last_good))
                .await;
            let (set, states) = reconcile(&ctx.opts, &plugins, &pods, &secrets, &mut last_good);
            ctx.rollouts.adopt(recorded_rollouts(&states));
            ctx.publisher.publish_plugins(set);
            describe(&ctx.publisher, &states);
            ctx.resources.replace(states);
            synced.send_if_modified(|s| !std::mem::replace(s, true));
        }
        // A Secret that could not be read is tried again sooner than the resync.
        let next = if cache.has_failures() {
            RETRY_FAILED
        } else {
            RESYNC
        };
        tokio::select! {
            r = changes.changed() => if r.is_err() { return },
            () = tokio::time::sleep(next) => {}
            () = stop.cancelled() => return,
        }
        // Coalesce a burst (a relist, a rollout touching many pods) into one publish.
        tokio::time::sleep(Duration::from_millis(20)).await;
        changes.borrow_and_update();
    }
}

/// The rollout state the leader recorded in each resource's status (`status.rolloutState`), by xDS name; a record
/// that does not parse is left out (logged), as if none was recorded.
pub fn recorded_rollouts(
    states: &BTreeMap<(String, String), ResourceState>,
) -> BTreeMap<String, crate::rollout::state::Record> {
    let mut out = BTreeMap::new();
    for ((ns, name), s) in states {
        let Some(v) = s.status.as_ref().and_then(|st| st.get(ROLLOUT_STATE)) else {
            continue;
        };
        match serde_json::from_value::<crate::rollout::state::Record>(v.clone()) {
            Ok(r) => {
                out.insert(s.xds_name.clone(), r);
            }
            Err(e) => {
                tracing::warn!(namespace = %ns, name = %name, error = %e, "status.rolloutState does not parse; ignored")
            }
        }
    }
    out
}

/// Where the leader records a resource's rollout state in its status.
pub const ROLLOUT_STATE: &str = "rolloutState";

/// How soon a pull Secret that could not be read is read again.
const RETRY_FAILED: Duration = Duration::from_secs(5);

/// Pull secrets by (namespace, name): the docker config JSON, or why it cannot be used.
pub type Secrets = BTreeMap<(String, String), Result<Vec<u8>, String>>;

/// The pull Secrets the resources name (their current specs and their last accepted ones).
fn needed_secrets(
    plugins: &ByName<DynamicObject>,
    last_good: &LastGood,
) -> BTreeSet<(String, String)> {
    let mut out = BTreeSet::new();
    for ((ns, _), o) in plugins {
        let current = spec::extract(o.data.get("spec"))
            .ok()
            .and_then(|x| x.pull_secret);
        let good = o
            .uid()
            .and_then(|u| last_good.get(&u))
            .and_then(|x| x.pull_secret.clone());
        for name in current.into_iter().chain(good) {
            out.insert((ns.clone(), name));
        }
    }
    out
}

/// Pull Secrets as last read (Secrets are not watched: the controller may only `get` them). A Secret is read when
/// first named, again every [`RESYNC`] (a rotated credential), and every [`RETRY_FAILED`] while it cannot be read;
/// not on every Pod event.
#[derive(Debug, Default)]
struct SecretCache {
    entries: BTreeMap<(String, String), Read>,
}

/// One read of a Secret and when it was made.
type Read = (Result<Vec<u8>, String>, tokio::time::Instant);

impl SecretCache {
    fn has_failures(&self) -> bool {
        self.entries.values().any(|(v, _)| v.is_err())
    }

    async fn refresh(&mut self, client: &Client, needed: BTreeSet<(String, String)>) -> Secrets {
        self.entries.retain(|k, _| needed.contains(k));
        for key in needed {
            let stale = match self.entries.get(&key) {
                None => true,
                Some((Ok(_), at)) => at.elapsed() >= RESYNC,
                Some((Err(_), at)) => at.elapsed() >= RETRY_FAILED,
            };
            if stale {
                let v = read_secret(client, &key.0, &key.1).await;
                self.entries.insert(key, (v, tokio::time::Instant::now()));
            }
        }
        self.entries
            .iter()
            .map(|(k, (v, _))| (k.clone(), v.clone()))
            .collect()
    }
}

async fn read_secret(client: &Client, ns: &str, name: &str) -> Result<Vec<u8>, String> {
    let api: Api<Secret> = Api::namespaced(client.clone(), ns);
    match api.get_opt(name).await {
        Ok(Some(s)) => s
            .data
            .as_ref()
            .and_then(|d| d.get(".dockerconfigjson"))
            .map(|b| b.0.clone())
            .ok_or_else(|| {
                format!(
                    "spec.imagePullSecret: Secret {ns}/{name} has no .dockerconfigjson (a \
                     kubernetes.io/dockerconfigjson Secret is expected)"
                )
            }),
        Ok(None) => Err(format!(
            "spec.imagePullSecret: Secret {ns}/{name} not found"
        )),
        Err(e) => Err(format!(
            "spec.imagePullSecret: reading Secret {ns}/{name}: {e}"
        )),
    }
}

/// One pass: the plugin set to serve and every resource's state.
pub fn reconcile(
    opts: &KubeOptions,
    plugins: &ByName<DynamicObject>,
    pods: &ByName<PodInfo>,
    secrets: &Secrets,
    last_good: &mut LastGood,
) -> (
    BTreeMap<String, PluginEntry>,
    BTreeMap<(String, String), ResourceState>,
) {
    let mut set = BTreeMap::new();
    let mut states = BTreeMap::new();
    let mut live_uids = BTreeSet::new();
    for ((ns, name), o) in plugins {
        let uid = o.uid().unwrap_or_default();
        live_uids.insert(uid.clone());
        let xds_name = spec::xds_name(ns, name);
        let build = |x: &Extracted| -> Result<(PluginEntry, Selection), String> {
            let sel = spec::select(
                ns,
                &opts.root_namespace,
                x.match_labels.as_ref(),
                pods,
                &opts.cluster_id,
            );
            let secret = match &x.pull_secret {
                None => None,
                Some(s) => match secrets.get(&(ns.clone(), s.clone())) {
                    Some(Ok(b)) => Some(b.clone()),
                    Some(Err(e)) => return Err(e.clone()),
                    None => {
                        return Err(format!(
                            "spec.imagePullSecret: Secret {ns}/{s} not read yet"
                        ));
                    }
                },
            };
            let e = spec::entry(ns, name, x, &sel, secret)?;
            Ok((e, sel))
        };
        let attempt = spec::extract(o.data.get("spec")).and_then(|x| build(&x).map(|b| (x, b)));
        let (refused, served) = match attempt {
            Ok((x, built)) => {
                last_good.insert(uid.clone(), x);
                (None, Some(built))
            }
            Err(why) => {
                tracing::warn!(namespace = %ns, name = %name, reason = %why, "WeftPlugin refused; its last accepted spec (if any) keeps being served");
                let fallback = last_good.get(&uid).and_then(|x| build(x).ok());
                (Some(why), fallback)
            }
        };
        let serving = served.map(|(entry, sel)| {
            let s = Serving {
                version: entry.current.version.clone(),
                sha256: entry.info.sha256.clone(),
                nodes: sel.nodes.clone(),
                staged: entry.nodes.as_ref().map(|n| n.0.clone()),
            };
            set.insert(xds_name.clone(), entry);
            s
        });
        states.insert(
            (ns.clone(), name.clone()),
            ResourceState {
                generation: o.metadata.generation.unwrap_or_default(),
                uid,
                refused,
                xds_name,
                serving,
                status: o.data.get("status").cloned(),
            },
        );
    }
    last_good.retain(|uid, _| live_uids.contains(uid));
    (set, states)
}

/// Record the source for the status endpoint (the refusals are per resource, in their statuses).
pub fn describe(publisher: &Publisher, states: &BTreeMap<(String, String), ResourceState>) {
    let refused: Vec<String> = states
        .iter()
        .filter_map(|((ns, n), s)| s.refused.as_ref().map(|r| format!("{ns}/{n}: {r}")))
        .collect();
    if !refused.is_empty() {
        publisher.record_refused(SourceKind::Plugins, &refused.join("; "));
    }
}

#[cfg(test)]
mod tests;
