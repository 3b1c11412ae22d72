//! The WeftPlugin controller (`weft-control --plugins-from-kube`): WeftPlugin resources (`weftplugins.weft.dev`,
//! namespaced, modelled on Istio's WasmPlugin) watched through the Kubernetes API with kube-rs, and served to the
//! nodes as the plugin files are.
//!
//! - [`watch`] keeps the WeftPlugins and the Pods (list + watch, bookmarks, relist on 410 Gone, backoff);
//! - [`spec`] turns one resource into the plugin model: namespace scoping as WasmPlugin's (a resource selects
//!   workloads of its own namespace; one in the root namespace applies mesh-wide), `selector.matchLabels`
//!   resolved here against the Pods (xDS workloads carry no labels) into workload uids and the nodes they run on,
//!   `imagePullSecret` read from the resource's namespace;
//! - [`reconcile`] publishes the accepted resources; a refused one is refused alone (its last accepted spec keeps
//!   being served) and says why in its status;
//! - [`leader`] elects one replica by a `coordination.k8s.io` Lease; [`report`] has every replica publish what its
//!   nodes run (a ConfigMap per replica, as istiod's distribution reports); [`status`] is the leader's: it
//!   aggregates the reports into each resource's status (conditions `Accepted` and `Ready`, node counts, the
//!   sha256 served, the last rollback) and steps the staged rollouts over every replica's nodes, recording each in
//!   the resource's `status.rolloutState`, which every replica serves.
//!
//! Replicas share no state but the API's (the rollout state included): each serves its own nodes from its own
//! watch, and resource versions are
//! content digests, so a node that reconnects to another replica resumes with `initial_resource_versions` and is
//! sent nothing new.

pub mod client;
pub mod leader;
pub mod reconcile;
pub mod report;
pub mod spec;
pub mod status;
pub mod watch;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::ads::publish::Publisher;
use crate::ads::registry::Registry;

/// How the controller reaches the API and where it keeps its own objects.
#[derive(Debug, Clone)]
pub struct KubeOptions {
    /// The API server (`https://kubernetes.default.svc`).
    pub api: String,
    /// Its CA bundle (PEM); none: the system roots (or plain http, for tests).
    pub ca_file: Option<PathBuf>,
    /// The bearer token file, re-read by the client as it rotates; none: no authentication.
    pub token_file: Option<PathBuf>,
    /// Resources here apply mesh-wide (`istio-system`, as Istio's root namespace).
    pub root_namespace: String,
    /// Istio's cluster id, the first part of a workload uid (`Kubernetes//Pod/<namespace>/<name>`).
    pub cluster_id: String,
    /// Where the leader Lease and the replicas' reports live.
    pub namespace: String,
    /// This replica's name (its pod's): the Lease holder and the report's name.
    pub replica: String,
    /// How long a leader's Lease holds without renewal.
    pub lease_duration: Duration,
    /// How often the Lease is tried or renewed, reports written and status computed.
    pub retry_period: Duration,
}

/// The controller could not start.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The client configuration (URL, CA file, token file).
    #[error("Kubernetes client: {0}")]
    Client(String),
}

/// A running controller: its tasks stop with the token given to [`start`].
#[derive(Debug)]
pub struct Controller {
    /// What the controller knows of each resource (read by the status endpoint and tests).
    pub state: Arc<reconcile::Resources>,
    /// Whether this replica leads (writes status).
    pub leader: tokio::sync::watch::Receiver<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Controller {
    /// Wait for the tasks to end (after the stop token is cancelled: the Lease released, the report deleted).
    pub async fn wait(self) {
        for t in self.tasks {
            let _ = t.await;
        }
    }
}

/// Start watching; returns once the first complete lists of WeftPlugins and Pods are published (the nodes must
/// not be served an empty plugin set that would remove what they run). Logs while it waits.
pub async fn start(
    opts: KubeOptions,
    publisher: Arc<Publisher>,
    registry: Arc<Registry>,
    stop: CancellationToken,
) -> Result<Controller, Error> {
    let client = client::build(&opts)?;
    let stores = Arc::new(watch::Stores::default());
    let mut tasks = watch::spawn(client.clone(), stores.clone(), stop.clone());
    let state = Arc::new(reconcile::Resources::default());
    let rollouts = Arc::new(crate::rollout::driver::Rollouts::mirror(registry.clone()));
    publisher.set_rollouts(rollouts.clone());
    let (synced_tx, mut synced) = tokio::sync::watch::channel(false);
    tasks.push(tokio::spawn(reconcile::run(
        reconcile::Context {
            client: client.clone(),
            opts: opts.clone(),
            stores,
            publisher: publisher.clone(),
            resources: state.clone(),
            rollouts: rollouts.clone(),
        },
        synced_tx,
        stop.clone(),
    )));
    let (leader_tx, leader) = tokio::sync::watch::channel(false);
    tasks.push(tokio::spawn(leader::run(
        client.clone(),
        opts.clone(),
        leader_tx,
        stop.clone(),
    )));
    tasks.push(tokio::spawn(report::run(
        client.clone(),
        opts.clone(),
        registry,
        rollouts.clone(),
        stop.clone(),
    )));
    tasks.push(tokio::spawn(status::run(
        client,
        opts.clone(),
        state.clone(),
        status::Rollouts {
            rollouts,
            publisher,
        },
        leader.clone(),
        stop.clone(),
    )));
    let mut waited = 0u64;
    loop {
        tokio::select! {
            r = synced.wait_for(|s| *s) => {
                if r.is_err() {
                    return Err(Error::Client("the controller stopped before its first sync".into()));
                }
                break;
            }
            () = tokio::time::sleep(Duration::from_secs(10)) => {
                waited += 10;
                tracing::warn!(api = %opts.api, waited_s = waited, "still waiting for the first complete list of WeftPlugins and Pods; not serving nodes until then");
            }
            () = stop.cancelled() => return Err(Error::Client("stopped before the first sync".into())),
        }
    }
    tracing::info!(
        resources = state.len(),
        "WeftPlugins and Pods listed; serving plugins from the API"
    );
    Ok(Controller {
        state,
        leader,
        tasks,
    })
}
