//! The mesh source: a file in ztunnel's local-config format, read and watched by weft-state's own parser and
//! watcher (the same validation a node applies to its local file), converted into `istio.workload.Address`
//! (workloads by uid, services by `namespace/hostname`) and `istio.security.Authorization` (`namespace/name`).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use weft_proto::istio::workload::{Address, address};
use weft_state::xds::encode;
use weft_state::{MeshState, StateStore};

use crate::ads::publish::Publisher;
use crate::ads::resources::{Resource, TypeSet};

/// The resources a mesh state is served as: (addresses, authorizations).
pub fn resources(state: &MeshState) -> (TypeSet, TypeSet) {
    let mut addresses = TypeSet::new();
    for (uid, w) in &state.workloads {
        let a = Address {
            r#type: Some(address::Type::Workload(encode::workload(w))),
        };
        addresses.insert(uid.clone(), Arc::new(Resource::address(uid.clone(), &a)));
    }
    for (key, s) in &state.services {
        let a = Address {
            r#type: Some(address::Type::Service(encode::service(s))),
        };
        addresses.insert(key.clone(), Arc::new(Resource::address(key.clone(), &a)));
    }
    let authorizations = state
        .policies
        .iter()
        .map(|(key, p)| {
            let r = Resource::authorization(key.clone(), &encode::authorization(p));
            (key.clone(), Arc::new(r))
        })
        .collect();
    (addresses, authorizations)
}

/// Load `path` now (an error is returned for the caller to report at startup), publish it, and keep publishing
/// each good edit the watcher applies. Runs until aborted.
pub fn watch_mesh(
    path: PathBuf,
    publisher: Arc<Publisher>,
    interval: Duration,
) -> Result<tokio::task::JoinHandle<()>, weft_state::ConfigError> {
    let store = Arc::new(StateStore::new());
    weft_state::load_into(&path, &store)?;
    publisher.set_mesh_store(store.clone());
    let mut changes = store.subscribe();
    let publish = move |store: &StateStore| {
        let state = store.current();
        if !state.plugins.is_empty() {
            tracing::warn!(
                plugins = state.plugins.len(),
                "the mesh file's plugins section is not served (plugins come from the plugin directory)"
            );
        }
        let (addresses, authorizations) = resources(&state);
        publisher.publish_mesh(addresses, authorizations);
    };
    publish(&store);
    let watcher = weft_state::watch_file(path, store.clone(), interval);
    Ok(tokio::spawn(async move {
        let _watcher = AbortOnDrop(watcher);
        while changes.changed().await.is_ok() {
            publish(&store);
        }
    }))
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
