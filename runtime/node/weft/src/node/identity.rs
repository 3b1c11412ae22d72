//! The node's identity: the CA client and the certificate manager, and the set of identities it may hold (the
//! HBONE workloads of this node; in-pod mode: of the pods weft serves), kept as the state and the pods change.

use std::collections::HashSet;
use std::sync::Arc;

use anyhow::Context;
use tokio::task::JoinHandle;
use weft_identity::{SecretManager, SpiffeId};
use weft_state::{StateStore, TunnelProtocol};

use crate::config::{CaKind, NodeConfig};

/// The certificate manager, with the CA `config` names (built on the current runtime, so CA calls run there).
pub(super) fn start(config: &NodeConfig) -> anyhow::Result<Arc<SecretManager>> {
    let ca = weft_identity::select::build_ca(&config.ca_settings())
        .context("setting up the CA client")?;
    if config.ca.ca_kind == CaKind::Local {
        tracing::warn!(ca_dir = %config.ca_dir.as_deref().unwrap_or(std::path::Path::new("-")).display(),
            "local CA mode: the CA's private key is on this node, so whoever takes this node can mint any identity \
             in the mesh; use it on a single machine or for development only (a cluster: --ca-kind istio or k8s-csr)");
    }
    Ok(SecretManager::new(ca, config.manager_config()))
}

/// Identities of the HBONE workloads on this node (in-pod mode: of the pods weft serves): the only ones this
/// node may hold certificates for.
fn local_identities(
    state: &StateStore,
    node: &str,
    inpod: Option<&weft_inpod::Status>,
) -> HashSet<SpiffeId> {
    state
        .current()
        .local_workloads(node)
        .filter(|w| w.protocol == TunnelProtocol::Hbone)
        .filter(|w| inpod.is_none_or(|p| crate::inpod::InPod::serves(p, node, w)))
        .filter_map(
            |w| match SpiffeId::new(&w.trust_domain, &w.namespace, &w.service_account) {
                Ok(id) => Some(id),
                Err(e) => {
                    tracing::warn!(workload = %w.uid, error = %e, "workload has no valid identity");
                    None
                }
            },
        )
        .collect()
}

/// Keeps the manager's identities to the local ones: now, and whenever the state (`changes`, subscribed before
/// any source could change it) or, in-pod, the pods change.
pub(super) fn keep_local(
    identity: &Arc<SecretManager>,
    state: &Arc<StateStore>,
    node: &str,
    inpod: Option<Arc<weft_inpod::Status>>,
    mut changes: tokio::sync::watch::Receiver<u64>,
) -> JoinHandle<()> {
    identity.retain(&local_identities(state, node, inpod.as_deref()));
    let (state, identity, node) = (state.clone(), identity.clone(), node.to_owned());
    let mut pods = inpod.as_ref().map(|s| s.subscribe());
    tokio::spawn(async move {
        loop {
            // In-pod mode: the set also changes when pods come and go.
            let pods_changed = async {
                match pods.as_mut() {
                    Some(p) => p.changed().await.is_ok(),
                    None => std::future::pending().await,
                }
            };
            let alive = tokio::select! {
                r = changes.changed() => r.is_ok(),
                ok = pods_changed => ok,
            };
            if !alive {
                return;
            }
            identity.retain(&local_identities(&state, &node, inpod.as_deref()));
        }
    })
}
