//! A fake Kubernetes API server for TokenReview tests (feature `testing`; never linked by a shipped binary): real
//! HTTP on a loopback port, `POST /apis/authentication.k8s.io/v1/tokenreviews` answered as the API server does, and
//! `GET` of each token's pod.
//! Each token it knows has its own audiences, service account and node; a review is authenticated only when the
//! token's audiences meet the review's `spec.audiences`, and `status.audiences` is that intersection (what the
//! authenticator guarantees, per the TokenReview API reference). The caller must present `reviewer_token`.

#![allow(clippy::unwrap_used, clippy::missing_panics_doc)]

use std::convert::Infallible;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
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
    /// The node its pod runs on as the token says it (`authentication.kubernetes.io/node-name`, Kubernetes
    /// 1.30+); `None`: a token bound to its pod only, as before 1.30.
    pub node: Option<String>,
    /// The node the token's pod runs on, as `GET` of the pod answers (`spec.nodeName`).
    pub pod_node: String,
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
            pod_node: node.into(),
        }
    }

    /// The same token bound only to its pod (no node name in it), as Kubernetes before 1.30 issues them: a
    /// reviewer finds the node by reading the pod.
    pub fn pod_only(mut self) -> Self {
        self.node = None;
        self
    }

    /// Its pod's name and uid.
    fn pod(&self) -> (String, String) {
        (
            format!("{}-pod", self.service_account),
            format!("uid-of-{}-pod", self.service_account),
        )
    }
}

/// The fake API server.
pub struct FakeKubeApi {
    /// `http://127.0.0.1:<port>`.
    pub url: String,
    /// A file holding the reviewer's own token (what `--kube-token-file` names).
    pub reviewer_token_file: PathBuf,
    reviews: Arc<Mutex<Vec<Value>>>,
    saw_reviewer: Arc<AtomicBool>,
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
        let saw_reviewer = Arc::new(AtomicBool::new(false));
        let saw = saw_reviewer.clone();
        let tokens = Arc::new(tokens);
        let seen = reviews.clone();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let (tokens, seen, saw) = (tokens.clone(), seen.clone(), saw.clone());
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req| {
                        handle(tokens.clone(), seen.clone(), saw.clone(), req)
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
            saw_reviewer,
            _dir: dir,
        }
    }

    /// Every TokenReview received so far, as sent.
    pub fn reviews(&self) -> Vec<Value> {
        self.reviews.lock().unwrap().clone()
    }

    /// Whether a request presented the reviewer's own token.
    pub fn saw_reviewer_token(&self) -> bool {
        self.saw_reviewer.load(Ordering::Relaxed)
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
    saw_reviewer: Arc<AtomicBool>,
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
    saw_reviewer.store(true, Ordering::Relaxed);
    let (method, path) = (req.method().clone(), req.uri().path().to_owned());
    let body = req.into_body().collect().await.unwrap().to_bytes();
    if method == http::Method::GET {
        // GET /api/v1/namespaces/<ns>/pods/<name>: a token's pod.
        let pod = tokens
            .iter()
            .find(|t| path == format!("/api/v1/namespaces/{}/pods/{}", t.namespace, t.pod().0));
        return match pod {
            Some(t) => {
                let (name, uid) = t.pod();
                reply(
                    200,
                    json!({"apiVersion": "v1", "kind": "Pod",
                           "metadata": {"name": name, "namespace": t.namespace, "uid": uid},
                           "spec": {"nodeName": t.pod_node, "serviceAccountName": t.service_account}}),
                )
            }
            None => reply(
                404,
                status_body(404, "NotFound", &format!("{path} not found")),
            ),
        };
    }
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
                let (pod, uid) = t.pod();
                let mut extra = json!({
                    "authentication.kubernetes.io/pod-name": [pod],
                    "authentication.kubernetes.io/pod-uid": [uid],
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
