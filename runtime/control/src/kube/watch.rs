//! The two watches the controller keeps, with kube-rs's watcher (list, then watch from the list's
//! resourceVersion with bookmarks; a relist on 410 Gone; backoff on errors): every WeftPlugin as it is, and of every
//! Pod what selection needs (namespace, name, labels, the node it runs on). A relist replaces a store whole, once
//! complete, so a half-listed store is never reconciled.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};

use futures_util::StreamExt as _;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::WatchStreamExt as _;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, ResourceExt as _};
use tokio_util::sync::CancellationToken;

/// `weftplugins.weft.dev/v1alpha1`.
pub fn weftplugin_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("weft.dev", "v1alpha1", "WeftPlugin"),
        "weftplugins",
    )
}

/// Objects by (namespace, name).
pub type ByName<T> = BTreeMap<(String, String), T>;

/// What selection needs of a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodInfo {
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// The node it is scheduled on (none: not yet).
    pub node: Option<String>,
}

impl PodInfo {
    fn of(p: &Pod) -> Option<PodInfo> {
        // A pod that has ended is no workload any more.
        let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
        if matches!(phase, Some("Succeeded" | "Failed")) {
            return None;
        }
        Some(PodInfo {
            labels: p.labels().clone(),
            node: p.spec.as_ref().and_then(|s| s.node_name.clone()),
        })
    }
}

#[derive(Debug, Default)]
struct Inner {
    plugins: ByName<DynamicObject>,
    pods: ByName<PodInfo>,
    plugins_listed: bool,
    pods_listed: bool,
}

/// The watched objects, and a counter bumped on every change.
#[derive(Debug)]
pub struct Stores {
    inner: Mutex<Inner>,
    changed: tokio::sync::watch::Sender<u64>,
}

impl Default for Stores {
    fn default() -> Self {
        Self {
            inner: Mutex::new(Inner::default()),
            changed: tokio::sync::watch::channel(0).0,
        }
    }
}

fn key<K: kube::Resource>(o: &K) -> (String, String) {
    (o.namespace().unwrap_or_default(), o.name_any())
}

impl Stores {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn bump(&self) {
        self.changed.send_modify(|n| *n += 1);
    }

    /// A receiver woken by every change.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// Whether both stores hold a complete list.
    pub fn listed(&self) -> bool {
        let g = self.lock();
        g.plugins_listed && g.pods_listed
    }

    /// The WeftPlugins and the Pods, as of now.
    pub fn snapshot(&self) -> (ByName<DynamicObject>, ByName<PodInfo>) {
        let g = self.lock();
        (g.plugins.clone(), g.pods.clone())
    }

    /// Set the stores directly (tests of reconciliation).
    pub fn set(&self, plugins: ByName<DynamicObject>, pods: ByName<PodInfo>) {
        let mut g = self.lock();
        g.plugins = plugins;
        g.pods = pods;
        g.plugins_listed = true;
        g.pods_listed = true;
        drop(g);
        self.bump();
    }
}

/// Which store a watch fills.
trait Kept: kube::Resource + Clone + std::fmt::Debug + Send + 'static {
    type Info: Clone + PartialEq + Send;
    const WHAT: &'static str;
    fn info(&self) -> Option<Self::Info>;
    fn store(inner: &mut Inner) -> (&mut ByName<Self::Info>, &mut bool);
}

impl Kept for DynamicObject {
    type Info = DynamicObject;
    const WHAT: &'static str = "weftplugins.weft.dev";
    fn info(&self) -> Option<DynamicObject> {
        Some(self.clone())
    }
    fn store(inner: &mut Inner) -> (&mut ByName<DynamicObject>, &mut bool) {
        (&mut inner.plugins, &mut inner.plugins_listed)
    }
}

impl Kept for Pod {
    type Info = PodInfo;
    const WHAT: &'static str = "pods";
    fn info(&self) -> Option<PodInfo> {
        PodInfo::of(self)
    }
    fn store(inner: &mut Inner) -> (&mut ByName<PodInfo>, &mut bool) {
        (&mut inner.pods, &mut inner.pods_listed)
    }
}

/// Start both watches.
pub fn spawn(
    client: Client,
    stores: std::sync::Arc<Stores>,
    stop: CancellationToken,
) -> Vec<tokio::task::JoinHandle<()>> {
    let plugins: Api<DynamicObject> = Api::all_with(client.clone(), &weftplugin_resource());
    let pods: Api<Pod> = Api::all(client);
    vec![
        tokio::spawn(follow(plugins, stores.clone(), stop.clone())),
        tokio::spawn(follow(pods, stores, stop)),
    ]
}

async fn follow<K>(api: Api<K>, stores: std::sync::Arc<Stores>, stop: CancellationToken)
where
    K: Kept + serde::de::DeserializeOwned,
{
    let mut events = watcher::watcher(api, watcher::Config::default())
        .default_backoff()
        .boxed();
    let mut relist: Option<ByName<K::Info>> = None;
    loop {
        let ev = tokio::select! {
            ev = events.next() => ev,
            () = stop.cancelled() => return,
        };
        let Some(ev) = ev else { return };
        match ev {
            Ok(Event::Init) => relist = Some(ByName::new()),
            Ok(Event::InitApply(o)) => {
                if let (Some(buf), Some(info)) = (relist.as_mut(), o.info()) {
                    buf.insert(key(&o), info);
                }
            }
            Ok(Event::InitDone) => {
                let listed = relist.take().unwrap_or_default();
                let n = listed.len();
                let mut g = stores.lock();
                let (store, done) = K::store(&mut g);
                let changed = *store != listed || !*done;
                *store = listed;
                *done = true;
                drop(g);
                tracing::info!(what = K::WHAT, objects = n, "listed");
                if changed {
                    stores.bump();
                }
            }
            Ok(Event::Apply(o)) => {
                let k = key(&o);
                let mut g = stores.lock();
                let (store, _) = K::store(&mut g);
                let changed = match o.info() {
                    Some(info) => store.insert(k, info.clone()).as_ref() != Some(&info),
                    None => store.remove(&k).is_some(),
                };
                drop(g);
                if changed {
                    stores.bump();
                }
            }
            Ok(Event::Delete(o)) => {
                let k = key(&o);
                let removed = K::store(&mut stores.lock()).0.remove(&k).is_some();
                if removed {
                    stores.bump();
                }
            }
            Err(e) => {
                tracing::warn!(what = K::WHAT, error = %e, "watch failed; retrying with backoff")
            }
        }
    }
}
