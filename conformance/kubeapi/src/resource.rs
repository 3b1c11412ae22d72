//! The resources the stand-in serves: their group, version, kind and URL name, and which API conventions apply to
//! each (a `status` subresource, `metadata.generation`, what a delete answers with).

/// The resources the stand-in serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Resource {
    /// `weftplugins.weft.dev/v1alpha1`, namespaced, with a `status` subresource and a `metadata.generation`.
    WeftPlugin,
    /// `leases.coordination.k8s.io/v1`, namespaced.
    Lease,
    /// Core `v1` Pods, namespaced, with a `status` subresource (no `metadata.generation`).
    Pod,
    /// Core `v1` Secrets, namespaced; `stringData` is folded into `data` on writes.
    Secret,
    /// Core `v1` ConfigMaps, namespaced.
    ConfigMap,
}

impl Resource {
    /// Every resource served.
    pub const ALL: [Resource; 5] = [
        Resource::WeftPlugin,
        Resource::Lease,
        Resource::Pod,
        Resource::Secret,
        Resource::ConfigMap,
    ];

    /// The API group (empty for the core group).
    pub fn group(self) -> &'static str {
        match self {
            Resource::WeftPlugin => "weft.dev",
            Resource::Lease => "coordination.k8s.io",
            Resource::Pod | Resource::Secret | Resource::ConfigMap => "",
        }
    }

    /// The API version within the group.
    pub fn version(self) -> &'static str {
        match self {
            Resource::WeftPlugin => "v1alpha1",
            Resource::Lease | Resource::Pod | Resource::Secret | Resource::ConfigMap => "v1",
        }
    }

    /// `group/version` as objects carry it (`v1` alone for the core group).
    pub fn api_version(self) -> String {
        match self.group() {
            "" => self.version().to_owned(),
            group => format!("{group}/{}", self.version()),
        }
    }

    /// The object kind.
    pub fn kind(self) -> &'static str {
        match self {
            Resource::WeftPlugin => "WeftPlugin",
            Resource::Lease => "Lease",
            Resource::Pod => "Pod",
            Resource::Secret => "Secret",
            Resource::ConfigMap => "ConfigMap",
        }
    }

    /// The plural resource name in URLs.
    pub fn plural(self) -> &'static str {
        match self {
            Resource::WeftPlugin => "weftplugins",
            Resource::Lease => "leases",
            Resource::Pod => "pods",
            Resource::Secret => "secrets",
            Resource::ConfigMap => "configmaps",
        }
    }

    /// The URL prefix of its group and version: `/api/v1` for the core group, `/apis/{group}/{version}` otherwise.
    pub fn prefix(self) -> String {
        match self.group() {
            "" => format!("/api/{}", self.version()),
            group => format!("/apis/{group}/{}", self.version()),
        }
    }

    /// The collection's path in one namespace (`/api/v1/namespaces/{ns}/pods`).
    pub fn collection(self, namespace: &str) -> String {
        format!("{}/namespaces/{namespace}/{}", self.prefix(), self.plural())
    }

    /// Whether the resource has a `status` subresource: writes to the main resource leave `status` alone.
    pub fn has_status(self) -> bool {
        matches!(self, Resource::WeftPlugin | Resource::Pod)
    }

    /// Whether objects carry a `metadata.generation`, bumped by spec changes.
    pub fn has_generation(self) -> bool {
        matches!(self, Resource::WeftPlugin)
    }

    /// Whether a DELETE answers with the deleted object (custom resources, Pods) rather than a Success Status.
    pub fn delete_returns_object(self) -> bool {
        matches!(self, Resource::WeftPlugin | Resource::Pod)
    }

    /// `plural.group` as messages name it (`weftplugins.weft.dev`; `pods` for the core group).
    pub fn qualified(self) -> String {
        match self.group() {
            "" => self.plural().to_owned(),
            group => format!("{}.{group}", self.plural()),
        }
    }

    /// The resource a URL's group (empty for `/api`), version and plural name.
    pub fn from_path(group: &str, version: &str, plural: &str) -> Option<Resource> {
        Resource::ALL
            .into_iter()
            .find(|r| r.group() == group && r.version() == version && r.plural() == plural)
    }

    /// The resource an object's `apiVersion` and `kind` name.
    pub fn from_kind(api_version: &str, kind: &str) -> Option<Resource> {
        Resource::ALL
            .into_iter()
            .find(|r| r.api_version() == api_version && r.kind() == kind)
    }
}
