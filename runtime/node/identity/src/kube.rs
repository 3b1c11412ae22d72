//! A minimal Kubernetes API client: JSON requests over HTTP/1.1 (one connection per request; these calls are
//! rare), `https://` with the cluster CA from a file, or plain `http://` for tests against a local server; the
//! bearer token is read from its file on every request (projected tokens rotate). Used by the CSR API client here
//! and by the reference CA for TokenReview.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Uri};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use rustls_pki_types::ServerName;
use tokio::net::TcpStream;

use crate::Error;

/// A Kubernetes API server endpoint.
#[derive(Clone)]
pub struct KubeClient {
    base: Uri,
    host: String,
    port: u16,
    tls: Option<(Arc<rustls::ClientConfig>, ServerName<'static>)>,
    token_file: Option<PathBuf>,
    timeout: Duration,
}

impl std::fmt::Debug for KubeClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeClient")
            .field("base", &self.base)
            .finish_non_exhaustive()
    }
}

impl KubeClient {
    /// A client for `url` (`https://host:port` with `ca_file`, or `http://` for tests), authenticating with the
    /// token in `token_file` when given.
    pub fn new(
        url: &str,
        ca_file: Option<&Path>,
        token_file: Option<PathBuf>,
    ) -> Result<Self, Error> {
        let base: Uri = url
            .trim_end_matches('/')
            .parse()
            .map_err(|e| Error::Ca(format!("API server URL {url:?}: {e}")))?;
        let host = base
            .host()
            .ok_or_else(|| Error::Ca(format!("API server URL {url:?} has no host")))?
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let https = match base.scheme_str() {
            Some("https") => true,
            Some("http") => false,
            _ => {
                return Err(Error::Ca(format!(
                    "API server URL {url:?}: expected http(s)://"
                )));
            }
        };
        let port = base.port_u16().unwrap_or(if https { 443 } else { 80 });
        let tls = if https {
            let ca = ca_file
                .ok_or_else(|| Error::Ca("an https API server needs a CA file to trust".into()))?;
            let pem = std::fs::read_to_string(ca)
                .map_err(|e| Error::Ca(format!("reading {}: {e}", ca.display())))?;
            let mut cfg = crate::istio::control_plane_tls(&[pem])?;
            cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
            let name = ServerName::try_from(host.clone())
                .map_err(|e| Error::Ca(format!("API server name {host:?}: {e}")))?;
            Some((Arc::new(cfg), name))
        } else {
            None
        };
        Ok(Self {
            base,
            host,
            port,
            tls,
            token_file,
            timeout: Duration::from_secs(10),
        })
    }

    /// Deadline of one request (default 10 s).
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Send `method path` with an optional JSON body; returns the status and the JSON answer (`null` when empty).
    pub async fn request(
        &self,
        method: Method,
        path: &str,
        body: Option<&serde_json::Value>,
    ) -> Result<(u16, serde_json::Value), Error> {
        match tokio::time::timeout(self.timeout, self.request_inner(method, path, body)).await {
            Ok(r) => r,
            Err(_) => Err(Error::CaUnavailable(format!(
                "API server {} did not answer within {:?}",
                self.base, self.timeout
            ))),
        }
    }

    async fn request_inner(
        &self,
        method: Method,
        path: &str,
        body: Option<&serde_json::Value>,
    ) -> Result<(u16, serde_json::Value), Error> {
        let unavailable = |e: &dyn std::fmt::Display| {
            Error::CaUnavailable(format!("API server {}: {e}", self.base))
        };
        let tcp = TcpStream::connect((self.host.as_str(), self.port))
            .await
            .map_err(|e| unavailable(&e))?;
        tcp.set_nodelay(true).map_err(|e| unavailable(&e))?;
        let base_path = self.base.path().trim_end_matches('/');
        let mut req = Request::builder()
            .method(method)
            .uri(format!("{base_path}{path}"))
            .header(
                http::header::HOST,
                self.base.authority().map(|a| a.as_str()).unwrap_or(""),
            )
            .header(http::header::ACCEPT, "application/json");
        if let Some(p) = &self.token_file {
            let token = tokio::fs::read_to_string(p)
                .await
                .map_err(|e| Error::Ca(format!("reading token file {}: {e}", p.display())))?;
            req = req.header(
                http::header::AUTHORIZATION,
                format!("Bearer {}", token.trim()),
            );
        }
        let bytes = match body {
            Some(b) => {
                req = req.header(http::header::CONTENT_TYPE, "application/json");
                Bytes::from(serde_json::to_vec(b).map_err(|e| Error::Ca(e.to_string()))?)
            }
            None => Bytes::new(),
        };
        let req = req
            .body(Full::new(bytes))
            .map_err(|e| Error::Ca(format!("building request: {e}")))?;
        let resp = match &self.tls {
            Some((cfg, name)) => {
                let tls = tokio_rustls::TlsConnector::from(cfg.clone())
                    .connect(name.clone(), tcp)
                    .await
                    .map_err(|e| unavailable(&e))?;
                send(TokioIo::new(tls), req).await
            }
            None => send(TokioIo::new(tcp), req).await,
        }
        .map_err(|e| unavailable(&e))?;
        let status = resp.status().as_u16();
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| unavailable(&e))?
            .to_bytes();
        let json = if body.is_empty() {
            serde_json::Value::Null
        } else {
            serde_json::from_slice(&body).map_err(|e| {
                Error::Ca(format!(
                    "API server answered {status} with a body that is not JSON: {e}"
                ))
            })?
        };
        Ok((status, json))
    }
}

async fn send<I>(
    io: I,
    req: Request<Full<Bytes>>,
) -> Result<http::Response<hyper::body::Incoming>, hyper::Error>
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io).await?;
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!(error = %e, "API server connection");
        }
    });
    sender.send_request(req).await
}

/// The `message` of a Kubernetes `Status` answer, or the body as text.
pub fn status_message(body: &serde_json::Value) -> String {
    body.get("message")
        .and_then(|m| m.as_str())
        .map(str::to_owned)
        .unwrap_or_else(|| body.to_string())
}
