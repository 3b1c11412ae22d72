//! One credential per audience: weft control reviews node tokens with a Kubernetes TokenReview (real HTTP to a fake
//! API server that answers as the API reference says, real gRPC over TLS to weft control) for its own audience,
//! `weft-control`: a token issued for istiod (`istio-ca`) is refused, and so is a token of any service account that
//! is not a node agent's (`--node-accounts`), however valid; those refusals are counted and audit-logged.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::HashMap;

use common::{AdsClient, Env, channel, http_get, node};
use weft_control::ads::NodeAccount;
use weft_control::auth::Authenticator;
use weft_control::auth::testing::{FakeKubeApi, FakeToken};
use weft_identity::kube::KubeClient;
use weft_proto::type_url::ADDRESS;

const AUDIENCE: &str = "weft-control";

async fn api() -> FakeKubeApi {
    FakeKubeApi::start(vec![
        // The node agent's weft-control token (the chart's second projected token).
        FakeToken::new(
            "agent-control",
            "weft-system",
            "weft",
            &[AUDIENCE],
            "node-a",
        ),
        // The same agent's istio-ca token (what it sends to istiod).
        FakeToken::new(
            "agent-istio",
            "weft-system",
            "weft",
            &["istio-ca"],
            "node-a",
        ),
        // A workload's token with the right audience: valid, but no node agent.
        FakeToken::new(
            "workload-control",
            "default",
            "client",
            &[AUDIENCE],
            "node-a",
        ),
    ])
    .await
}

fn token_review(api: &FakeKubeApi) -> Authenticator {
    Authenticator::TokenReview {
        api: Box::new(
            KubeClient::new(&api.url, None, Some(api.reviewer_token_file.clone())).unwrap(),
        ),
        audience: AUDIENCE.into(),
        trust_domain: "cluster.local".into(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_node_agent_tokens_for_weft_controls_audience_stream() {
    let api = api().await;
    let env = Env::new(&[]);
    let mut cfg = env.config();
    cfg.auth = token_review(&api);
    cfg.node_accounts = vec!["weft-system/weft".parse::<NodeAccount>().unwrap()];
    let srv = weft_control::ads::start(cfg).await.unwrap();
    let ch = || channel(srv.addr, &env.root_pem);

    // The node agent's weft-control token: served.
    let mut c = AdsClient::open(ch(), Some("agent-control"), node("node-a"))
        .await
        .unwrap();
    c.subscribe(ADDRESS, HashMap::new()).await;
    let r = c.recv().await;
    assert_eq!(r.type_url, ADDRESS);

    // The same agent's token for istiod: refused here (it was accepted when weft control reviewed for istio-ca).
    let e = AdsClient::open(ch(), Some("agent-istio"), node("node-a"))
        .await
        .err()
        .unwrap();
    assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e}");
    assert!(e.message().contains("istio-ca"), "{e}");

    // A valid token for weft-control, of a workload's service account: refused, with the account named.
    let e = AdsClient::open(ch(), Some("workload-control"), node("node-a"))
        .await
        .err()
        .unwrap();
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e}");
    assert!(e.message().contains("default/client"), "{e}");

    // Every review asked for weft control's audience, and no other.
    let reviews = api.reviews();
    assert_eq!(reviews.len(), 3, "{reviews:?}");
    for r in &reviews {
        assert_eq!(r["spec"]["audiences"], serde_json::json!([AUDIENCE]), "{r}");
    }
    let (_, metrics) = http_get(srv.metrics_addr.unwrap(), "/metrics").await;
    for reason in ["token_rejected", "account_not_allowed"] {
        assert!(
            metrics.contains(&format!(
                "weft_control_streams_refused_total{{reason=\"{reason}\"}} 1"
            )),
            "{reason} not counted:\n{metrics}"
        );
    }
    srv.stop.cancel();
}

/// weft control refuses to start with TokenReview and no node accounts: every service account would be a node.
#[test]
fn token_review_without_node_accounts_does_not_start() {
    use clap::Parser as _;
    let args = weft_control::ads::cli::ControlArgs::try_parse_from([
        "weft-control",
        "--kube-api",
        "https://127.0.0.1:6443",
        "--tls-cert",
        "/nonexistent/cert.pem",
        "--tls-key",
        "/nonexistent/key.pem",
    ])
    .unwrap();
    assert_eq!(
        args.audience, AUDIENCE,
        "weft control's own audience by default"
    );
    let err = weft_control::ads::cli::tls_and_auth(&args)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("--node-accounts"), "{err}");
}
