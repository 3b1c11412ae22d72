//! Who is calling: a bearer token turned into a node (its name and its own SPIFFE identity), either by a
//! Kubernetes TokenReview (`authentication.k8s.io/v1`, audience `istio-ca`; the node from the token's pod/node
//! binding in `status.user.extra`) or by a static token file for tests and demos without Kubernetes.
//! Shared by the reference CA (`weft-ca`) and `weft-control`, down to how their flags choose one ([`Authenticator::from_flags`]).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use http::Method;
use serde::Deserialize;
use serde_json::json;
use weft_identity::{KubeClient, SpiffeId};

/// The authenticated caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// The node the caller runs on, when the token says (a token bound to no node may only ask for its own
    /// identity).
    pub node: Option<String>,
    /// The caller's own identity (its service account).
    pub identity: SpiffeId,
}

/// Why a token was not accepted.
#[derive(Debug, Clone, thiserror::Error)]
pub enum AuthError {
    /// No `authorization: Bearer` header.
    #[error("no bearer token")]
    NoToken,
    /// The token is not valid (unknown, expired, wrong audience, ...).
    #[error("token rejected: {0}")]
    Rejected(String),
    /// The authenticator could not decide (API server unreachable, unreadable token file).
    #[error("cannot authenticate now: {0}")]
    Unavailable(String),
}

/// One line of the static token file.
#[derive(Debug, Clone, Deserialize)]
pub struct StaticToken {
    /// The bearer token.
    pub token: String,
    /// The node it belongs to.
    pub node: String,
    /// The node's own SPIFFE identity.
    pub identity: String,
}

/// The static token file: `tokens: [{token, node, identity}, ...]` (YAML or JSON).
#[derive(Debug, Clone, Deserialize)]
pub struct StaticTokens {
    /// Accepted tokens.
    pub tokens: Vec<StaticToken>,
}

/// A static token file, re-read on every request (so edits apply at once) and parsed again only when its text
/// changed: with thousands of nodes connecting, parsing a file of thousands of tokens for each would cost each
/// stream time in proportion to the fleet.
#[derive(Debug, Clone)]
pub struct StaticFile {
    path: PathBuf,
    parsed: Arc<Mutex<Option<Parsed>>>,
}

/// The token file as last parsed.
#[derive(Debug)]
struct Parsed {
    text: String,
    by_token: HashMap<String, StaticToken>,
}

impl StaticFile {
    /// The token file at `path`.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            parsed: Arc::new(Mutex::new(None)),
        }
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The entry of `token`, from the file as it is now.
    async fn lookup(&self, token: &str) -> Result<StaticToken, AuthError> {
        let text = tokio::fs::read_to_string(&self.path)
            .await
            .map_err(|e| AuthError::Unavailable(format!("reading {}: {e}", self.path.display())))?;
        let unknown = || AuthError::Rejected("unknown token".into());
        {
            let g = self.parsed.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(p) = g.as_ref().filter(|p| p.text == text) {
                return p.by_token.get(token).cloned().ok_or_else(unknown);
            }
        }
        let file: StaticTokens = serde_yaml::from_str(&text)
            .map_err(|e| AuthError::Unavailable(format!("parsing {}: {e}", self.path.display())))?;
        let mut by_token = HashMap::with_capacity(file.tokens.len());
        for t in file.tokens {
            // The first entry of a token wins, as a scan of the file finds it.
            by_token.entry(t.token.clone()).or_insert(t);
        }
        let found = by_token.get(token).cloned();
        *self.parsed.lock().unwrap_or_else(PoisonError::into_inner) =
            Some(Parsed { text, by_token });
        found.ok_or_else(unknown)
    }
}

/// How tokens are checked.
#[derive(Debug, Clone)]
pub enum Authenticator {
    /// A token file, re-read on every request (so edits apply at once).
    Static(StaticFile),
    /// Kubernetes TokenReview.
    TokenReview {
        /// The API server.
        api: Box<KubeClient>,
        /// Audience the token must carry (`istio-ca`).
        audience: String,
        /// Trust domain of the identities derived from service accounts.
        trust_domain: String,
    },
}

/// Why the flags name no usable authenticator.
#[derive(Debug, thiserror::Error)]
pub enum AuthFlagsError {
    /// Neither a token file nor an API server.
    #[error("give --tokens or --kube-api")]
    Neither,
    /// The API server client could not be built.
    #[error("--kube-api: {0}")]
    Kube(#[from] weft_identity::Error),
}

impl Authenticator {
    /// What `--tokens` / `--kube-api` (with `--kube-ca-file`, `--kube-token-file`, `--audience`) choose: the
    /// token file if given, else TokenReview against the API server.
    pub fn from_flags(
        tokens: Option<&Path>,
        kube_api: Option<&str>,
        kube_ca_file: Option<&Path>,
        kube_token_file: Option<PathBuf>,
        audience: &str,
        trust_domain: &str,
    ) -> Result<Self, AuthFlagsError> {
        match (tokens, kube_api) {
            (Some(path), _) => Ok(Self::Static(StaticFile::new(path))),
            (None, Some(url)) => Ok(Self::TokenReview {
                api: Box::new(KubeClient::new(url, kube_ca_file, kube_token_file)?),
                audience: audience.to_owned(),
                trust_domain: trust_domain.to_owned(),
            }),
            (None, None) => Err(AuthFlagsError::Neither),
        }
    }
}

/// The token of an `authorization: Bearer <token>` header value (`None` for another scheme or an empty token).
pub fn bearer_token(header: &str) -> Option<String> {
    let (scheme, token) = header.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim().to_owned())
        .filter(|t| !t.is_empty())
}

/// The bearer token of a gRPC request's `authorization` metadata.
pub fn request_bearer<T>(req: &tonic::Request<T>) -> Option<String> {
    bearer_token(req.metadata().get("authorization")?.to_str().ok()?)
}

/// `authentication.kubernetes.io/...` keys of `status.user.extra` (Kubernetes sets them for projected service-account
/// tokens bound to a pod: the node and pod the token was issued for).
const EXTRA_NODE_NAME: &str = "authentication.kubernetes.io/node-name";
const EXTRA_POD_NAME: &str = "authentication.kubernetes.io/pod-name";
const EXTRA_POD_UID: &str = "authentication.kubernetes.io/pod-uid";

impl Authenticator {
    /// Authenticate `token`.
    pub async fn authenticate(&self, token: &str) -> Result<Caller, AuthError> {
        match self {
            Authenticator::Static(file) => {
                let t = file.lookup(token).await?;
                let identity = t.identity.parse().map_err(|e| {
                    AuthError::Unavailable(format!("token file identity for {}: {e}", t.node))
                })?;
                Ok(Caller {
                    node: Some(t.node),
                    identity,
                })
            }
            Authenticator::TokenReview {
                api,
                audience,
                trust_domain,
            } => token_review(api, audience, trust_domain, token).await,
        }
    }
}

async fn token_review(
    api: &KubeClient,
    audience: &str,
    trust_domain: &str,
    token: &str,
) -> Result<Caller, AuthError> {
    let body = json!({
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenReview",
        "spec": { "token": token, "audiences": [audience] },
    });
    let (status, review) = api
        .request(
            Method::POST,
            "/apis/authentication.k8s.io/v1/tokenreviews",
            Some(&body),
        )
        .await
        .map_err(|e| AuthError::Unavailable(e.to_string()))?;
    if !(200..300).contains(&status) {
        return Err(AuthError::Unavailable(format!(
            "TokenReview answered {status}: {}",
            weft_identity::kube::status_message(&review)
        )));
    }
    let st = review.get("status").cloned().unwrap_or_default();
    if st.get("authenticated").and_then(|a| a.as_bool()) != Some(true) {
        let why = st
            .get("error")
            .and_then(|e| e.as_str())
            .unwrap_or("not authenticated");
        return Err(AuthError::Rejected(why.to_owned()));
    }
    // The audiences the authenticator vouches for: they must include ours. An answer without them (an API server
    // that ignored `spec.audiences`) vouches for none, so the token is refused rather than taken as ours.
    match st.get("audiences").and_then(|a| a.as_array()) {
        Some(auds) if auds.iter().any(|a| a.as_str() == Some(audience)) => {}
        Some(auds) => {
            return Err(AuthError::Rejected(format!(
                "token audiences {auds:?} lack {audience}"
            )));
        }
        None => {
            return Err(AuthError::Rejected(format!(
                "the TokenReview answer names no audiences, so none vouches for {audience}"
            )));
        }
    }
    let user = st.get("user").cloned().unwrap_or_default();
    let username = user
        .get("username")
        .and_then(|u| u.as_str())
        .unwrap_or_default();
    let (ns, sa) = username
        .strip_prefix("system:serviceaccount:")
        .and_then(|rest| rest.split_once(':'))
        .ok_or_else(|| AuthError::Rejected(format!("{username:?} is not a service account")))?;
    let identity =
        SpiffeId::new(trust_domain, ns, sa).map_err(|e| AuthError::Rejected(e.to_string()))?;
    let extra = |key: &str| {
        user.pointer(&format!("/extra/{}", key.replace('/', "~1")))
            .and_then(|v| v.as_array())
            .and_then(|a| a.first())
            .and_then(|v| v.as_str())
            .map(str::to_owned)
    };
    let node = match extra(EXTRA_NODE_NAME) {
        Some(n) => Some(n),
        // Before Kubernetes 1.30 a bound token names its pod, not its node: ask where that pod runs.
        None => match extra(EXTRA_POD_NAME) {
            Some(pod) => pod_node(api, ns, &pod, extra(EXTRA_POD_UID).as_deref()).await?,
            None => None,
        },
    };
    Ok(Caller { node, identity })
}

async fn pod_node(
    api: &KubeClient,
    ns: &str,
    pod: &str,
    uid: Option<&str>,
) -> Result<Option<String>, AuthError> {
    let (status, body) = api
        .request(
            Method::GET,
            &format!("/api/v1/namespaces/{ns}/pods/{pod}"),
            None,
        )
        .await
        .map_err(|e| AuthError::Unavailable(e.to_string()))?;
    if status == 404 {
        return Err(AuthError::Rejected(format!(
            "pod {ns}/{pod} no longer exists"
        )));
    }
    if !(200..300).contains(&status) {
        return Err(AuthError::Unavailable(format!(
            "reading pod {ns}/{pod}: {status}"
        )));
    }
    if let Some(want) = uid
        && body.pointer("/metadata/uid").and_then(|u| u.as_str()) != Some(want)
    {
        return Err(AuthError::Rejected(format!(
            "pod {ns}/{pod} was replaced since the token was issued"
        )));
    }
    Ok(body
        .pointer("/spec/nodeName")
        .and_then(|n| n.as_str())
        .map(str::to_owned))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a test panics to fail
mod tests {
    use super::*;

    fn tokens(entries: &[(&str, &str)]) -> String {
        let mut s = String::from("tokens:\n");
        for (token, node) in entries {
            s.push_str(&format!(
                "- {{token: {token}, node: {node}, identity: spiffe://cluster.local/ns/weft-system/sa/weft}}\n"
            ));
        }
        s
    }

    #[tokio::test]
    async fn a_static_token_file_edit_applies_to_the_next_stream_even_at_the_same_size() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens.yaml");
        std::fs::write(&path, tokens(&[("aaaa", "node-a"), ("bbbb", "node-b")])).unwrap();
        let auth = Authenticator::Static(StaticFile::new(&path));
        let a = auth.authenticate("aaaa").await.unwrap();
        assert_eq!(a.node.as_deref(), Some("node-a"));
        assert_eq!(
            auth.authenticate("bbbb").await.unwrap().node.as_deref(),
            Some("node-b")
        );
        assert!(matches!(
            auth.authenticate("cccc").await,
            Err(AuthError::Rejected(_))
        ));
        // Rewritten in place, same length: the file's text is what counts.
        std::fs::write(&path, tokens(&[("cccc", "node-a"), ("bbbb", "node-b")])).unwrap();
        assert!(matches!(
            auth.authenticate("aaaa").await,
            Err(AuthError::Rejected(_))
        ));
        assert_eq!(
            auth.authenticate("cccc").await.unwrap().node.as_deref(),
            Some("node-a")
        );
        // A file that no longer parses: unavailable, not a stale answer.
        std::fs::write(&path, "tokens: [").unwrap();
        assert!(matches!(
            auth.authenticate("cccc").await,
            Err(AuthError::Unavailable(_))
        ));
    }
}
