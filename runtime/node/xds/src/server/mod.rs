//! The server end of Delta ADS, without a resource model: per stream and per type URL, what the node subscribed
//! to (wildcard or by name), what it was sent (name → version, seeded from `initial_resource_versions`), and the
//! responses it has not answered (matched to ACKs and NACKs by nonce, at most [`MAX_PENDING`]); from a set of
//! resources the caller offers, the next `DeltaDiscoveryResponse` (only what changed and what was removed, nothing
//! when nothing changed).
//!
//! A server feeds every request of a stream to [`DeltaStream::receive`], records the [`Answer`] and the
//! [`SubscriptionChange`] it returns as it likes, and calls [`DeltaStream::respond`] with what it serves of that
//! type (after a subscription change, and for every type whenever what it serves changes); what it serves and to
//! whom, its records and its transport are its own (weft control's `stream.rs` is one such server).
//!
//! ```
//! use std::collections::BTreeMap;
//! use weft_proto::envoy::service::discovery::v3::DeltaDiscoveryRequest;
//! use weft_xds::server::{DeltaStream, Offered, Versioned};
//!
//! let mut stream = DeltaStream::new();
//! let req = DeltaDiscoveryRequest { type_url: "t".into(), ..Default::default() };
//! let received = stream.receive(&req);
//! let mut offered = BTreeMap::new();
//! offered.insert("a".to_owned(), Offered::Serve(Versioned::new("1", prost_types::Any::default())));
//! let push = stream.respond("t", &offered, received.change.as_ref(), "1").expect("the first answer");
//! assert_eq!(push.response.resources[0].name, "a");
//! ```

mod offered;
mod subscription;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

use weft_proto::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DeltaDiscoveryResponse};

pub use offered::{Offered, ServedResource, Versioned};
pub use subscription::{Answer, Sent, SubscriptionChange, TypeSubscription};

/// Responses a stream remembers per type that the node has not answered; older ones are forgotten (their ACK then
/// counts as stale).
pub const MAX_PENDING: usize = 64;

/// What one request said.
#[derive(Debug, Clone)]
pub struct Received {
    /// The ACK or NACK it carried (`response_nonce` or `error_detail` set), if any.
    pub answer: Option<Answer>,
    /// How it changed the subscription (first request of its type, or names subscribed or unsubscribed); `None`:
    /// it changed nothing, and needs no response.
    pub change: Option<SubscriptionChange>,
}

/// A response to send and what it carried (kept by the stream until the node answers it).
#[derive(Debug, Clone)]
pub struct Push {
    /// The response, with a fresh nonce.
    pub response: DeltaDiscoveryResponse,
    /// Its upserts and removals.
    pub sent: Sent,
}

/// The Delta xDS state of one stream: a [`TypeSubscription`] per type URL requested, and the nonce counter.
#[derive(Debug, Default)]
pub struct DeltaStream {
    types: BTreeMap<String, TypeSubscription>,
    nonce: u64,
}

impl DeltaStream {
    /// A stream that has received nothing.
    pub fn new() -> Self {
        Self::default()
    }

    /// Take in one request: match its ACK or NACK to the response it answers (by nonce), and apply its
    /// subscription change. The first request of a type URL subscribes (wildcard when it names nothing or `*`) and
    /// seeds what the node has from `initial_resource_versions`.
    pub fn receive(&mut self, req: &DeltaDiscoveryRequest) -> Received {
        let is_new = !self.types.contains_key(&req.type_url);
        let ts = self.types.entry(req.type_url.clone()).or_default();
        let answer =
            (!req.response_nonce.is_empty() || req.error_detail.is_some()).then(|| ts.answer(req));
        let change = ts.apply(req, is_new);
        Received { answer, change }
    }

    /// The next response for `type_url` given what the server offers this node of it (by name), or `None` when
    /// there is nothing to say. `change`: the subscription change being answered (a new subscription is answered
    /// even when empty; names just subscribed that are not offered go out as removed). `system_version_info`:
    /// the response's version of everything served. A type never requested gets nothing.
    pub fn respond<R: ServedResource>(
        &mut self,
        type_url: &str,
        offered: &BTreeMap<String, Offered<R>>,
        change: Option<&SubscriptionChange>,
        system_version_info: &str,
    ) -> Option<Push> {
        let ts = self.types.get_mut(type_url)?;
        let (resources, ids, removed) = ts.diff(offered, change);
        let force = change.is_some_and(|c| c.initial);
        if resources.is_empty() && removed.is_empty() && !force {
            return None;
        }
        self.nonce += 1;
        let nonce = self.nonce;
        let sent = ts.record(nonce, &resources, ids, removed.clone());
        Some(Push {
            response: DeltaDiscoveryResponse {
                system_version_info: system_version_info.to_owned(),
                resources,
                type_url: type_url.to_owned(),
                nonce: nonce.to_string(),
                removed_resources: removed,
            },
            sent,
        })
    }

    /// The type URLs requested so far, in order.
    pub fn type_urls(&self) -> impl Iterator<Item = &str> {
        self.types.keys().map(String::as_str)
    }

    /// The state of one type URL, once requested.
    pub fn subscription(&self, type_url: &str) -> Option<&TypeSubscription> {
        self.types.get(type_url)
    }
}
