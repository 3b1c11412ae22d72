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
    /// `name` and `version` once more as shared strings, what each stream that sends it keeps of it
    /// ([`weft_xds::server::ServedResource::ids`]): one copy for the whole fleet, not one per node. Set by the
    /// constructors; a resource built otherwise must keep them equal to `name` and `version`.
    pub(crate) ids: (Arc<str>, Arc<str>),
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
        Self::with_version(name, version, body)
    }

    /// A resource of this name, version and body.
    pub fn with_version(name: String, version: String, body: prost_types::Any) -> Self {
        let ids = (Arc::from(name.as_str()), Arc::from(version.as_str()));
        Self {
            name,
            version,
            body,
            ids,
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
        Self::with_version(name, version, body)
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
    fn ids(&self, name: &str) -> (Arc<str>, Arc<str>) {
        if *self.ids.0 == *name {
            (self.ids.0.clone(), self.ids.1.clone())
        } else {
            (Arc::from(name), self.ids.1.clone())
        }
    }
}

/// What one node should have of one resource: `Serve` this version, or `Keep` whatever it runs (neither sent nor
/// removed).
pub type Desired = weft_xds::server::Offered<Arc<Resource>>;

/// What every node is offered of a type every node gets whole (Address, Authorization): built once per snapshot, on
/// first use, and shared by every stream, rather than built by each stream for each push. Not part of what a
/// snapshot says: a clone starts empty (a clone is the next snapshot being built, whose contents change), and it
/// never makes two snapshots differ.
#[derive(Debug, Default)]
pub struct OfferCache {
    addresses: std::sync::OnceLock<Arc<BTreeMap<String, Desired>>>,
    authorizations: std::sync::OnceLock<Arc<BTreeMap<String, Desired>>>,
}

impl Clone for OfferCache {
    fn clone(&self) -> Self {
        Self::default()
    }
}

impl PartialEq for OfferCache {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

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
    /// The snapshot version at which each served type last changed (what a stream needs no new diff for).
    pub changed: TypeVersions,
    /// The offers of the whole types, once built.
    pub offers: OfferCache,
}

/// Per served type, the snapshot version at which it last changed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TypeVersions {
    /// Addresses.
    pub addresses: u64,
    /// Authorizations.
    pub authorizations: u64,
    /// Plugins (who gets which version included).
    pub plugins: u64,
}

/// The type URLs weft control serves.
pub const SERVED_TYPES: [&str; 3] = [
    type_url::ADDRESS,
    type_url::AUTHORIZATION,
    type_url::EXTENSION_CONFIG,
];

impl Snapshot {
    /// The snapshot version at which what `type_url` serves last changed (0: never; an unknown type: 0).
    pub fn changed_at(&self, type_url: &str) -> u64 {
        match type_url {
            type_url::ADDRESS => self.changed.addresses,
            type_url::AUTHORIZATION => self.changed.authorizations,
            type_url::EXTENSION_CONFIG => self.changed.plugins,
            _ => 0,
        }
    }

    /// Whether `type_url` is one weft control serves.
    pub fn serves(type_url: &str) -> bool {
        SERVED_TYPES.contains(&type_url)
    }

    /// What `node` should have of `type_url`, by name (for the types every node gets whole, one map shared by
    /// every node).
    pub fn desired(&self, type_url: &str, node: &NodeKey) -> Arc<BTreeMap<String, Desired>> {
        let plain = |set: &TypeSet| {
            Arc::new(
                set.iter()
                    .map(|(k, v)| (k.clone(), Desired::Serve(v.clone())))
                    .collect(),
            )
        };
        match type_url {
            type_url::ADDRESS => self
                .offers
                .addresses
                .get_or_init(|| plain(&self.addresses))
                .clone(),
            type_url::AUTHORIZATION => self
                .offers
                .authorizations
                .get_or_init(|| plain(&self.authorizations))
                .clone(),
            type_url::EXTENSION_CONFIG => Arc::new(
                self.plugins
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
                            (Some(sel), _) if sel.matches(node) => {
                                Desired::Serve(p.current.clone())
                            }
                            (Some(_), Some(base)) => Desired::Serve(base.clone()),
                            (Some(_), None) => Desired::Keep,
                        };
                        (name.clone(), d)
                    })
                    .collect(),
            ),
            _ => Arc::new(BTreeMap::new()),
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
