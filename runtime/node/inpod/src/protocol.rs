//! ZDS messages: what a received packet means, and the hello and acks weft sends. The rules are ztunnel's: an
//! `AddWorkload` must carry exactly one descriptor, every other request none; a truncated packet, an
//! undecodable one or one without a payload is an error (answered with an error ack by the caller).

use std::os::fd::OwnedFd;

use prost::Message;
use weft_proto::zds::{
    self, Ack, Version, WorkloadRequest, WorkloadResponse, ZdsHello, workload_request::Payload,
};

use crate::netns::Netns;
use crate::packet::Packet;

/// Who a pod is, as the agent describes it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodInfo {
    /// The pod uid.
    pub uid: String,
    /// Pod name.
    pub name: String,
    /// Namespace.
    pub namespace: String,
    /// Service account.
    pub service_account: String,
}

/// A request from the agent.
#[derive(Debug)]
pub enum Request {
    /// Serve this pod; the namespace came with the packet.
    Add(PodInfo, Netns),
    /// Before `SnapshotSent`: keep serving this pod if it is served (the agent has no descriptor for it).
    Keep(String),
    /// Stop serving this pod.
    Del(String),
    /// The snapshot is complete.
    SnapshotSent,
}

impl Request {
    /// Short name (logs, metrics).
    pub fn kind(&self) -> &'static str {
        match self {
            Request::Add(..) => "add",
            Request::Keep(_) => "keep",
            Request::Del(_) => "del",
            Request::SnapshotSent => "snapshot_sent",
        }
    }
}

/// Why a packet is not a valid request.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DecodeError {
    /// The packet was larger than the buffer.
    #[error("received truncated message")]
    Truncated,
    /// The ancillary data was larger than its buffer.
    #[error("received truncated control message")]
    ControlTruncated,
    /// More than one descriptor.
    #[error("expected 1 descriptor, got {0}")]
    TooManyFds(usize),
    /// Not a `WorkloadRequest`.
    #[error("cannot decode WorkloadRequest: {0}")]
    Decode(String),
    /// A `WorkloadRequest` with no payload (or one this version does not know).
    #[error("no payload")]
    NoPayload,
    /// `AddWorkload` without a descriptor.
    #[error("No control message")]
    NoFd,
    /// A descriptor with a request other than `AddWorkload`.
    #[error("Unexpected control message")]
    UnexpectedFd,
    /// The descriptor is not a network namespace.
    #[error("descriptor is not a network namespace: {0}")]
    NotNetns(String),
    /// `AddWorkload` without `workload_info` (ztunnel requires it).
    #[error("workload_info is required but not present")]
    NoWorkloadInfo,
}

/// Interpret one packet. Every descriptor it carried is either moved into the result or closed.
pub fn decode(p: Packet) -> Result<Request, DecodeError> {
    let Packet {
        data,
        mut fds,
        truncated,
        control_truncated,
    } = p;
    if fds.len() > 1 {
        return Err(DecodeError::TooManyFds(fds.len()));
    }
    let fd: Option<OwnedFd> = fds.pop();
    if truncated {
        return Err(DecodeError::Truncated);
    }
    if control_truncated {
        return Err(DecodeError::ControlTruncated);
    }
    let req =
        WorkloadRequest::decode(data.as_slice()).map_err(|e| DecodeError::Decode(e.to_string()))?;
    match (req.payload.ok_or(DecodeError::NoPayload)?, fd) {
        (Payload::Add(a), Some(fd)) => {
            let info = a.workload_info.ok_or(DecodeError::NoWorkloadInfo)?;
            let netns = Netns::from_fd(fd).map_err(|e| DecodeError::NotNetns(e.to_string()))?;
            Ok(Request::Add(
                PodInfo {
                    uid: a.uid,
                    name: info.name,
                    namespace: info.namespace,
                    service_account: info.service_account,
                },
                netns,
            ))
        }
        (Payload::Add(_), None) => Err(DecodeError::NoFd),
        (_, Some(_)) => Err(DecodeError::UnexpectedFd),
        (Payload::Keep(k), None) => Ok(Request::Keep(k.uid)),
        (Payload::Del(d), None) => Ok(Request::Del(d.uid)),
        (Payload::SnapshotSent(_), None) => Ok(Request::SnapshotSent),
    }
}

/// The first packet weft sends on a connection.
pub fn hello() -> Vec<u8> {
    ZdsHello {
        version: Version::V1 as i32,
    }
    .encode_to_vec()
}

/// The largest packet istio-cni reads as an answer: its node agent reads acks into a 1024-byte buffer and refuses a
/// truncated one (`cni/pkg/nodeagent/ztunnelserver_linux.go`, `readProto`).
pub const ACK_MAX: usize = 1024;

/// What ends an error text that had to be cut to fit [`ACK_MAX`].
const CUT: &str = " [truncated]";

/// An ack: `None` for success, or the error text, cut (at a character boundary, marked) so that the whole packet
/// fits in [`ACK_MAX`] bytes.
pub fn ack(error: Option<&str>) -> Vec<u8> {
    let encode = |text: String| {
        WorkloadResponse {
            payload: Some(zds::workload_response::Payload::Ack(Ack { error: text })),
        }
        .encode_to_vec()
    };
    let text = error.unwrap_or_default();
    let whole = encode(text.to_owned());
    if whole.len() <= ACK_MAX {
        return whole;
    }
    // Two length prefixes of at most two bytes each and two tags: 6 bytes of framing around the text.
    let mut end = ACK_MAX - 6 - CUT.len();
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    encode(format!("{}{CUT}", &text[..end]))
}

#[cfg(test)]
mod tests;
