//! Istio's xDS resources (`istio.workload.Address`, `istio.security.Authorization`) and plugins as ECDS extension
//! configs ([`plugin`]) converted into weft's model, and back ([`encode`]),
//! with the checks the local file applies (`crate::validate`): a resource that fails one is refused with the proto
//! field path and the reason (the xDS client NACKs it), and everything else in the response applies.
//!
//! Names are taken as they are (see `crate::validate`). Where ztunnel is lenient in ways that change what a policy means (a CIDR or string match it cannot read is
//! dropped, a port above 65535 is truncated), weft refuses the resource instead: dropping one value of an ALLOW
//! rule's list widens it.

mod authorization;
pub mod encode;
mod gateway;
pub mod plugin;
mod service;
mod workload;

use std::net::IpAddr;
use std::sync::Arc;

use weft_proto::istio::workload::{Address, address};

pub use authorization::authorization;
pub use service::service;
pub use workload::workload;

use crate::sources::{Change, Resource};

/// Why an xDS resource was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct InvalidResource {
    /// The proto field path (e.g. `workload.addresses[1]`).
    pub field: String,
    /// What is wrong with it.
    pub reason: String,
}

impl InvalidResource {
    pub(crate) fn new(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            reason: reason.into(),
        }
    }

    /// Prefix the field path with `outer` (`outer.field`).
    pub(crate) fn within(mut self, outer: &str) -> Self {
        self.field = format!("{outer}.{}", self.field);
        self
    }
}

/// `f(value)` mapped to an error at `field`.
pub(crate) fn check<T>(field: &str, r: Result<T, String>) -> Result<T, InvalidResource> {
    r.map_err(|reason| InvalidResource::new(field, reason))
}

/// Raw IPv4 (4 bytes) or IPv6 (16 bytes).
pub(crate) fn ip(bytes: &[u8]) -> Result<IpAddr, String> {
    match bytes.len() {
        4 => Ok(IpAddr::from(
            <[u8; 4]>::try_from(bytes).map_err(|e| e.to_string())?,
        )),
        16 => Ok(IpAddr::from(
            <[u8; 16]>::try_from(bytes).map_err(|e| e.to_string())?,
        )),
        n => Err(format!(
            "{n} bytes is not an IP address (4 for IPv4, 16 for IPv6)"
        )),
    }
}

/// An Address resource called `name` as a change of its source.
pub fn address_change(name: &str, a: Address) -> Result<Change, InvalidResource> {
    let resource = match a.r#type {
        Some(address::Type::Workload(w)) => {
            Resource::Workload(Arc::new(workload(w).map_err(|e| e.within("workload"))?))
        }
        Some(address::Type::Service(s)) => {
            Resource::Service(Arc::new(service(s).map_err(|e| e.within("service"))?))
        }
        None => {
            return Err(InvalidResource::new(
                "type",
                "the Address holds neither a workload nor a service",
            ));
        }
    };
    Ok(Change::Upsert {
        name: name.to_owned(),
        resource,
    })
}

/// An Authorization resource called `name` as a change of its source.
pub fn authorization_change(
    name: &str,
    a: weft_proto::istio::security::Authorization,
) -> Result<Change, InvalidResource> {
    Ok(Change::Upsert {
        name: name.to_owned(),
        resource: Resource::Policy(Arc::new(authorization(a)?)),
    })
}
