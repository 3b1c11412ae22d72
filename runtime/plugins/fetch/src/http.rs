//! A small HTTPS/1.1 client over hyper and weft's rustls: one connection per request (fetches are rare), bodies
//! read up to a limit, redirects followed to https only (credentials dropped when the host changes).

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use rustls_pki_types::ServerName;
use tokio::net::TcpStream;

use crate::FetchError;

pub(crate) type Headers = HeaderMap;

const MAX_REDIRECTS: usize = 5;
/// How much of an error response's body is kept (for the message).
const ERROR_BODY: u64 = 64 << 10;

/// A response with its body read.
#[derive(Debug)]
pub(crate) struct Response {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

#[derive(Clone)]
pub(crate) struct Client {
    tls: tokio_rustls::TlsConnector,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client").finish_non_exhaustive()
    }
}

fn host_of(uri: &Uri) -> &str {
    let h = uri.host().unwrap_or_default();
    h.strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(h)
}

impl Client {
    pub fn new(tls: Arc<rustls::ClientConfig>) -> Self {
        Self {
            tls: tokio_rustls::TlsConnector::from(tls),
        }
    }

    /// GET `uri`, following redirects. `limit` bounds a success body (more is an error); an error body is cut at
    /// 64 KiB.
    pub async fn get(
        &self,
        uri: &Uri,
        mut headers: Headers,
        limit: u64,
    ) -> Result<Response, FetchError> {
        let mut url = uri.clone();
        for _ in 0..=MAX_REDIRECTS {
            let resp = self.once(&url, &headers, limit).await?;
            if !resp.status.is_redirection() || resp.status == StatusCode::NOT_MODIFIED {
                return Ok(resp);
            }
            let location = resp
                .headers
                .get(header::LOCATION)
                .and_then(|l| l.to_str().ok())
                .ok_or_else(|| FetchError::Redirect {
                    url: url.to_string(),
                    reason: format!("{} without a Location", resp.status),
                })?;
            let next = resolve(&url, location).map_err(|reason| FetchError::Redirect {
                url: url.to_string(),
                reason,
            })?;
            if next.scheme_str() != Some("https") {
                return Err(FetchError::Redirect {
                    url: url.to_string(),
                    reason: format!("to {next}: only https is followed"),
                });
            }
            if next.authority() != url.authority() {
                headers.remove(header::AUTHORIZATION);
            }
            tracing::debug!(from = %url, to = %next, "following redirect");
            url = next;
        }
        Err(FetchError::Redirect {
            url: uri.to_string(),
            reason: format!("more than {MAX_REDIRECTS} redirects"),
        })
    }

    async fn once(&self, url: &Uri, headers: &Headers, limit: u64) -> Result<Response, FetchError> {
        let connect = |reason: String| FetchError::Connect {
            url: url.to_string(),
            reason,
        };
        let transport = |reason: String| FetchError::Transport {
            url: url.to_string(),
            reason,
        };
        if url.scheme_str() != Some("https") {
            return Err(connect("only https is supported".into()));
        }
        let host = host_of(url).to_string();
        let port = url.port_u16().unwrap_or(443);
        let tcp = TcpStream::connect((host.as_str(), port))
            .await
            .map_err(|e| connect(e.to_string()))?;
        tcp.set_nodelay(true).ok();
        let name = ServerName::try_from(host.clone()).map_err(|e| connect(e.to_string()))?;
        let tls = self
            .tls
            .connect(name, tcp)
            .await
            .map_err(|e| connect(format!("TLS: {e}")))?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .map_err(|e| transport(e.to_string()))?;
        let driver = tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "fetch connection ended");
            }
        });
        let path = url.path_and_query().map_or("/", |p| p.as_str());
        let mut req = http::Request::builder()
            .method(Method::GET)
            .uri(path)
            .body(Empty::<Bytes>::new())
            .map_err(|e| transport(e.to_string()))?;
        *req.headers_mut() = headers.clone();
        let authority = url.authority().map_or(host.clone(), |a| a.to_string());
        req.headers_mut().insert(
            header::HOST,
            HeaderValue::from_str(&authority).map_err(|e| transport(e.to_string()))?,
        );
        req.headers_mut().insert(
            header::USER_AGENT,
            HeaderValue::from_static(concat!("weft/", env!("CARGO_PKG_VERSION"))),
        );
        let resp = sender
            .send_request(req)
            .await
            .map_err(|e| transport(e.to_string()))?;
        let status = resp.status();
        let headers = resp.headers().clone();
        let ok = status.is_success();
        let cap = if ok { limit } else { limit.min(ERROR_BODY) };
        if ok
            && let Some(len) = headers
                .get(header::CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<u64>().ok())
            && len > limit
        {
            driver.abort();
            return Err(FetchError::TooLarge {
                what: "response body",
                url: url.to_string(),
                limit,
            });
        }
        let mut body = resp.into_body();
        let mut buf = BytesMut::new();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| transport(e.to_string()))?;
            if let Some(data) = frame.data_ref() {
                if (buf.len() + data.len()) as u64 > cap {
                    if ok {
                        driver.abort();
                        return Err(FetchError::TooLarge {
                            what: "response body",
                            url: url.to_string(),
                            limit,
                        });
                    }
                    let room = (cap as usize).saturating_sub(buf.len());
                    buf.extend_from_slice(&data[..room.min(data.len())]);
                    break;
                }
                buf.extend_from_slice(data);
            }
        }
        driver.abort();
        Ok(Response {
            status,
            headers,
            body: buf.freeze(),
        })
    }
}

/// Resolves a `Location` against the URL it came from (absolute, or an absolute path).
fn resolve(base: &Uri, location: &str) -> Result<Uri, String> {
    if location.contains("://") {
        return location.parse().map_err(|e| format!("bad Location: {e}"));
    }
    if !location.starts_with('/') {
        return Err(format!("relative Location {location:?} is not supported"));
    }
    let authority = base.authority().ok_or("no authority")?.as_str();
    format!("https://{authority}{location}")
        .parse()
        .map_err(|e| format!("bad Location: {e}"))
}

/// Percent-encodes a query value (RFC 3986 unreserved kept).
pub(crate) fn encode_query(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations_resolve() {
        let base: Uri = "https://r.io:5000/v2/x/blobs/sha256:1"
            .parse()
            .unwrap_or_default();
        assert_eq!(
            resolve(&base, "/b/1?x=2").map(|u| u.to_string()),
            Ok("https://r.io:5000/b/1?x=2".to_string())
        );
        assert_eq!(
            resolve(&base, "https://s3.example/b").map(|u| u.to_string()),
            Ok("https://s3.example/b".to_string())
        );
        assert!(resolve(&base, "b/1").is_err());
        assert_eq!(
            encode_query("repository:a/b:pull"),
            "repository%3Aa%2Fb%3Apull"
        );
        assert_eq!(
            host_of(&"https://[::1]:5000/x".parse().unwrap_or_default()),
            "::1"
        );
    }
}
