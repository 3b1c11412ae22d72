//! What a server offers one stream of one type: per name, a resource to serve (its version and body) or "keep"
//! (neither sent nor removed: the node keeps whatever it has).

use std::sync::Arc;

/// A resource as the protocol sees it: a version and a body. The name is the key it is offered under.
pub trait ServedResource {
    /// Its version (a node that has this version is not sent it again).
    fn version(&self) -> &str;
    /// The resource.
    fn body(&self) -> &prost_types::Any;
    /// Its name (the key it is offered under) and version as shared strings: what a stream keeps of every resource
    /// its node has. A resource that holds them shared (allocated once, however many streams send it) saves every
    /// stream its own copies; by default they are allocated.
    fn ids(&self, name: &str) -> (Arc<str>, Arc<str>) {
        (Arc::from(name), Arc::from(self.version()))
    }
}

impl<T: ServedResource + ?Sized> ServedResource for Arc<T> {
    fn version(&self) -> &str {
        (**self).version()
    }
    fn body(&self) -> &prost_types::Any {
        (**self).body()
    }
    fn ids(&self, name: &str) -> (Arc<str>, Arc<str>) {
        (**self).ids(name)
    }
}

impl<T: ServedResource + ?Sized> ServedResource for &T {
    fn version(&self) -> &str {
        (**self).version()
    }
    fn body(&self) -> &prost_types::Any {
        (**self).body()
    }
    fn ids(&self, name: &str) -> (Arc<str>, Arc<str>) {
        (**self).ids(name)
    }
}

/// The plainest [`ServedResource`]: a version and a body.
#[derive(Debug, Clone, PartialEq)]
pub struct Versioned {
    /// The version.
    pub version: String,
    /// The resource.
    pub body: prost_types::Any,
}

impl Versioned {
    /// A resource of this version.
    pub fn new(version: impl Into<String>, body: prost_types::Any) -> Self {
        Self {
            version: version.into(),
            body,
        }
    }
}

impl ServedResource for Versioned {
    fn version(&self) -> &str {
        &self.version
    }
    fn body(&self) -> &prost_types::Any {
        &self.body
    }
}

/// What a server offers one node under one name.
#[derive(Debug, Clone, PartialEq)]
pub enum Offered<R> {
    /// This resource (sent when the node does not have its version).
    Serve(R),
    /// Whatever the node has: neither sent nor removed.
    Keep,
}
