//! The ZDS client: connect to the CNI node agent's socket (with backoff), say hello, then answer every request
//! with one ack, in order, as ztunnel does. A packet that cannot be read or decoded and a request that breaks the
//! protocol get an error ack and end the connection (weft reconnects and the agent sends a new snapshot); a pod
//! whose listeners cannot be opened gets an error ack, the connection stays and the pod is retried every 5 s.
//! While disconnected, the pods already served keep serving.

use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::manager::{Failure, ListenerSets, Manager};
use crate::packet::SeqPacket;
use crate::protocol;
use crate::status::Status;

/// How often pods whose listeners failed to open are retried (ztunnel's value).
pub const RETRY_PENDING: Duration = Duration::from_secs(5);
/// First reconnect delay; it doubles up to [`MAX_BACKOFF`].
pub const MIN_BACKOFF: Duration = Duration::from_millis(10);
/// Longest reconnect delay (ztunnel's value).
pub const MAX_BACKOFF: Duration = Duration::from_secs(15);

/// How a connection to the agent ended.
#[derive(Debug)]
enum End {
    /// weft is stopping.
    Stopped,
    /// The agent closed it.
    Eof,
    /// Sending the hello failed.
    Announce(std::io::Error),
    /// An error (already answered with an error ack where there was a request).
    Error(String),
}

/// Run the client until `stop`, then drain every pod.
pub async fn run<L: ListenerSets>(
    uds: PathBuf,
    mut mgr: Manager<L>,
    status: Arc<Status>,
    stop: CancellationToken,
) {
    let mut backoff = MIN_BACKOFF;
    loop {
        let conn = tokio::select! {
            biased;
            () = stop.cancelled() => break,
            c = SeqPacket::connect(&uds) => c,
        };
        let conn = match conn {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(uds = %uds.display(), error = %e, retry_in = ?backoff, "cannot connect to the CNI node agent; is it running?");
                if wait(&stop, &mut backoff).await {
                    break;
                }
                continue;
            }
        };
        tracing::info!(uds = %uds.display(), "connected to the CNI node agent");
        status.set_connected(true);
        mgr.reset_snapshot();
        let end = serve(&conn, &mut mgr, &status, &stop).await;
        status.set_connected(false);
        match end {
            End::Stopped => break,
            End::Eof => {
                tracing::info!("the CNI node agent closed the connection; reconnecting");
                backoff = MIN_BACKOFF;
            }
            End::Announce(e) => {
                tracing::error!(error = %e, retry_in = ?backoff, "cannot send the hello to the CNI node agent");
                if wait(&stop, &mut backoff).await {
                    break;
                }
            }
            End::Error(e) => {
                tracing::warn!(error = %e, "connection to the CNI node agent ended; reconnecting");
                backoff = MIN_BACKOFF;
                if wait(&stop, &mut backoff).await {
                    break;
                }
            }
        }
    }
    tracing::info!("in-pod: draining every pod");
    mgr.drain_all().await;
}

/// Sleep for the backoff (doubling it); true if `stop` fired meanwhile.
async fn wait(stop: &CancellationToken, backoff: &mut Duration) -> bool {
    let d = *backoff;
    *backoff = (*backoff * 2).min(MAX_BACKOFF);
    tokio::select! {
        () = stop.cancelled() => true,
        () = tokio::time::sleep(d) => false,
    }
}

async fn serve<L: ListenerSets>(
    conn: &SeqPacket,
    mgr: &mut Manager<L>,
    status: &Status,
    stop: &CancellationToken,
) -> End {
    if let Err(e) = conn.send(&protocol::hello(), &[]).await {
        return End::Announce(e);
    }
    let mut retry: Option<Pin<Box<tokio::time::Sleep>>> = None;
    loop {
        let received = tokio::select! {
            biased;
            () = stop.cancelled() => return End::Stopped,
            () = async { if let Some(t) = retry.as_mut() { t.await } }, if retry.is_some() => {
                retry = None;
                mgr.retry_pending().await;
                if mgr.has_pending() {
                    retry = Some(Box::pin(tokio::time::sleep(RETRY_PENDING)));
                }
                continue;
            }
            r = conn.recv() => r,
        };
        let packet = match received {
            Ok(Some(p)) => p,
            Ok(None) => return End::Eof,
            Err(e) => return End::Error(format!("reading from the agent: {e}")),
        };
        let req = match protocol::decode(packet) {
            Ok(r) => r,
            Err(e) => {
                status.request("invalid", false);
                tracing::error!(error = %e, "invalid message from the CNI node agent");
                let text = format!("failure to read message: {e}");
                if let Err(se) = conn.send(&protocol::ack(Some(&text)), &[]).await {
                    return End::Error(format!("sending an error ack: {se}"));
                }
                return End::Error(text);
            }
        };
        let kind = req.kind();
        tracing::debug!(kind, "request from the CNI node agent");
        let (ack, end) = match mgr.handle(req).await {
            Ok(()) => (None, None),
            Err(Failure::Pod(e)) => {
                if retry.is_none() {
                    retry = Some(Box::pin(tokio::time::sleep(RETRY_PENDING)));
                }
                (Some(format!("failure to start proxy: {e}")), None)
            }
            Err(Failure::Protocol(e)) => {
                tracing::error!(error = %e, "protocol error from the CNI node agent");
                let text = format!("failure to process message: {e}");
                (Some(text.clone()), Some(text))
            }
        };
        status.request(kind, ack.is_none());
        if let Err(e) = conn.send(&protocol::ack(ack.as_deref()), &[]).await {
            return End::Error(format!("sending an ack: {e}"));
        }
        if let Some(e) = end {
            return End::Error(e);
        }
    }
}

#[cfg(test)]
mod tests;
