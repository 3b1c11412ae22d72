//! A plain HTTP/1.1 client for tests of the stand-in: one connection per request, JSON bodies, and watch streams
//! read line by line.

use std::net::SocketAddr;

use bytes::Bytes;
use http::{HeaderMap, Method, Request, header};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::net::TcpStream;

/// A request to the stand-in failed below the API (connection, HTTP, JSON).
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Connecting.
    #[error("connecting: {0}")]
    Io(#[from] std::io::Error),
    /// HTTP.
    #[error("http: {0}")]
    Hyper(#[from] hyper::Error),
    /// Building the request.
    #[error("building the request: {0}")]
    Http(#[from] http::Error),
    /// A body that is not JSON.
    #[error("the response is not JSON: {0}")]
    Json(#[from] serde_json::Error),
}

/// A response: its status code, headers and JSON body.
#[derive(Debug)]
pub struct Reply {
    /// The HTTP status code.
    pub code: u16,
    /// The response headers.
    pub headers: HeaderMap,
    /// The body.
    pub body: Value,
}

/// A client of one stand-in.
#[derive(Debug, Clone)]
pub struct Client {
    addr: SocketAddr,
}

async fn send(
    addr: SocketAddr,
    req: Request<Full<Bytes>>,
) -> Result<hyper::Response<Incoming>, ClientError> {
    let stream = TcpStream::connect(addr).await?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    Ok(sender.send_request(req).await?)
}

impl Client {
    /// A client of the stand-in at `addr`.
    pub fn new(addr: SocketAddr) -> Client {
        Client { addr }
    }

    /// Sends a request with an optional JSON body and content type; reads the whole JSON response.
    pub async fn request(
        &self,
        method: Method,
        path: &str,
        content_type: &str,
        body: Option<&Value>,
    ) -> Result<Reply, ClientError> {
        let req = Request::builder()
            .method(method)
            .uri(path)
            .header(header::HOST, self.addr.to_string())
            .header(header::CONTENT_TYPE, content_type)
            .header(header::ACCEPT, "application/json")
            .body(Full::new(Bytes::from(
                body.map(Value::to_string).unwrap_or_default(),
            )))?;
        let resp = send(self.addr, req).await?;
        let code = resp.status().as_u16();
        let headers = resp.headers().clone();
        let bytes = resp.into_body().collect().await?.to_bytes();
        Ok(Reply {
            code,
            headers,
            body: serde_json::from_slice(&bytes)?,
        })
    }

    /// GET.
    pub async fn get(&self, path: &str) -> Result<Reply, ClientError> {
        self.request(Method::GET, path, "application/json", None)
            .await
    }

    /// POST a JSON object.
    pub async fn post(&self, path: &str, body: &Value) -> Result<Reply, ClientError> {
        self.request(Method::POST, path, "application/json", Some(body))
            .await
    }

    /// PUT a JSON object.
    pub async fn put(&self, path: &str, body: &Value) -> Result<Reply, ClientError> {
        self.request(Method::PUT, path, "application/json", Some(body))
            .await
    }

    /// PATCH with a JSON merge patch.
    pub async fn merge_patch(&self, path: &str, patch: &Value) -> Result<Reply, ClientError> {
        self.request(
            Method::PATCH,
            path,
            "application/merge-patch+json",
            Some(patch),
        )
        .await
    }

    /// DELETE.
    pub async fn delete(&self, path: &str) -> Result<Reply, ClientError> {
        self.request(Method::DELETE, path, "application/json", None)
            .await
    }

    /// Starts a watch: `path` with its query (`?watch=1&resourceVersion=...`).
    pub async fn watch(&self, path: &str) -> Result<WatchStream, ClientError> {
        let req = Request::builder()
            .method(Method::GET)
            .uri(path)
            .header(header::HOST, self.addr.to_string())
            .header(header::ACCEPT, "application/json")
            .body(Full::new(Bytes::new()))?;
        let resp = send(self.addr, req).await?;
        Ok(WatchStream {
            code: resp.status().as_u16(),
            headers: resp.headers().clone(),
            body: resp.into_body(),
            buf: Vec::new(),
        })
    }
}

/// An open watch response, read one event (line) at a time.
#[derive(Debug)]
pub struct WatchStream {
    /// The HTTP status code.
    pub code: u16,
    /// The response headers.
    pub headers: HeaderMap,
    body: Incoming,
    buf: Vec<u8>,
}

impl WatchStream {
    /// The next event, or `None` once the server ended the stream.
    pub async fn next(&mut self) -> Result<Option<Value>, ClientError> {
        loop {
            if let Some(end) = self.buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=end).collect();
                return Ok(Some(serde_json::from_slice(&line)?));
            }
            match self.body.frame().await.transpose()? {
                Some(frame) => {
                    if let Ok(data) = frame.into_data() {
                        self.buf.extend_from_slice(&data);
                    }
                }
                None if self.buf.iter().all(u8::is_ascii_whitespace) => return Ok(None),
                None => {
                    let rest = std::mem::take(&mut self.buf);
                    return Ok(Some(serde_json::from_slice(&rest)?));
                }
            }
        }
    }
}
