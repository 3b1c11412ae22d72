#![allow(clippy::unwrap_used)]

use std::os::fd::AsFd;
use std::sync::Arc;

use prost::Message;
use weft_proto::zds::{
    AddWorkload, SnapshotSent, WorkloadInfo, WorkloadRequest, WorkloadResponse, ZdsHello,
    workload_request::Payload, workload_response,
};

use super::*;
use crate::packet::{SeqPacket, SeqPacketListener};
use crate::testutil::{Call, FakeSets, TestNs};

fn add(uid: &str) -> Vec<u8> {
    WorkloadRequest {
        payload: Some(Payload::Add(AddWorkload {
            uid: uid.into(),
            workload_info: Some(WorkloadInfo {
                name: uid.into(),
                namespace: "default".into(),
                service_account: "sa".into(),
            }),
        })),
    }
    .encode_to_vec()
}

fn snapshot_sent() -> Vec<u8> {
    WorkloadRequest {
        payload: Some(Payload::SnapshotSent(SnapshotSent {})),
    }
    .encode_to_vec()
}

async fn ack_of(c: &SeqPacket) -> String {
    let p = c.recv().await.unwrap().unwrap();
    match WorkloadResponse::decode(p.data.as_slice()).unwrap().payload {
        Some(workload_response::Payload::Ack(a)) => a.error,
        None => panic!("no ack"),
    }
}

async fn hello_of(c: &SeqPacket) {
    let p = c.recv().await.unwrap().unwrap();
    assert_eq!(ZdsHello::decode(p.data.as_slice()).unwrap().version, 1);
}

#[tokio::test]
async fn hello_acks_error_ack_reconnect_and_snapshot_resend() {
    let dir = tempfile::tempdir().unwrap();
    let uds = dir.path().join("ztunnel.sock");
    let agent = SeqPacketListener::bind(&uds).unwrap();
    let sets = Arc::new(FakeSets::default());
    let status = Arc::new(Status::default());
    let stop = CancellationToken::new();
    let task = tokio::spawn(run(
        uds.clone(),
        Manager::new(sets.clone(), status.clone()),
        status.clone(),
        stop.clone(),
    ));
    let ns = TestNs::new();
    let nsf = std::fs::File::open(ns.path()).unwrap();

    let c = agent.accept().await.unwrap();
    hello_of(&c).await;
    c.send(&add("a"), &[nsf.as_fd()]).await.unwrap();
    assert_eq!(ack_of(&c).await, "");
    c.send(&snapshot_sent(), &[]).await.unwrap();
    assert_eq!(ack_of(&c).await, "");
    assert!(status.connected() && status.snapshot_received());

    // A malformed packet: an error ack, then weft closes the connection (as ztunnel does).
    c.send(&[0xff, 0xff], &[]).await.unwrap();
    let e = ack_of(&c).await;
    assert!(
        e.starts_with("failure to read message: cannot decode"),
        "{e}"
    );
    assert!(c.recv().await.unwrap().is_none());

    // weft reconnects; the agent sends its snapshot again; the pod was never stopped.
    let c = agent.accept().await.unwrap();
    hello_of(&c).await;
    c.send(&add("a"), &[nsf.as_fd()]).await.unwrap();
    assert_eq!(ack_of(&c).await, "");
    c.send(&snapshot_sent(), &[]).await.unwrap();
    assert_eq!(ack_of(&c).await, "");
    assert_eq!(sets.calls(), vec![Call::Open("a".into())]);

    // An add whose listeners fail gets an error ack; the connection stays.
    sets.fail_next.store(1, std::sync::atomic::Ordering::SeqCst);
    c.send(&add("b"), &[nsf.as_fd()]).await.unwrap();
    assert_eq!(ack_of(&c).await, "failure to start proxy: address in use");
    c.send(&add("c"), &[]).await.unwrap();
    assert_eq!(
        ack_of(&c).await,
        "failure to read message: No control message"
    );

    stop.cancel();
    task.await.unwrap();
    let calls = sets.calls();
    assert!(calls.contains(&Call::Drain("a".into())), "{calls:?}");
    assert!(!status.connected());
}

#[tokio::test]
async fn connect_retries_until_the_agent_listens() {
    let dir = tempfile::tempdir().unwrap();
    let uds = dir.path().join("late.sock");
    let sets = Arc::new(FakeSets::default());
    let status = Arc::new(Status::default());
    let stop = CancellationToken::new();
    let task = tokio::spawn(run(
        uds.clone(),
        Manager::new(sets, status.clone()),
        status,
        stop.clone(),
    ));
    // The client is failing to connect now (nothing at the path); the agent appears later.
    tokio::task::yield_now().await;
    let agent = SeqPacketListener::bind(&uds).unwrap();
    let c = agent.accept().await.unwrap();
    hello_of(&c).await;
    stop.cancel();
    task.await.unwrap();
}
