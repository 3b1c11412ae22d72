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
                types: types
                    .iter()
                    .map(|t| TypeStatus {
                        type_url: t.clone(),
                        synced: false,
                        resources: 0,
                        responses: 0,
                        acks: 0,
                        nacks: 0,
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
