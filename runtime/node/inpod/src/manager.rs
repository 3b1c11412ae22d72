//! The pods weft serves, driven by ZDS requests with ztunnel's rules: an add opens the pod's listener set (an add
//! of a pod already served in the same namespace is a no-op; in a new namespace the old set drains first); a
//! listener set that fails to open is answered with an error ack and retried; adds and keeps before
//! `SnapshotSent` make up the snapshot, and served pods missing from it drain when it completes; a delete drains
//! the pod's listener set (before the snapshot it only takes the pod out of the snapshot).

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::Arc;

use crate::netns::Netns;
use crate::protocol::{PodInfo, Request};
use crate::status::{Describe, PodState, Status};

/// Opens and drains the listener set of one pod.
pub trait ListenerSets: Send + Sync + 'static {
    /// An open listener set.
    type Set: Describe + 'static;
    /// Open `pod`'s listeners inside `netns`; an error text is sent back to the agent.
    fn open(
        &self,
        pod: &PodInfo,
        netns: &Arc<Netns>,
    ) -> impl Future<Output = Result<Arc<Self::Set>, String>> + Send;
    /// Stop accepting and drain the set's connections (the rules of a SIGTERM drain).
    fn drain(&self, set: Arc<Self::Set>) -> impl Future<Output = ()> + Send + 'static;
}

/// A request that could not be carried out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// The pod's listeners could not be opened: error ack, the connection stays, the pod is retried.
    Pod(String),
    /// The request breaks the protocol (keep or a second snapshot after the snapshot): error ack, reconnect.
    Protocol(String),
}

struct Served<S> {
    info: PodInfo,
    netns: Arc<Netns>,
    set: Arc<S>,
    generation: u64,
}

struct Pending {
    info: PodInfo,
    netns: Arc<Netns>,
    generation: u64,
}

/// The pod table.
pub struct Manager<L: ListenerSets> {
    sets: Arc<L>,
    status: Arc<Status>,
    served: HashMap<String, Served<L::Set>>,
    pending: HashMap<String, Pending>,
    snapshot_received: bool,
    in_snapshot: HashSet<String>,
    draining: tokio::task::JoinSet<()>,
    next_generation: u64,
}

impl<L: ListenerSets> std::fmt::Debug for Manager<L> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Manager")
            .field("served", &self.served.keys().collect::<Vec<_>>())
            .field("pending", &self.pending.keys().collect::<Vec<_>>())
            .field("snapshot_received", &self.snapshot_received)
            .finish_non_exhaustive()
    }
}

impl<L: ListenerSets> Manager<L> {
    /// An empty table.
    pub fn new(sets: Arc<L>, status: Arc<Status>) -> Self {
        Self {
            sets,
            status,
            served: HashMap::new(),
            pending: HashMap::new(),
            snapshot_received: false,
            in_snapshot: HashSet::new(),
            draining: tokio::task::JoinSet::new(),
            next_generation: 0,
        }
    }

    /// A new connection to the agent: a new snapshot follows. Served pods keep serving.
    pub fn reset_snapshot(&mut self) {
        self.in_snapshot.clear();
        for (uid, p) in self.pending.drain() {
            self.status.remove(&uid, p.generation, false);
        }
        self.snapshot_received = false;
        self.status.set_snapshot_received(false);
    }

    /// Uids of the pods served now.
    pub fn served(&self) -> Vec<String> {
        let mut v: Vec<String> = self.served.keys().cloned().collect();
        v.sort();
        v
    }

    /// Whether some pod's listeners failed to open and wait for a retry.
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Carry out one request.
    pub async fn handle(&mut self, req: Request) -> Result<(), Failure> {
        match req {
            Request::Add(info, netns) => {
                tracing::info!(uid = %info.uid, pod = %format!("{}/{}", info.namespace, info.name), netns = %netns.id(), "pod added");
                if !self.snapshot_received {
                    self.in_snapshot.insert(info.uid.clone());
                }
                self.add(info, Arc::new(netns)).await
            }
            Request::Keep(uid) => {
                if self.snapshot_received {
                    return Err(Failure::Protocol("pod keep received after snapshot".into()));
                }
                tracing::info!(%uid, "pod keep: not removed when the snapshot completes");
                self.in_snapshot.insert(uid);
                Ok(())
            }
            Request::Del(uid) => {
                tracing::info!(%uid, "pod deleted");
                if !self.snapshot_received {
                    // Out of the snapshot: the reconcile at SnapshotSent stops it if it is served.
                    self.in_snapshot.remove(&uid);
                    if let Some(p) = self.pending.remove(&uid) {
                        self.status.remove(&uid, p.generation, false);
                    }
                    return Ok(());
                }
                self.stop(&uid);
                Ok(())
            }
            Request::SnapshotSent => {
                if self.snapshot_received {
                    return Err(Failure::Protocol("pod snapshot received already".into()));
                }
                let gone: Vec<String> = self
                    .served
                    .keys()
                    .filter(|uid| !self.in_snapshot.contains(*uid))
                    .cloned()
                    .collect();
                tracing::info!(
                    served = self.served.len(),
                    removing = gone.len(),
                    "snapshot complete"
                );
                for uid in gone {
                    self.stop(&uid);
                }
                self.in_snapshot.clear();
                self.snapshot_received = true;
                self.status.set_snapshot_received(true);
                Ok(())
            }
        }
    }

    async fn add(&mut self, info: PodInfo, netns: Arc<Netns>) -> Result<(), Failure> {
        if let Some(s) = self.served.get(&info.uid) {
            if s.netns.id() == netns.id() {
                return Ok(());
            }
            // The pod sandbox was re-created with a new namespace: drain the old listeners, open new ones.
            tracing::info!(uid = %info.uid, old = %s.netns.id(), new = %netns.id(), "pod has a new network namespace");
            self.stop(&info.uid);
        }
        if let Some(p) = self.pending.remove(&info.uid) {
            self.status.remove(&info.uid, p.generation, false);
        }
        self.next_generation += 1;
        let generation = self.next_generation;
        match self.sets.open(&info, &netns).await {
            Ok(set) => {
                self.status.started();
                let detail: Arc<dyn Describe> = set.clone();
                self.status.set(
                    &info,
                    generation,
                    PodState::Serving,
                    netns.id(),
                    None,
                    Some(detail),
                );
                tracing::info!(uid = %info.uid, pod = %format!("{}/{}", info.namespace, info.name), "pod served: listeners open in its network namespace");
                self.served.insert(
                    info.uid.clone(),
                    Served {
                        info,
                        netns,
                        set,
                        generation,
                    },
                );
                Ok(())
            }
            Err(e) => {
                self.status.start_failed();
                tracing::error!(uid = %info.uid, error = %e, "cannot open the pod's listeners; will retry");
                self.status.set(
                    &info,
                    generation,
                    PodState::Pending,
                    netns.id(),
                    Some(e.clone()),
                    None,
                );
                self.pending.insert(
                    info.uid.clone(),
                    Pending {
                        info,
                        netns,
                        generation,
                    },
                );
                Err(Failure::Pod(e))
            }
        }
    }

    /// Retry the pods whose listeners failed to open.
    pub async fn retry_pending(&mut self) {
        let pending: Vec<Pending> = self.pending.drain().map(|(_, p)| p).collect();
        for p in pending {
            self.status.remove(&p.info.uid, p.generation, false);
            tracing::info!(uid = %p.info.uid, "retrying pod");
            let _ = self.add(p.info, p.netns).await;
        }
    }

    /// Close a pod's listeners and drain its connections in the background.
    fn stop(&mut self, uid: &str) {
        if let Some(p) = self.pending.remove(uid) {
            self.status.remove(uid, p.generation, false);
        }
        let Some(s) = self.served.remove(uid) else {
            return;
        };
        self.status.set(
            &s.info,
            s.generation,
            PodState::Draining,
            s.netns.id(),
            None,
            Some(s.set.clone()),
        );
        let status = self.status.clone();
        let drain = self.sets.drain(s.set);
        let (uid, generation) = (s.info.uid, s.generation);
        // Finished drains are reaped so the set does not grow.
        while self.draining.try_join_next().is_some() {}
        self.draining.spawn(async move {
            drain.await;
            tracing::info!(%uid, "pod drained");
            status.remove(&uid, generation, true);
        });
    }

    /// weft is stopping: drain every served pod (concurrently) and wait for the drains already running.
    pub async fn drain_all(mut self) {
        let uids: Vec<String> = self.served.keys().cloned().collect();
        for uid in uids {
            self.stop(&uid);
        }
        while self.draining.join_next().await.is_some() {}
    }

    /// Wait for the drains running now (tests).
    pub async fn wait_drains(&mut self) {
        while self.draining.join_next().await.is_some() {}
    }
}

#[cfg(test)]
mod tests;
