#![allow(clippy::unwrap_used)]

use std::os::fd::AsFd;

use prost::Message;
use weft_proto::zds::{AddWorkload, DelWorkload, KeepWorkload, SnapshotSent, WorkloadInfo};

use super::*;
use crate::packet::pair;
use crate::testutil::TestNs;

fn req(p: Payload) -> Vec<u8> {
    WorkloadRequest { payload: Some(p) }.encode_to_vec()
}

fn add(uid: &str) -> Vec<u8> {
    req(Payload::Add(AddWorkload {
        uid: uid.into(),
        workload_info: Some(WorkloadInfo {
            name: "p".into(),
            namespace: "ns".into(),
            service_account: "sa".into(),
        }),
    }))
}

async fn roundtrip(
    data: &[u8],
    fds: &[std::os::fd::BorrowedFd<'_>],
) -> Result<Request, DecodeError> {
    let (a, b) = pair().unwrap();
    a.send(data, fds).await.unwrap();
    decode(b.recv().await.unwrap().unwrap())
}

#[test]
fn field_numbers_are_the_wire_contract() {
    // DelWorkload.uid is field 2 (tag 0x12); the request's del is field 2, keep 5, snapshot_sent 3.
    assert_eq!(
        DelWorkload { uid: "u".into() }.encode_to_vec(),
        vec![0x12, 1, b'u']
    );
    assert_eq!(
        req(Payload::Del(DelWorkload { uid: "u".into() })),
        vec![0x12, 3, 0x12, 1, b'u']
    );
    assert_eq!(
        req(Payload::Keep(KeepWorkload { uid: "u".into() })),
        vec![0x2a, 3, 0x0a, 1, b'u']
    );
    assert_eq!(req(Payload::SnapshotSent(SnapshotSent {})), vec![0x1a, 0]);
    // Hello: version V1 in field 1; an ack with an error: WorkloadResponse.ack (1) → Ack.error (1).
    assert_eq!(hello(), vec![0x08, 1]);
    assert_eq!(ack(Some("x")), vec![0x0a, 3, 0x0a, 1, b'x']);
    assert_eq!(ack(None), vec![0x0a, 0]);
}

#[tokio::test]
async fn add_with_a_namespace_descriptor() {
    let ns = TestNs::new();
    let f = std::fs::File::open(ns.path()).unwrap();
    match roundtrip(&add("u1"), &[f.as_fd()]).await.unwrap() {
        Request::Add(info, netns) => {
            assert_eq!(info.uid, "u1");
            assert_eq!(
                (
                    info.name.as_str(),
                    info.namespace.as_str(),
                    info.service_account.as_str()
                ),
                ("p", "ns", "sa")
            );
            assert_eq!(netns.id(), ns.open().id());
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn malformed_requests_are_errors() {
    let ns = TestNs::new();
    let f = std::fs::File::open(ns.path()).unwrap();
    let g = std::fs::File::open(ns.path()).unwrap();
    let null = std::fs::File::open("/dev/null").unwrap();
    assert_eq!(
        roundtrip(&add("u"), &[]).await.unwrap_err(),
        DecodeError::NoFd
    );
    assert_eq!(
        roundtrip(&add("u"), &[f.as_fd(), g.as_fd()])
            .await
            .unwrap_err(),
        DecodeError::TooManyFds(2)
    );
    let del = req(Payload::Del(DelWorkload { uid: "u".into() }));
    assert_eq!(
        roundtrip(&del, &[f.as_fd()]).await.unwrap_err(),
        DecodeError::UnexpectedFd
    );
    assert!(matches!(
        roundtrip(&[0xff, 0xff, 0xff], &[]).await.unwrap_err(),
        DecodeError::Decode(_)
    ));
    // Only an unknown field (9): a request with no payload this version knows. (An empty packet cannot be told
    // from the end of the stream, as in ztunnel.)
    assert_eq!(
        roundtrip(&[0x48, 0x01], &[]).await.unwrap_err(),
        DecodeError::NoPayload
    );
    let no_info = req(Payload::Add(AddWorkload {
        uid: "u".into(),
        workload_info: None,
    }));
    assert_eq!(
        roundtrip(&no_info, &[f.as_fd()]).await.unwrap_err(),
        DecodeError::NoWorkloadInfo
    );
    assert!(matches!(
        roundtrip(&add("u"), &[null.as_fd()]).await.unwrap_err(),
        DecodeError::NotNetns(_)
    ));
    let big = vec![0u8; crate::packet::MAX_PACKET + 1];
    assert_eq!(
        roundtrip(&big, &[]).await.unwrap_err(),
        DecodeError::Truncated
    );
    assert!(matches!(roundtrip(&del, &[]).await.unwrap(), Request::Del(u) if u == "u"));
}

/// istio-cni reads an answer into 1024 bytes and drops a truncated one: a long error must still fit, cut and
/// marked, and decode; a short one is sent whole.
#[test]
fn an_ack_always_fits_istio_cnis_buffer() {
    let decode_error = |b: &[u8]| match WorkloadResponse::decode(b).unwrap().payload {
        Some(zds::workload_response::Payload::Ack(a)) => a.error,
        other => panic!("not an ack: {other:?}"),
    };
    assert_eq!(decode_error(&ack(Some("no such pod"))), "no such pod");
    assert_eq!(decode_error(&ack(None)), "");
    for long in ["x".repeat(5000), "é".repeat(3000), "a".repeat(1019)] {
        let b = ack(Some(&long));
        assert!(b.len() <= ACK_MAX, "{} bytes", b.len());
        let text = decode_error(&b);
        assert!(text.ends_with(" [truncated]"), "{text}");
        assert!(long.starts_with(text.trim_end_matches(" [truncated]")));
    }
}
