//! A tiny HTTP/1.1 client for weft's admin, metrics and readiness endpoints (no dependency on an HTTP stack).

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Send one request and return (status, body).
pub async fn request(addr: SocketAddr, method: &str, path: &str) -> std::io::Result<(u16, String)> {
    let work = async {
        let mut s = TcpStream::connect(addr).await?;
        let req = format!(
            "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
        );
        s.write_all(req.as_bytes()).await?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await?;
        let text = String::from_utf8_lossy(&buf).into_owned();
        let status = text
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| std::io::Error::other(format!("bad response: {text:.200}")))?;
        let body = text
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_owned())
            .unwrap_or_default();
        Ok((status, body))
    };
    tokio::time::timeout(Duration::from_secs(10), work)
        .await
        .map_err(|_| std::io::Error::other(format!("{method} {path} to {addr} timed out")))?
}

/// GET.
pub async fn get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    request(addr, "GET", path).await
}
