//! Figures for the identity manager against the reference CA over real gRPC+TLS on loopback: how long a cold
//! connection waits for its first certificate, and how many CA calls a burst of 1000 connections for one new
//! identity makes (must be 1). Print the figures with
//! `cargo test -p weft-control --test ca_bench -- --ignored --nocapture`.
#![allow(clippy::unwrap_used)]

mod ca_common;
use ca_common as common;

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use common::*;
use weft_identity::{LocalCa, ManagerConfig, SecretManager, SpiffeId};

fn id(sa: &str) -> SpiffeId {
    SpiffeId::new("cluster.local", "default", sa).unwrap()
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_1000_connections_for_one_new_identity_makes_one_ca_call() {
    let ca = TestCa::start(None, None).await;
    let m = SecretManager::new(Arc::new(ca.client("token-a")), ManagerConfig::default());
    let start = Instant::now();
    let tasks: Vec<_> = (0..1000)
        .map(|_| {
            let m = m.clone();
            tokio::spawn(async move { m.fetch(&id("client")).await.map(|c| c.serial().to_owned()) })
        })
        .collect();
    let mut serials = std::collections::HashSet::new();
    for t in tasks {
        serials.insert(t.await.unwrap().unwrap());
    }
    let took = start.elapsed();
    let calls = ca.service.counters.requests.load(Relaxed);
    println!(
        "burst: 1000 concurrent fetches for one new identity -> {calls} CA call(s), {} certificate(s), all served in {took:?}",
        serials.len()
    );
    assert_eq!(calls, 1);
    assert_eq!(serials.len(), 1);
    assert_eq!(m.counters().fetches.load(Relaxed), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "prints figures; run with --ignored --nocapture"]
async fn cold_connection_wait_for_the_first_certificate() {
    const N: usize = 200;
    let ca = TestCa::start(None, None).await;
    let names: Vec<String> = (0..N).map(|i| format!("w{i}")).collect();
    let placed: Vec<(&str, &str)> = names.iter().map(|n| (n.as_str(), "node-a")).collect();
    let seen = ca.service.workloads.version();
    ca.write_mesh(&placed);
    applied(&ca.service.workloads, seen, |s| {
        s.local_workloads("node-a").count() == N
    })
    .await;

    // Over gRPC+TLS to the reference CA; the first fetch also opens the channel (TCP + TLS + HTTP/2).
    let m = SecretManager::new(Arc::new(ca.client("token-a")), ManagerConfig::default());
    let mut grpc = Vec::with_capacity(N);
    for n in &names {
        let t = Instant::now();
        m.fetch(&id(n)).await.unwrap();
        grpc.push(t.elapsed());
    }
    let first = grpc[0];
    grpc.sort();

    // The same through the in-process local CA (key generation, CSR, signing and validation only).
    let dir = tempfile::tempdir().unwrap();
    weft_identity::ca::write_root(dir.path(), "cluster.local", Duration::from_secs(3600)).unwrap();
    let local = SecretManager::new(
        Arc::new(LocalCa::from_dir(dir.path()).unwrap()),
        ManagerConfig::default(),
    );
    let mut inproc = Vec::with_capacity(N);
    for n in &names {
        let t = Instant::now();
        local.fetch(&id(n)).await.unwrap();
        inproc.push(t.elapsed());
    }
    inproc.sort();
    println!(
        "cold connection, first certificate ({N} new identities, one at a time):\n  istio CA over gRPC+TLS: median {:?}, p90 {:?}, max {:?}; very first (channel setup included) {first:?}\n  local CA in process:    median {:?}, p90 {:?}, max {:?}",
        percentile(&grpc, 0.5),
        percentile(&grpc, 0.9),
        grpc[N - 1],
        percentile(&inproc, 0.5),
        percentile(&inproc, 0.9),
        inproc[N - 1],
    );
}
