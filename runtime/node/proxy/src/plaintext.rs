//! Inbound plaintext: a non-mesh client's connection to a local workload, captured to 15006. There is no peer
//! identity; policy decides on addresses alone.

use std::future::Future;
use std::sync::Arc;

use tokio::net::TcpStream;
use weft_hooks::{ConnectionRecord, Direction};

use crate::conn::{Halves, Via};
use crate::{Inner, socket};

impl Inner {
    /// One captured plaintext inbound connection.
    #[allow(clippy::manual_async_fn)] // an `async fn` would hold its arguments twice, for the connection's life
    pub(crate) fn handle_plaintext(
        self: Arc<Self>,
        client: TcpStream,
        src: std::net::SocketAddr,
    ) -> impl Future<Output = ()> + Send {
        async move {
            let tproxy = self.tproxy_port(self.cfg.inbound_plaintext_addr);
            let dst = match socket::captured_destination(&client, tproxy) {
                Ok(Some(d)) => d,
                Ok(None) | Err(_) => {
                    self.metrics.fail("inbound", "no_original_dst");
                    tracing::warn!(%src, "plaintext inbound connection without an original destination; closing");
                    return;
                }
            };
            let state = self.state.current();
            let Some(dst_wl) = state
                .workload_by_ip(dst.ip())
                .filter(|w| self.is_local(w))
                .cloned()
            else {
                self.metrics.fail("inbound", "unknown_destination");
                tracing::warn!(%src, %dst, "plaintext inbound to an address that is no local workload; closing");
                return;
            };
            let record = Arc::new(ConnectionRecord {
                id: self.tracker.next_id(),
                direction: Direction::Inbound,
                src,
                dst,
                peer_identity: None,
                src_workload: state.workload_by_ip(src.ip()).map(|w| w.meta.clone()),
                dst_workload: Some(dst_wl.meta.clone()),
                dst_service: None,
                hbone: false,
            });
            // The connection must not pin the state snapshot it was routed with.
            drop((dst_wl, state));
            let Ok(epoch) = self.authorize_inbound(&record, Via::NONE) else {
                return;
            };
            // Boxed: the dial's state is on the heap only while it runs.
            let Ok(upstream) = Box::pin(self.connect_workload(
                &record,
                Via::NONE,
                record.dst,
                self.inbound_source(record.src, record.dst),
            ))
            .await
            else {
                return;
            };
            let (cr, cw) = client.into_split();
            let (ur, uw) = upstream.into_split();
            self.run(
                record,
                epoch,
                "plaintext",
                Via::NONE,
                Halves(cr, cw),
                Halves(ur, uw),
            )
            .await;
        }
    }
}
