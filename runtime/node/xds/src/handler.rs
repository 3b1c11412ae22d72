//! The contract between the client and what consumes a type: a [`Handler`] per type URL receives each response as
//! upserts and removals, applies what it can, and returns the resources it refused with their reasons. The client
//! ACKs when nothing was refused and NACKs otherwise (`error_detail` lists every `name: reason`), and only once the
//! handler has returned.

use futures_util::future::BoxFuture;
use prost_types::Any;

/// A resource the server added or changed.
#[derive(Debug, Clone, PartialEq)]
pub struct Upsert {
    /// The resource name (Address: a workload uid or a service `namespace/hostname`; Authorization:
    /// `namespace/name`; extension configs: the plugin name).
    pub name: String,
    /// The server's version of this resource (echoed in `initial_resource_versions` on reconnect).
    pub version: String,
    /// The resource itself.
    pub resource: Any,
}

impl Upsert {
    /// Decode the resource as `M`, refusing an `Any` of another type than `type_url`.
    pub fn decode<M: prost::Message + Default>(&self, type_url: &str) -> Result<M, Rejection> {
        weft_proto::from_any(type_url, &self.resource).map_err(|e| Rejection::new(&self.name, e))
    }
}

/// One response of one type, as the handler sees it. Several responses that arrived while the handler was busy
/// with an earlier one are merged into one `Delta` (a later upsert of a name replaces an earlier one; a removal
/// cancels an earlier upsert), so a name appears at most once, either in `upserts` or in `removals`. Apply the
/// removals, then the upserts.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Delta {
    /// The type URL.
    pub type_url: String,
    /// The server's `system_version_info` of the latest response merged in.
    pub system_version_info: String,
    /// Added or changed resources, by name.
    pub upserts: Vec<Upsert>,
    /// Names of removed resources. A name the handler does not hold must be ignored.
    pub removals: Vec<String>,
    /// How many server responses this delta carries (1 unless the handler was slower than the server).
    pub responses: usize,
}

/// A resource the handler refused: it is NACKed with this reason, and whatever the handler held before under that
/// name keeps serving.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    /// The resource name.
    pub name: String,
    /// Why, for the operator (the field and what is wrong with it).
    pub reason: String,
}

impl Rejection {
    /// A rejection of `name` for `reason`.
    pub fn new(name: impl Into<String>, reason: impl std::fmt::Display) -> Self {
        Self {
            name: name.into(),
            reason: reason.to_string(),
        }
    }
}

impl std::fmt::Display for Rejection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.name, self.reason)
    }
}

/// Consumes the resources of one type URL. Each type has its own task, so a handler that takes its time (a plugin
/// fetch and compile) never delays the responses of other types; responses of its own type are merged meanwhile.
pub trait Handler: Send + Sync + 'static {
    /// Apply one delta. Return the refused resources (empty: ACK). The future may take as long as it needs; the
    /// ACK or NACK is sent when it completes.
    fn apply(&self, delta: Delta) -> BoxFuture<'_, Vec<Rejection>>;
}

/// The `google.rpc.Code` weft puts in a NACK's `error_detail` (`INVALID_ARGUMENT`).
pub const NACK_CODE: i32 = 3;

/// The `error_detail` message of a NACK: each `name: reason`, joined by `; ` (ztunnel's form).
pub fn nack_message(rejections: &[Rejection]) -> String {
    rejections
        .iter()
        .map(Rejection::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn nack_message_lists_every_name_and_reason() {
        let m = nack_message(&[
            Rejection::new("a", "bad IP"),
            Rejection::new("ns/b", "namespace: invalid"),
        ]);
        assert_eq!(m, "a: bad IP; ns/b: namespace: invalid");
    }

    #[test]
    fn decode_refuses_another_type() {
        let u = Upsert {
            name: "x".into(),
            version: "1".into(),
            resource: weft_proto::to_any(
                weft_proto::type_url::AUTHORIZATION,
                &weft_proto::istio::security::Authorization::default(),
            ),
        };
        let e = u
            .decode::<weft_proto::istio::workload::Address>(weft_proto::type_url::ADDRESS)
            .unwrap_err();
        assert_eq!(e.name, "x");
        assert!(e.reason.contains("istio.security.Authorization"), "{e}");
    }
}
