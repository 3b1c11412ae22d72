//! A fake Kubernetes API server for TokenReview tests (feature `testing`; never linked by a shipped binary): real
//! HTTP on a loopback port, `POST /apis/authentication.k8s.io/v1/tokenreviews` answered as the API server does.
//! Each token it knows has its own audiences, service account and node; a review is authenticated only when the
//! token's audiences meet the review's `spec.audiences`, and `status.audiences` is that intersection (what the
//! authenticator guarantees, per the TokenReview API reference). The caller must present `reviewer_token`.

#![allow(clippy::unwrap_used, clippy::missing_panics_doc)]

use std::convert::Infallible;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};

/// The token the reviewer itself presents to the fake API server.
const REVIEWER_TOKEN: &str = "the-reviewer-itself";

/// A token the fake API server knows.
#[derive(Debug, Clone)]
pub struct FakeToken {
    /// The bearer token.
    pub token: String,
    /// Its service account's namespace.
    pub namespace: String,
    /// Its service account.
    pub service_account: String,
    /// The audiences it was issued for.
    pub audiences: Vec<String>,
    /// The node its pod runs on (`authentication.kubernetes.io/node-name`, Kubernetes 1.30+).
    pub node: Option<String>,
}

impl FakeToken {
    /// A token of `namespace/service_account` for `audiences`, bound to a pod on `node`.
    pub fn new(
        token: &str,
        namespace: &str,
        service_account: &str,
        audiences: &[&str],
        node: &str,
    ) -> Self {
        Self {
            token: token.into(),
            namespace: namespace.into(),
            service_account: service_account.into(),
            audiences: audiences.iter().map(|a| a.to_string()).collect(),
            node: Some(node.into()),
        }
    }
}

/// The fake API server.
pub struct FakeKubeApi {
    /// `http://127.0.0.1:<port>`.
    pub url: String,
    /// A file holding the reviewer's own token (what `--kube-token-file` names).
    pub reviewer_token_file: PathBuf,
    reviews: Arc<Mutex<Vec<Value>>>,
    _dir: tempfile::TempDir,
}

impl FakeKubeApi {
    /// Serve `tokens` on a free loopback port.
    pub async fn start(tokens: Vec<FakeToken>) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let reviewer_token_file = dir.path().join("reviewer-token");
        std::fs::write(&reviewer_token_file, REVIEWER_TOKEN).unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let reviews = Arc::new(Mutex::new(Vec::new()));
        let tokens = Arc::new(tokens);
        let seen = reviews.clone();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let (tokens, seen) = (tokens.clone(), seen.clone());
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req| {
                        handle(tokens.clone(), seen.clone(), req)
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tcp), svc)
                        .await;
                });
            }
        });
        Self {
            url,
            reviewer_token_file,
            reviews,
            _dir: dir,
        }
    }

    /// Every TokenReview received so far, as sent.
    pub fn reviews(&self) -> Vec<Value> {
        self.reviews.lock().unwrap().clone()
    }
}

fn reply(status: u16, body: Value) -> Result<http::Response<Full<Bytes>>, Infallible> {
    Ok(http::Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap())
}

fn status_body(code: u16, reason: &str, message: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message, "reason": reason,
           "code": code})
}

async fn handle(
    tokens: Arc<Vec<FakeToken>>,
    seen: Arc<Mutex<Vec<Value>>>,
    req: http::Request<hyper::body::Incoming>,
) -> Result<http::Response<Full<Bytes>>, Infallible> {
    let authorized = req
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        == Some(&format!("Bearer {REVIEWER_TOKEN}"));
    if !authorized {
        return reply(401, status_body(401, "Unauthorized", "Unauthorized"));
    }
    let (method, path) = (req.method().clone(), req.uri().path().to_owned());
    let body = req.into_body().collect().await.unwrap().to_bytes();
    if method != http::Method::POST || path != "/apis/authentication.k8s.io/v1/tokenreviews" {
        return reply(
            404,
            status_body(404, "NotFound", &format!("{path} not found")),
        );
    }
    let review: Value = serde_json::from_slice(&body).unwrap_or_default();
    seen.lock().unwrap().push(review.clone());
    let token = review["spec"]["token"].as_str().unwrap_or("");
    // No audiences asked: the API server's own (here: none a test token carries).
    let wanted: Vec<String> = review["spec"]["audiences"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    let status = match tokens.iter().find(|t| t.token == token) {
        None => {
            json!({"user": {}, "error": "[invalid bearer token, service account token has expired]"})
        }
        Some(t) => {
            let both: Vec<&String> = t.audiences.iter().filter(|a| wanted.contains(a)).collect();
            if both.is_empty() {
                json!({"user": {}, "error": format!(
                    "[invalid bearer token, token audiences {:?} is invalid for the target audiences {:?}]",
                    t.audiences, wanted)})
            } else {
                let mut extra = json!({
                    "authentication.kubernetes.io/pod-name": [format!("{}-pod", t.service_account)],
                    "authentication.kubernetes.io/pod-uid": [format!("uid-of-{}-pod", t.service_account)],
                });
                if let Some(n) = &t.node {
                    extra["authentication.kubernetes.io/node-name"] = json!([n]);
                }
                json!({"authenticated": true, "audiences": both, "user": {
                    "username": format!("system:serviceaccount:{}:{}", t.namespace, t.service_account),
                    "uid": format!("uid-of-{}", t.service_account),
                    "groups": ["system:serviceaccounts", format!("system:serviceaccounts:{}", t.namespace),
                               "system:authenticated"],
                    "extra": extra,
                }})
            }
        }
    };
    let mut out = review;
    out["metadata"] = json!({"creationTimestamp": null});
    out["status"] = status;
    reply(201, out)
}
