//! Entry points for the fuzz targets in `fuzz/` (not a stable API): the parsers of bytes a peer sends, which are
//! otherwise private to the data path. Each is a thin wrapper, so the fuzzers exercise the code that runs.

use std::net::SocketAddr;

use http::HeaderMap;
use tokio::io::{AsyncRead, AsyncWrite};

/// The SOCKS5 greeting and request as the SOCKS5 listener reads them: the destination, `None` after an error
/// reply, or the I/O error that ended the handshake.
pub async fn socks5_request<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
) -> std::io::Result<Option<SocketAddr>> {
    crate::socks5::read_request(s).await
}

/// The `for=` element of an inbound CONNECT's `forwarded` header, as inbound HBONE parses it.
pub fn forwarded_for(h: &HeaderMap) -> Option<SocketAddr> {
    crate::inbound::forwarded_for(h)
}

/// The `host=` element of an inbound CONNECT's `forwarded` header, as inbound HBONE parses it.
pub fn forwarded_host(h: &HeaderMap) -> Option<&str> {
    crate::inbound::forwarded_host(h)
}
