//! What a source is doing, for `/config_dump`, metrics, readiness and tests: connected or not, streams opened,
//! last disconnect, and per type the resources held, responses, ACKs and NACKs (the last of each with its nonce).

use std::collections::BTreeMap;
use std::time::SystemTime;

use serde::Serialize;

/// When and why the last stream ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Disconnect {
    /// RFC 3339.
    pub at: String,
    /// Why.
    pub reason: String,
}

/// The last ACK of a type.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AckRecord {
    /// The nonce answered.
    pub nonce: String,
    /// The server's version of the response.
    pub system_version_info: String,
    /// RFC 3339.
    pub at: String,
}

/// The last NACK of a type.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NackRecord {
    /// The nonce answered (the latest one of the type for an unsolicited NACK).
    pub nonce: String,
    /// The `error_detail` message sent.
    pub error: String,
    /// RFC 3339.
    pub at: String,
    /// Whether it answered a response (false: sent on the handler's initiative, e.g. a plugin rollback).
    pub solicited: bool,
}

/// One subscribed type.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TypeStatus {
    /// The type URL.
    pub type_url: String,
    /// A first response has been handled (ACKed or NACKed) since the client started.
    pub synced: bool,
    /// Resources held (their versions are sent as `initial_resource_versions` on reconnect).
    pub resources: usize,
    /// Responses received.
    pub responses: u64,
    /// ACKs sent.
    pub acks: u64,
    /// NACKs sent.
    pub nacks: u64,
    /// Bytes of the resources received (the sum of their `Any` values' lengths, as ztunnel counts
    /// `istio_xds_message_bytes_total`).
    #[serde(skip)]
    pub received_bytes: u64,
    /// Responses waiting for the handler.
    pub queued: usize,
    /// The last ACK.
    pub last_ack: Option<AckRecord>,
    /// The last NACK.
    pub last_nack: Option<NackRecord>,
}

/// One source.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SourceStatus {
    /// The source's name.
    pub name: String,
    /// The server address.
    pub address: String,
    /// The node id sent.
    pub node_id: String,
    /// A stream is open.
    pub connected: bool,
    /// Streams opened so far.
    pub connections: u64,
    /// Attempts that failed before a stream opened.
    pub connect_failures: u64,
    /// When the current stream opened (RFC 3339).
    pub connected_since: Option<String>,
    /// The last stream's end.
    pub last_disconnect: Option<Disconnect>,
    /// The last attempt that failed before a stream opened.
    pub last_connect_error: Option<Disconnect>,
    /// Every type has had its first response handled.
    pub synced: bool,
    /// Per type, in subscription order.
    pub types: Vec<TypeStatus>,
    /// Streams and attempts that ended, by ztunnel's reason (`istio_xds_connection_terminations_total`).
    #[serde(skip)]
    pub terminations: Terminations,
}

/// Ended streams and failed attempts, counted by ztunnel's `ConnectionTerminationReason`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Terminations {
    /// The stream could not be opened (ztunnel's `ConnectionError`).
    pub connection_error: u64,
    /// The stream ended with a gRPC error that is not a routine reconnect, or the attempt failed otherwise
    /// (ztunnel's `Error`).
    pub error: u64,
    /// The server ended the stream as it does to rebalance or on shutdown: `Unknown`, `Cancelled`,
    /// `DeadlineExceeded`, or `Unavailable` with "transport is closing" / "received prior goaway" (ztunnel's
    /// `Reconnect`).
    pub reconnect: u64,
    /// The server closed the stream without an error (ztunnel's `Complete`).
    pub complete: u64,
}

impl Terminations {
    /// The counts with ztunnel's label values (`ConnectionError`, `Error`, `Reconnect`, `Complete`).
    pub fn by_reason(&self) -> [(&'static str, u64); 4] {
        [
            ("ConnectionError", self.connection_error),
            ("Error", self.error),
            ("Reconnect", self.reconnect),
            ("Complete", self.complete),
        ]
    }

    /// Count a stream or attempt that ended with `e`, sorted as ztunnel's xDS client sorts it.
    pub(crate) fn count(&mut self, e: &crate::Error) {
        use tonic::Code;
        match e {
            crate::Error::Connect { .. } => self.connection_error += 1,
            crate::Error::Status { code, message }
                if matches!(
                    code,
                    Code::Unknown | Code::Cancelled | Code::DeadlineExceeded
                ) || (*code == Code::Unavailable
                    && (message.contains("transport is closing")
                        || message.contains("received prior goaway"))) =>
            {
                self.reconnect += 1
            }
            crate::Error::Closed => self.complete += 1,
            crate::Error::Status { .. }
            | crate::Error::Config(_)
            | crate::Error::Credentials(_) => self.error += 1,
        }
    }
}

impl SourceStatus {
    /// The status of `type_url`.
    pub fn of(&self, type_url: &str) -> Option<&TypeStatus> {
        self.types.iter().find(|t| t.type_url == type_url)
    }
}

pub(crate) fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}

/// Mutable status kept by the client (behind a mutex).
#[derive(Debug)]
pub(crate) struct Tracker {
    pub(crate) status: SourceStatus,
    index: BTreeMap<String, usize>,
}

impl Tracker {
    pub(crate) fn new(name: &str, address: &str, node_id: String, types: &[String]) -> Self {
        Self {
            status: SourceStatus {
                name: name.to_owned(),
                address: address.to_owned(),
                node_id,
                connected: false,
                connections: 0,
                connect_failures: 0,
                connected_since: None,
                last_disconnect: None,
                last_connect_error: None,
                synced: types.is_empty(),
                terminations: Terminations::default(),
                types: types
                    .iter()
                    .map(|t| TypeStatus {
                        type_url: t.clone(),
                        synced: false,
                        resources: 0,
                        responses: 0,
                        acks: 0,
                        nacks: 0,
                        received_bytes: 0,
                        queued: 0,
                        last_ack: None,
                        last_nack: None,
                    })
                    .collect(),
            },
            index: types
                .iter()
                .enumerate()
                .map(|(i, t)| (t.clone(), i))
                .collect(),
        }
    }

    pub(crate) fn ty(&mut self, type_url: &str) -> Option<&mut TypeStatus> {
        let i = *self.index.get(type_url)?;
        self.status.types.get_mut(i)
    }

    pub(crate) fn mark_synced(&mut self, type_url: &str) {
        if let Some(t) = self.ty(type_url) {
            t.synced = true;
        }
        self.status.synced = self.status.types.iter().all(|t| t.synced);
    }
}

/// Readiness: every source has had its first complete sync.
pub fn pending(handles: &[crate::XdsHandle]) -> Vec<String> {
    handles
        .iter()
        .filter(|h| !h.is_synced())
        .map(|h| {
            let s = h.status();
            let waiting: Vec<&str> = s
                .types
                .iter()
                .filter(|t| !t.synced)
                .map(|t| t.type_url.rsplit('/').next().unwrap_or(&t.type_url))
                .collect();
            format!(
                "xDS source {} ({}) waiting for its first {}",
                s.name,
                s.address,
                waiting.join(", ")
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Error;

    #[test]
    fn terminations_are_sorted_as_ztunnel_sorts_them() {
        let mut t = Terminations::default();
        let status = |code, message: &str| Error::Status {
            code,
            message: message.to_owned(),
        };
        t.count(&Error::Connect {
            address: "a".into(),
            message: "refused".into(),
        });
        t.count(&status(tonic::Code::Cancelled, ""));
        t.count(&status(tonic::Code::DeadlineExceeded, ""));
        t.count(&status(tonic::Code::Unknown, ""));
        t.count(&status(tonic::Code::Unavailable, "transport is closing"));
        t.count(&status(
            tonic::Code::Unavailable,
            "received prior goaway: x",
        ));
        t.count(&status(tonic::Code::Unavailable, "connection reset"));
        t.count(&status(
            tonic::Code::Unauthenticated,
            "authentication failure",
        ));
        t.count(&Error::Credentials("no token".into()));
        t.count(&Error::Closed);
        assert_eq!(
            t.by_reason(),
            [
                ("ConnectionError", 1),
                ("Error", 3),
                ("Reconnect", 5),
                ("Complete", 1)
            ]
        );
    }
}
