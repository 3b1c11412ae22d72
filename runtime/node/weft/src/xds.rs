//! The node's xDS sources: the mesh source (istiod or `weft-control`) and the node id,
//! the handlers that turn Address and Authorization resources into changes of the state store (checked by the same
//! functions as the local file), and `/config_dump` per source (readiness and metrics are `weft_xds::status`'s).

use std::sync::Arc;

use futures_util::future::BoxFuture;
use serde_json::json;
use tokio::sync::watch;
use weft_proto::istio::security::Authorization;
use weft_proto::istio::workload::Address;
use weft_proto::type_url::{ADDRESS, AUTHORIZATION};
use weft_state::{Change, Collection, StateStore};
use weft_xds::{AdsClient, Delta, Handler, NodeInfo, Rejection, SourceConfig, XdsHandle};

use crate::config::NodeConfig;

/// The mesh source's id in the state store.
pub const MESH_SOURCE: &str = "xds:mesh";

/// The cluster id as ztunnel takes it: `ISTIO_META_CLUSTER_ID`, else `--cluster-id` (`CLUSTER_ID`). Resolved
/// once at start; the CA's `clusterid` header, the xDS `clusterid` header and node metadata all use the result.
pub fn cluster_id(meta_env: Option<String>, flag: &str) -> String {
    meta_env
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| flag.to_owned())
}

/// The Istio release weft stands in for a ztunnel of, sent as node metadata `ISTIO_VERSION` unless
/// `ISTIO_META_ISTIO_VERSION` says otherwise (the chart and the image set it, as Istio's ztunnel image does): istiod
/// warns on every connect of a proxy without it, and `istioctl proxy-status` shows it. weft's xDS and CA protos
/// follow this release's APIs.
pub const ISTIO_VERSION: &str = "1.32.0";

/// The node id inputs: the flags, then `ISTIO_META_*` / `ISTIO_METAJSON_*` from the environment, the cluster id
/// (already resolved, [`cluster_id`]) as `CLUSTER_ID`, the node's network (`--network`, `NETWORK`) as `NETWORK`
/// when set, and [`ISTIO_VERSION`] as `ISTIO_VERSION`, each unless the environment set it.
pub fn node_info(config: &NodeConfig) -> NodeInfo {
    node_info_with_env(config, std::env::vars())
}

/// [`node_info`] with the environment given.
fn node_info_with_env(
    config: &NodeConfig,
    env: impl IntoIterator<Item = (String, String)>,
) -> NodeInfo {
    let args = &config.xds;
    let mut node = NodeInfo {
        instance_ip: args.instance_ip.clone(),
        pod_name: args.pod_name.clone(),
        pod_namespace: args.pod_namespace.clone(),
        node_name: config.node.clone(),
        ..Default::default()
    }
    .with_env(env)
    .default_metadata("CLUSTER_ID", &config.cluster_id);
    if !config.network.is_empty() {
        node = node.default_metadata("NETWORK", &config.network);
    }
    node.default_metadata("ISTIO_VERSION", ISTIO_VERSION)
}

/// Start the mesh source, if configured (must be called within the control runtime). Its Authorization handler
/// answers once the plugin host runs the state version that carries the change (`plugins_applied`).
pub fn start(
    config: &NodeConfig,
    state: &Arc<StateStore>,
    plugins_applied: watch::Receiver<u64>,
) -> anyhow::Result<Vec<XdsHandle>> {
    let args = &config.xds;
    let Some(address) = &args.xds_address else {
        return Ok(Vec::new());
    };
    state.register_source(MESH_SOURCE, weft_state::XDS_PRECEDENCE);
    let mut cfg = SourceConfig::new("mesh", address.clone());
    cfg.root_cert = args.xds_root_cert.clone();
    cfg.token_file = args.xds_token_file.clone();
    cfg.server_name = args.xds_server_name.clone();
    cfg.cluster_id = config.cluster_id.clone();
    cfg.node = node_info(config);
    tracing::info!(address, node_id = %cfg.node.id(), "mesh source: Delta ADS");
    let handle = AdsClient::new(cfg)
        .subscribe(
            ADDRESS,
            Arc::new(StateHandler {
                store: state.clone(),
                source: MESH_SOURCE,
                kind: Kind::Address,
                applied: None,
            }),
        )
        .subscribe(
            AUTHORIZATION,
            Arc::new(StateHandler {
                store: state.clone(),
                source: MESH_SOURCE,
                kind: Kind::Authorization,
                applied: Some(plugins_applied),
            }),
        )
        .start()?;
    Ok(vec![handle])
}

#[derive(Debug, Clone, Copy)]
enum Kind {
    Address,
    Authorization,
}

/// Converts one type's resources into changes of a source of the state store.
struct StateHandler {
    store: Arc<StateStore>,
    source: &'static str,
    kind: Kind,
    /// For policies: the state version the plugin host runs; the answer waits for it.
    applied: Option<watch::Receiver<u64>>,
}

impl StateHandler {
    fn convert(&self, delta: Delta) -> (Vec<Change>, Vec<Rejection>) {
        let collection = match self.kind {
            Kind::Address => Collection::Address,
            Kind::Authorization => Collection::Authorization,
        };
        let mut changes: Vec<Change> = delta
            .removals
            .into_iter()
            .map(|name| Change::Remove { collection, name })
            .collect();
        let mut refused = Vec::new();
        for u in delta.upserts {
            let converted = match self.kind {
                Kind::Address => u.decode::<Address>(ADDRESS).and_then(|a| {
                    weft_state::xds::address_change(&u.name, a)
                        .map_err(|e| Rejection::new(&u.name, e))
                }),
                Kind::Authorization => u.decode::<Authorization>(AUTHORIZATION).and_then(|a| {
                    weft_state::xds::authorization_change(&u.name, a)
                        .map_err(|e| Rejection::new(&u.name, e))
                }),
            };
            match converted {
                Ok(c) => changes.push(c),
                Err(r) => refused.push(r),
            }
        }
        (changes, refused)
    }
}

impl Handler for StateHandler {
    fn apply(&self, delta: Delta) -> BoxFuture<'_, Vec<Rejection>> {
        Box::pin(async move {
            let (upserts, removals) = (delta.upserts.len(), delta.removals.len());
            let (changes, refused) = self.convert(delta);
            let applied = self.store.apply_changes(self.source, changes);
            if applied.changed {
                tracing::info!(source = self.source, kind = ?self.kind, version = applied.version, upserts,
                    removals, refused = refused.len(), "xDS update applied");
                if let Some(rx) = &self.applied {
                    let mut rx = rx.clone();
                    // Until the plugin host runs this version (or a later one), the policy is not in force yet.
                    let _ = rx.wait_for(|v| *v >= applied.version).await;
                }
            }
            refused
        })
    }
}

/// `/config_dump`'s `sources`: what each source holds, and each xDS source's stream and ACK/NACK state.
pub fn dump(state: &StateStore, handles: &[XdsHandle]) -> serde_json::Value {
    let counts = state.source_counts();
    let xds: Vec<serde_json::Value> = handles
        .iter()
        .map(|h| {
            let mut v = serde_json::to_value(h.status()).unwrap_or_default();
            if let (Some(obj), Some(c)) =
                (v.as_object_mut(), counts.get(&format!("xds:{}", h.name())))
            {
                obj.insert("held".into(), serde_json::to_value(c).unwrap_or_default());
            }
            v
        })
        .collect();
    json!({
        "file": counts.get(weft_state::LOCAL_FILE),
        "xds": xds,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `--network` (env `NETWORK`, ztunnel's name) reaches the node metadata istiod reads as `NETWORK`, unless
    /// `ISTIO_META_NETWORK` says otherwise; unset, no `NETWORK` key is sent (as ztunnel sends none).
    #[test]
    #[allow(clippy::unwrap_used)] // test code: a panic fails the test
    fn the_network_is_sent_as_node_metadata() {
        use prost_types::value::Kind;
        let network = |config: &NodeConfig, env: &[(&str, &str)]| {
            let env = env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned()));
            let node = node_info_with_env(config, env).to_proto();
            match node.metadata?.fields.get("NETWORK")?.kind.clone()? {
                Kind::StringValue(s) => Some(s),
                other => panic!("NETWORK is not a string: {other:?}"),
            }
        };
        let with = crate::config::tests::parse(&["--network", "net-east"]).unwrap();
        assert_eq!(with.network, "net-east");
        assert_eq!(with.proxy_config().network, "net-east");
        assert_eq!(network(&with, &[]).as_deref(), Some("net-east"));
        assert_eq!(
            network(&with, &[("ISTIO_META_NETWORK", "meta")]).as_deref(),
            Some("meta")
        );
        let without = crate::config::tests::parse(&[]).unwrap();
        assert_eq!(without.network, "");
        assert_eq!(network(&without, &[]), None);
    }
}
