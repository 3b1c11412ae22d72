//! The reference CA in process, against weft's Istio CA client over real gRPC+TLS on loopback: issuance,
//! authorization by node placement (live config edits), authentication by static tokens and by a TokenReview
//! server speaking the Kubernetes JSON, impersonation only by trusted node agents, answers the client must
//! refuse, and a root file that changes.
#![allow(clippy::unwrap_used)]

mod ca_common;
use ca_common as common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use weft_control::ca::{Authenticator, Fault, TrustedNodeAccounts};
use weft_identity::{CaClient, Error, ManagerConfig, SecretManager, SpiffeId};

fn id(ns: &str, sa: &str) -> SpiffeId {
    SpiffeId::new("cluster.local", ns, sa).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn issues_for_workloads_on_the_callers_node_and_refuses_others() {
    let ca = TestCa::start(None, None).await;
    let m = SecretManager::new(Arc::new(ca.client("token-a")), ManagerConfig::default());
    // A workload on node-a: issued, chain verified, root learned.
    let cert = m.fetch(&id("default", "client")).await.unwrap();
    assert_eq!(cert.identity(), &id("default", "client"));
    assert_eq!(cert.root_pems().len(), 1);
    // The node's own identity: always allowed.
    m.fetch(&id("weft-system", "node-a")).await.unwrap();
    // A workload on node-b: PermissionDenied, with the reason.
    let err = m.fetch(&id("default", "echo")).await.unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, Error::CaRefused { .. }), "{text}");
    assert!(text.contains("PermissionDenied"), "{text}");
    assert!(text.contains("node node-a may not"), "{text}");
    // Another trust domain: refused too.
    let td = SpiffeId::new("evil.example", "default", "client").unwrap();
    assert!(
        m.fetch(&td)
            .await
            .unwrap_err()
            .to_string()
            .contains("trust domain")
    );
    let c = &ca.service.counters;
    assert_eq!(c.issued.load(std::sync::atomic::Ordering::Relaxed), 2);
    assert_eq!(c.refused.load(std::sync::atomic::Ordering::Relaxed), 2);

    // The workload source is live: move echo to node-a, and node-a may now have its identity.
    let seen = ca.service.workloads.version();
    ca.write_mesh(&[("client", "node-a"), ("echo", "node-a")]);
    applied(&ca.service.workloads, seen, |s| {
        s.local_workloads("node-a")
            .any(|w| w.service_account == "echo")
    })
    .await;
    let m2 = SecretManager::new(Arc::new(ca.client("token-a")), ManagerConfig::default());
    m2.fetch(&id("default", "echo")).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_or_missing_tokens_are_unauthenticated() {
    let ca = TestCa::start(None, None).await;
    let bad = ca.client("no-such-token");
    let err = bad
        .sign(&request(&id("default", "client")))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("Unauthenticated"), "{err}");
    // The token file is read on every call: a rotated token is picked up without a new client.
    let cfg = ca.client_config("token-a");
    let token_file = cfg.token_file.clone().unwrap();
    let client = weft_identity::IstioCaClient::new(cfg).unwrap();
    client
        .sign(&request(&id("default", "client")))
        .await
        .unwrap();
    std::fs::write(&token_file, "revoked\n").unwrap();
    let err = client
        .sign(&request(&id("default", "client")))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("unknown token"), "{err}");
    std::fs::write(&token_file, "token-a\n").unwrap();
    client
        .sign(&request(&id("default", "client")))
        .await
        .unwrap();
    let mut cfg = ca.client_config("x");
    cfg.token_file = None;
    let anon = weft_identity::IstioCaClient::new(cfg).unwrap();
    let err = anon
        .sign(&request(&id("default", "client")))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("no bearer token"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_san_or_a_chain_that_does_not_verify_is_refused() {
    for (fault, want) in [
        (Fault::WrongSan, "identity mismatch"),
        (Fault::BadChain, "does not verify"),
    ] {
        let ca = TestCa::start(Some(fault), None).await;
        let m = SecretManager::new(Arc::new(ca.client("token-a")), ManagerConfig::default());
        let err = m.fetch(&id("default", "client")).await.unwrap_err();
        assert!(err.to_string().contains(want), "{fault:?}: {err}");
        assert_eq!(m.dump()[0].state, "Unavailable");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_channel_is_rebuilt_when_the_root_file_changes() {
    let ca = TestCa::start(None, None).await;
    let good = std::fs::read_to_string(&ca.root_file).unwrap();
    let (other, _) =
        weft_identity::ca::generate_root("cluster.local", Duration::from_secs(3600)).unwrap();
    std::fs::write(&ca.root_file, &other).unwrap();
    let client = ca.client("token-a");
    let err = client
        .sign(&request(&id("default", "client")))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::CaUnavailable(_)), "{err}");
    std::fs::write(&ca.root_file, &good).unwrap();
    client
        .sign(&request(&id("default", "client")))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_review_authenticates_nodes_by_their_bound_tokens() {
    let api = fake_kube_api().await;
    let auth = Authenticator::TokenReview {
        api: Box::new(
            weft_identity::KubeClient::new(&api.url, None, Some(api.reviewer_token_file.clone()))
                .unwrap(),
        ),
        audience: "istio-ca".into(),
        trust_domain: "cluster.local".into(),
    };
    let ca = TestCa::start(None, Some(auth)).await;
    // Bound to node-a through the node-name extra field.
    let m = SecretManager::new(Arc::new(ca.client(TOKEN_NODE_A)), ManagerConfig::default());
    m.fetch(&id("default", "client")).await.unwrap();
    let err = m.fetch(&id("default", "echo")).await.unwrap_err();
    assert!(err.to_string().contains("PermissionDenied"), "{err}");
    // Bound only to a pod (clusters before 1.30): the CA looks the pod up to find its node (node-b).
    let m = SecretManager::new(
        Arc::new(ca.client(TOKEN_POD_ON_B)),
        ManagerConfig::default(),
    );
    m.fetch(&id("default", "echo")).await.unwrap();
    // A token the API server rejects, and one for another audience.
    for t in [TOKEN_REJECTED, TOKEN_OTHER_AUDIENCE] {
        let err = ca
            .client(t)
            .sign(&request(&id("default", "client")))
            .await
            .unwrap_err();
        assert!(err.to_string().contains("Unauthenticated"), "{t}: {err}");
    }
    // The reviews were real TokenReview requests, authenticated with the CA's own token.
    let reviews = api.reviews();
    assert!(reviews.len() >= 4, "{reviews:?}");
    for r in &reviews {
        assert_eq!(r["apiVersion"], "authentication.k8s.io/v1");
        assert_eq!(r["kind"], "TokenReview");
        assert_eq!(r["spec"]["audiences"], serde_json::json!(["istio-ca"]));
    }
    assert!(api.saw_reviewer_token());
}

/// The refusal's text, asserted to be a PermissionDenied.
async fn refused(client: &weft_identity::IstioCaClient, want: &SpiffeId) -> String {
    let err = client.sign(&request(want)).await.unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, Error::CaRefused { .. }), "{text}");
    assert!(text.contains("PermissionDenied"), "{text}");
    text
}

/// Hole 2 of #8, with static tokens: a workload's own node-bound token may not obtain its neighbour's identity;
/// the node agent's account may, but only for identities on its own node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn static_tokens_only_trusted_node_agents_may_impersonate() {
    let ca = TestCa::start(None, None).await;
    let workload = ca.client("token-client");
    // Its own identity: issued.
    workload
        .sign(&request(&id("default", "client")))
        .await
        .unwrap();
    // Its neighbour on the same node: refused, with the reason.
    let text = refused(&workload, &id("default", "neighbour")).await;
    assert!(
        text.contains("default/client is not a trusted node account"),
        "{text}"
    );
    // weft's own (trusted node agent) account on node-a: issued.
    let agent = ca.client("token-a");
    agent
        .sign(&request(&id("default", "neighbour")))
        .await
        .unwrap();
    agent
        .sign(&request(&id("default", "client")))
        .await
        .unwrap();
    // A trusted agent asking for an identity that is not on its node: still refused.
    let text = refused(&agent, &id("default", "echo")).await;
    assert!(text.contains("no workload on node node-a"), "{text}");
    let c = &ca.service.counters;
    assert_eq!(c.issued.load(std::sync::atomic::Ordering::Relaxed), 3);
    assert_eq!(c.refused.load(std::sync::atomic::Ordering::Relaxed), 2);
}

/// Hole 2 of #8, with TokenReview: the same rules for tokens the API server vouches for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_review_only_trusted_node_agents_may_impersonate() {
    let api = fake_kube_api().await;
    let auth = Authenticator::TokenReview {
        api: Box::new(
            weft_identity::KubeClient::new(&api.url, None, Some(api.reviewer_token_file.clone()))
                .unwrap(),
        ),
        audience: "istio-ca".into(),
        trust_domain: "cluster.local".into(),
    };
    let ca = TestCa::start(None, Some(auth)).await;
    // A workload's pod-bound token (default/client on node-a).
    let workload = ca.client(TOKEN_WORKLOAD_ON_A);
    workload
        .sign(&request(&id("default", "client")))
        .await
        .unwrap();
    let text = refused(&workload, &id("default", "neighbour")).await;
    assert!(
        text.contains("default/client is not a trusted node account"),
        "{text}"
    );
    // The node agent's token (weft-system/node-a, bound to node-a).
    let agent = ca.client(TOKEN_NODE_A);
    agent
        .sign(&request(&id("default", "neighbour")))
        .await
        .unwrap();
    let text = refused(&agent, &id("default", "echo")).await;
    assert!(text.contains("no workload on node node-a"), "{text}");
}

/// Without `--trusted-node-accounts` nobody may impersonate, not even a node agent; its own identity still works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_trusted_node_accounts_every_caller_gets_only_its_own_identity() {
    let ca = TestCa::start_trusting(None, None, TrustedNodeAccounts::none()).await;
    let agent = ca.client("token-a");
    agent
        .sign(&request(&id("weft-system", "node-a")))
        .await
        .unwrap();
    let text = refused(&agent, &id("default", "client")).await;
    assert!(
        text.contains("no node accounts are trusted (--trusted-node-accounts)"),
        "{text}"
    );
}
