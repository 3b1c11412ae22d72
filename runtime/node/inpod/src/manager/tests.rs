#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::*;
use crate::testutil::{Call, FakeSets, TestNs, pod};

fn mgr() -> (Manager<FakeSets>, Arc<FakeSets>, Arc<Status>) {
    let sets = Arc::new(FakeSets::default());
    let status = Arc::new(Status::default());
    (Manager::new(sets.clone(), status.clone()), sets, status)
}

fn add(uid: &str, ns: &TestNs) -> Request {
    Request::Add(pod(uid), ns.open())
}

#[tokio::test]
async fn snapshot_removes_pods_the_agent_no_longer_has() {
    let (mut m, sets, status) = mgr();
    let (n1, n2, n3) = (TestNs::new(), TestNs::new(), TestNs::new());
    m.handle(add("a", &n1)).await.unwrap();
    m.handle(add("b", &n2)).await.unwrap();
    m.handle(add("c", &n3)).await.unwrap();
    m.handle(Request::SnapshotSent).await.unwrap();
    assert!(status.snapshot_received());
    // Reconnect (weft's side of an agent restart): the new snapshot has a (same namespace: no-op), keeps b, not c.
    m.reset_snapshot();
    assert!(!status.snapshot_received());
    m.handle(add("a", &n1)).await.unwrap();
    m.handle(Request::Keep("b".into())).await.unwrap();
    m.handle(Request::SnapshotSent).await.unwrap();
    m.wait_drains().await;
    assert_eq!(m.served(), vec!["a", "b"]);
    assert_eq!(
        sets.calls(),
        vec![
            Call::Open("a".into()),
            Call::Open("b".into()),
            Call::Open("c".into()),
            Call::Drain("c".into())
        ]
    );
    assert_eq!(status.pods_in(PodState::Serving).len(), 2);
    assert!(status.pods_in(PodState::Draining).is_empty());
}

#[tokio::test]
async fn a_new_namespace_replaces_the_old_listeners() {
    let (mut m, sets, _) = mgr();
    let (n1, n2) = (TestNs::new(), TestNs::new());
    m.handle(add("a", &n1)).await.unwrap();
    m.handle(add("a", &n2)).await.unwrap();
    m.wait_drains().await;
    assert_eq!(
        sets.calls(),
        vec![
            Call::Open("a".into()),
            Call::Drain("a".into()),
            Call::Open("a".into())
        ]
    );
}

#[tokio::test]
async fn protocol_rules() {
    let (mut m, _, _) = mgr();
    m.handle(Request::SnapshotSent).await.unwrap();
    assert!(matches!(
        m.handle(Request::SnapshotSent).await,
        Err(Failure::Protocol(_))
    ));
    assert!(matches!(
        m.handle(Request::Keep("x".into())).await,
        Err(Failure::Protocol(_))
    ));
    // Deleting a pod weft does not serve is fine (idempotent).
    m.handle(Request::Del("nobody".into())).await.unwrap();
}

#[tokio::test]
async fn delete_before_the_snapshot_takes_the_pod_out_of_it() {
    let (mut m, sets, _) = mgr();
    let n1 = TestNs::new();
    m.handle(add("a", &n1)).await.unwrap();
    m.handle(Request::SnapshotSent).await.unwrap();
    m.reset_snapshot();
    m.handle(add("a", &n1)).await.unwrap();
    m.handle(Request::Del("a".into())).await.unwrap();
    // Still served until the snapshot completes.
    assert_eq!(m.served(), vec!["a"]);
    m.handle(Request::SnapshotSent).await.unwrap();
    m.wait_drains().await;
    assert!(m.served().is_empty());
    assert_eq!(sets.calls().last(), Some(&Call::Drain("a".into())));
}

#[tokio::test]
async fn a_pod_that_fails_to_open_is_pending_and_retried() {
    let (mut m, sets, status) = mgr();
    let n1 = TestNs::new();
    sets.fail_next.store(1, Ordering::SeqCst);
    assert!(matches!(m.handle(add("a", &n1)).await, Err(Failure::Pod(e)) if e == "address in use"));
    m.handle(Request::SnapshotSent).await.unwrap();
    assert!(m.has_pending());
    assert_eq!(
        status.not_ready(),
        vec!["in-pod: listeners pending for default/name-a".to_owned()]
    );
    m.retry_pending().await;
    assert!(!m.has_pending());
    assert_eq!(m.served(), vec!["a"]);
    assert!(status.not_ready().is_empty());
    // A delete after the snapshot drains it.
    m.handle(Request::Del("a".into())).await.unwrap();
    m.wait_drains().await;
    assert_eq!(
        sets.calls(),
        vec![
            Call::Open("a".into()),
            Call::Open("a".into()),
            Call::Drain("a".into())
        ]
    );
    assert!(status.pods_in(PodState::Serving).is_empty());
}
