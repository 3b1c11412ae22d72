//! HTTP/2 PING keepalive shared by the client and server connection drivers.

use std::time::Duration;

use crate::Error;

/// Pings the peer every `interval` and returns the reason once a ping fails or is not
/// acknowledged within `timeout`. Never returns when `interval` is `None`.
pub(crate) async fn run(
    ping: Option<h2::PingPong>,
    interval: Option<Duration>,
    timeout: Duration,
) -> Error {
    let (Some(mut ping), Some(interval)) = (ping, interval) else {
        return std::future::pending().await;
    };
    loop {
        tokio::time::sleep(interval).await;
        match tokio::time::timeout(timeout, ping.ping(h2::Ping::opaque())).await {
            Ok(Ok(_pong)) => tracing::trace!("hbone keepalive pong"),
            Ok(Err(e)) => return Error::H2(e),
            Err(_elapsed) => return Error::KeepaliveTimeout,
        }
    }
}
