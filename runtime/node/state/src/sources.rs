//! Several sources feed one state: the local file, istiod, `weft-control`, ... Each source keeps its own
//! contribution (resources by the names the source gave them), changed resource by resource; the snapshot the data
//! path reads is their union, rebuilt on every change. Where two sources define the same workload uid, service key,
//! policy key or plugin name, the source of higher precedence wins (xDS sources over the local file by default).

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Serialize;

use crate::model::{PluginSpec, Policy, Service, Workload};

/// The local config file's source id.
pub const LOCAL_FILE: &str = "file";
/// The local file's precedence.
pub const FILE_PRECEDENCE: i32 = 0;
/// The default precedence of other sources (above the local file).
pub const XDS_PRECEDENCE: i32 = 10;

/// A resource a source contributes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resource {
    /// An xDS Address that is a workload.
    Workload(Arc<Workload>),
    /// An xDS Address that is a service.
    Service(Arc<Service>),
    /// An xDS Authorization.
    Policy(Arc<Policy>),
    /// A plugin spec (xDS extension config).
    Plugin(Arc<PluginSpec>),
}

impl Resource {
    /// The collection its name lives in.
    pub fn collection(&self) -> Collection {
        match self {
            Resource::Workload(_) | Resource::Service(_) => Collection::Address,
            Resource::Policy(_) => Collection::Authorization,
            Resource::Plugin(_) => Collection::Plugin,
        }
    }
}

/// Where resource names live: one collection per xDS type (workloads and services share the Address names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Collection {
    /// Workloads and services.
    Address,
    /// Authorization policies.
    Authorization,
    /// Plugin specs.
    Plugin,
}

/// One change of a source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// Add or replace the resource called `name`.
    Upsert {
        /// The source's name for it (xDS: the resource name).
        name: String,
        /// The resource, already converted and checked.
        resource: Resource,
    },
    /// Remove the resource called `name` (a name the source does not hold is ignored).
    Remove {
        /// Its collection.
        collection: Collection,
        /// The name.
        name: String,
    },
}

/// What a source holds, by name.
#[derive(Debug, Clone, Default)]
pub(crate) struct Contribution {
    pub(crate) precedence: i32,
    pub(crate) workloads: BTreeMap<String, Arc<Workload>>,
    pub(crate) services: BTreeMap<String, Arc<Service>>,
    pub(crate) policies: BTreeMap<String, Arc<Policy>>,
    pub(crate) plugins: BTreeMap<String, Arc<PluginSpec>>,
}

/// What a source holds, in numbers (for `/config_dump`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SourceCounts {
    /// Precedence (higher wins on a conflict).
    pub precedence: i32,
    /// Workloads held.
    pub workloads: usize,
    /// Services held.
    pub services: usize,
    /// Policies held.
    pub policies: usize,
    /// Plugin specs held.
    pub plugins: usize,
}

impl Contribution {
    pub(crate) fn new(precedence: i32) -> Self {
        Self {
            precedence,
            ..Default::default()
        }
    }

    pub(crate) fn counts(&self) -> SourceCounts {
        SourceCounts {
            precedence: self.precedence,
            workloads: self.workloads.len(),
            services: self.services.len(),
            policies: self.policies.len(),
            plugins: self.plugins.len(),
        }
    }

    /// Apply one change; returns whether anything changed.
    pub(crate) fn apply(&mut self, change: Change) -> bool {
        match change {
            Change::Upsert { name, resource } => match resource {
                Resource::Workload(w) => {
                    let gone = self.services.remove(&name).is_some();
                    upsert(&mut self.workloads, name, w) || gone
                }
                Resource::Service(s) => {
                    let gone = self.workloads.remove(&name).is_some();
                    upsert(&mut self.services, name, s) || gone
                }
                Resource::Policy(p) => upsert(&mut self.policies, name, p),
                Resource::Plugin(p) => upsert(&mut self.plugins, name, p),
            },
            Change::Remove { collection, name } => match collection {
                Collection::Address => self.remove_address(&name),
                Collection::Authorization => self.policies.remove(&name).is_some(),
                Collection::Plugin => self.plugins.remove(&name).is_some(),
            },
        }
    }

    /// Remove an Address by its resource name; failing that, as ztunnel reads a removal, the workload whose uid it
    /// is, or else the service whose `namespace/hostname` it is.
    fn remove_address(&mut self, name: &str) -> bool {
        if self.workloads.remove(name).is_some() || self.services.remove(name).is_some() {
            return true;
        }
        let by_uid: Vec<String> = self
            .workloads
            .iter()
            .filter(|(_, w)| w.uid == name)
            .map(|(k, _)| k.clone())
            .collect();
        if !by_uid.is_empty() {
            for k in by_uid {
                self.workloads.remove(&k);
            }
            return true;
        }
        let by_key: Vec<String> = self
            .services
            .iter()
            .filter(|(_, s)| s.key() == name)
            .map(|(k, _)| k.clone())
            .collect();
        for k in &by_key {
            self.services.remove(k);
        }
        if by_key.is_empty() {
            tracing::debug!(
                name,
                "removal of an address this source does not hold; ignored"
            );
        }
        !by_key.is_empty()
    }
}

fn upsert<T: PartialEq>(map: &mut BTreeMap<String, Arc<T>>, name: String, value: Arc<T>) -> bool {
    if map.get(&name).is_some_and(|old| **old == *value) {
        return false;
    }
    map.insert(name, value);
    true
}

/// The union of every source's contribution, keyed as the snapshot keys them; on a conflict the source of higher
/// precedence wins (equal precedence: the source whose id sorts last).
pub(crate) struct Merged {
    pub(crate) workloads: BTreeMap<String, Arc<Workload>>,
    pub(crate) services: BTreeMap<String, Arc<Service>>,
    pub(crate) policies: BTreeMap<String, Arc<Policy>>,
    pub(crate) plugins: BTreeMap<String, Arc<PluginSpec>>,
    /// Resources defined by more than one source.
    pub(crate) conflicts: usize,
}

pub(crate) fn merge(sources: &BTreeMap<String, Contribution>) -> Merged {
    let mut order: Vec<(&String, &Contribution)> = sources.iter().collect();
    order.sort_by_key(|(id, c)| (c.precedence, (*id).clone()));
    let mut m = Merged {
        workloads: BTreeMap::new(),
        services: BTreeMap::new(),
        policies: BTreeMap::new(),
        plugins: BTreeMap::new(),
        conflicts: 0,
    };
    for (_, c) in order {
        for w in c.workloads.values() {
            m.conflicts += usize::from(m.workloads.insert(w.uid.clone(), w.clone()).is_some());
        }
        for s in c.services.values() {
            m.conflicts += usize::from(m.services.insert(s.key(), s.clone()).is_some());
        }
        for p in c.policies.values() {
            m.conflicts += usize::from(m.policies.insert(p.key(), p.clone()).is_some());
        }
        for p in c.plugins.values() {
            m.conflicts += usize::from(m.plugins.insert(p.name.clone(), p.clone()).is_some());
        }
    }
    m
}
