//! What weft control serves: resources by type URL and name, each with a version derived from its content (so a
//! restarted server gives the same versions and a reconnecting node's `initial_resource_versions` still match),
//! and the snapshot a stream diffs against what it has sent to its node.

use std::collections::BTreeMap;
use std::sync::Arc;

use prost::Message as _;
use sha2::{Digest, Sha256};
use weft_proto::istio::security::Authorization;
use weft_proto::istio::workload::{Address, address};
use weft_proto::type_url;

/// One named, versioned resource, encoded once and shared by every stream that sends it.
#[derive(Debug, Clone, PartialEq)]
pub struct Resource {
    /// The resource name (workload uid, `namespace/hostname`, `namespace/name`, plugin name).
    pub name: String,
    /// Content version: the first 16 hex digits of the sha256 of a canonical encoding.
    pub version: String,
    /// The resource itself.
    pub body: prost_types::Any,
}

/// The first 16 hex digits of a sha256.
fn short_digest(parts: &[&[u8]]) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update((p.len() as u64).to_be_bytes());
        h.update(p);
    }
    hex::encode(&h.finalize()[..8])
}

impl Resource {
    /// A resource whose version is the digest of `body`'s bytes. Only for messages without map fields (prost
    /// encodes a map in hash order, which differs between processes).
    pub fn new(name: String, body: prost_types::Any) -> Self {
        let version = short_digest(&[body.type_url.as_bytes(), &body.value]);
        Self {
            name,
            version,
            body,
        }
    }

    /// An `istio.workload.Address`, versioned over a canonical form (its workload's `services` map in key order).
    pub fn address(name: String, address: &Address) -> Self {
        let body = weft_proto::to_any(type_url::ADDRESS, address);
        let version = match &address.r#type {
            Some(address::Type::Workload(w)) if !w.services.is_empty() => {
                let mut without = w.clone();
                let services: BTreeMap<_, _> = std::mem::take(&mut without.services)
                    .into_iter()
                    .map(|(k, v)| (k, v.encode_to_vec()))
                    .collect();
                let rest = without.encode_to_vec();
                let mut parts: Vec<&[u8]> = vec![type_url::ADDRESS.as_bytes(), &rest];
                for (k, v) in &services {
                    parts.push(k.as_bytes());
                    parts.push(v);
                }
                short_digest(&parts)
            }
            _ => short_digest(&[body.type_url.as_bytes(), &body.value]),
        };
        Self {
            name,
            version,
            body,
        }
    }

    /// An `istio.security.Authorization`.
    pub fn authorization(name: String, policy: &Authorization) -> Self {
        Self::new(name, weft_proto::to_any(type_url::AUTHORIZATION, policy))
    }
}

/// Resources of one type by name.
pub type TypeSet = BTreeMap<String, Arc<Resource>>;

/// Which nodes get a staged plugin version: a node matches by its node name (`NODE_NAME` metadata) or its full
/// node id.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize)]
pub struct NodeSelector(pub Vec<String>);

impl NodeSelector {
    /// Whether the node is selected.
    pub fn matches(&self, node: &NodeKey) -> bool {
        self.0
            .iter()
            .any(|n| *n == node.name || (!node.id.is_empty() && *n == node.id))
    }
}

/// How a node is named for staged rollout.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NodeKey {
    /// The node's xDS node id.
    pub id: String,
    /// Its node name (`NODE_NAME` metadata; the node id when absent).
    pub name: String,
}

/// What the plugin directory says about one plugin, for the status endpoint.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PluginInfo {
    /// The file it came from.
    pub file: String,
    /// Where the code is (`file://` inlined, `https://`, `oci://`).
    pub url: String,
    /// The code's sha256, when known (always for inlined code).
    pub sha256: Option<String>,
}

/// One plugin: the version the directory describes, which nodes get it, and the version every other node keeps.
#[derive(Debug, Clone, PartialEq)]
pub struct PluginEntry {
    /// The version the file describes now.
    pub current: Arc<Resource>,
    /// Its description.
    pub info: PluginInfo,
    /// Only these nodes get `current`; `None`: every node.
    pub nodes: Option<NodeSelector>,
    /// The nodes the plugin is for at all (where the workloads it selects run); any other node is neither sent
    /// it nor left with it. `None`: every node (a plugin file, or a mesh-wide resource without a selector).
    pub placement: Option<NodeSelector>,
    /// The last version this server served to every node, which unselected nodes keep during a staged rollout.
    /// `None` (a staged plugin this server never served unrestricted): an unselected node is neither sent the
    /// plugin nor told to remove the version it runs.
    pub base: Option<Arc<Resource>>,
    /// Description of `base`.
    pub base_info: Option<PluginInfo>,
    /// The staged rollout the resource asks for (weft control then sets `nodes`, `base` and `shadowing`).
    pub plan: Option<Arc<crate::rollout::plan::Plan>>,
    /// While a stage runs `current` as a shadow: the stage's new nodes, and what they get (`base` with `current`'s
    /// code and configuration as its shadow).
    pub shadowing: Option<(NodeSelector, Arc<Resource>)>,
}

impl weft_xds::server::ServedResource for Resource {
    fn version(&self) -> &str {
        &self.version
    }
    fn body(&self) -> &prost_types::Any {
        &self.body
    }
}

/// What one node should have of one resource: `Serve` this version, or `Keep` whatever it runs (neither sent nor
/// removed).
pub type Desired = weft_xds::server::Offered<Arc<Resource>>;

/// Everything served, at one moment. Immutable; a change publishes a new one.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Snapshot {
    /// Increases with every change (the responses' `system_version_info`).
    pub version: u64,
    /// Workloads and services (`istio.workload.Address`).
    pub addresses: TypeSet,
    /// Policies (`istio.security.Authorization`).
    pub authorizations: TypeSet,
    /// Plugins (`envoy.config.core.v3.TypedExtensionConfig` with a `weft.plugin.v1.WeftPlugin`).
    pub plugins: BTreeMap<String, PluginEntry>,
}

/// The type URLs weft control serves.
pub const SERVED_TYPES: [&str; 3] = [
    type_url::ADDRESS,
    type_url::AUTHORIZATION,
    type_url::EXTENSION_CONFIG,
];

impl Snapshot {
    /// Whether `type_url` is one weft control serves.
    pub fn serves(type_url: &str) -> bool {
        SERVED_TYPES.contains(&type_url)
    }

    /// What `node` should have of `type_url`, by name.
    pub fn desired(&self, type_url: &str, node: &NodeKey) -> BTreeMap<String, Desired> {
        let plain = |set: &TypeSet| {
            set.iter()
                .map(|(k, v)| (k.clone(), Desired::Serve(v.clone())))
                .collect()
        };
        match type_url {
            type_url::ADDRESS => plain(&self.addresses),
            type_url::AUTHORIZATION => plain(&self.authorizations),
            type_url::EXTENSION_CONFIG => self
                .plugins
                .iter()
                .filter(|(_, p)| p.placement.as_ref().is_none_or(|sel| sel.matches(node)))
                .map(|(name, p)| {
                    let d = match (&p.nodes, &p.base) {
                        _ if let Some((sel, shadowing)) = &p.shadowing
                            && sel.matches(node) =>
                        {
                            Desired::Serve(shadowing.clone())
                        }
                        (None, _) => Desired::Serve(p.current.clone()),
                        (Some(sel), _) if sel.matches(node) => Desired::Serve(p.current.clone()),
                        (Some(_), Some(base)) => Desired::Serve(base.clone()),
                        (Some(_), None) => Desired::Keep,
                    };
                    (name.clone(), d)
                })
                .collect(),
            _ => BTreeMap::new(),
        }
    }

    /// The description of a plugin version this snapshot serves (current or base).
    pub fn plugin_info(&self, name: &str, version: &str) -> Option<&PluginInfo> {
        let p = self.plugins.get(name)?;
        if p.current.version == version {
            Some(&p.info)
        } else if p.base.as_ref().is_some_and(|b| b.version == version)
            || p.shadowing
                .as_ref()
                .is_some_and(|(_, s)| s.version == version)
        {
            p.base_info.as_ref()
        } else {
            None
        }
    }
}

/// Carry plugin bases over from `old` into freshly loaded `new` entries: an unrestricted entry is its own base; a
/// staged one keeps the old base, or takes the old entry as base when that one was unrestricted.
pub fn carry_bases(old: &BTreeMap<String, PluginEntry>, new: &mut BTreeMap<String, PluginEntry>) {
    for (name, entry) in new.iter_mut() {
        if entry.plan.is_some() {
            // weft control's staged rollout sets the base itself.
            continue;
        }
        if entry.nodes.is_none() {
            entry.base = None;
            entry.base_info = None;
            continue;
        }
        if let Some(prev) = old.get(name) {
            if prev.nodes.is_none() {
                entry.base = Some(prev.current.clone());
                entry.base_info = Some(prev.info.clone());
            } else {
                entry.base = prev.base.clone();
                entry.base_info = prev.base_info.clone();
            }
        }
    }
}
