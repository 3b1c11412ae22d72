//! What weft's gRPC servers (`weft-control`, the reference CA `weft-ca`) share: bearer-token authentication of
//! callers ([`token`]), the TLS serving config ([`tls`]), and the accept loop that runs a tonic service over TLS and
//! HTTP/2 ([`serve`]), one task and one tracing span per connection.

#[cfg(feature = "testing")]
pub mod testing;
pub mod tls;
pub mod token;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tonic::codegen::Service;
use tracing::Instrument as _;

pub use tls::{TlsError, server_tls_from_ca, server_tls_from_pem};
pub use token::{
    AuthError, AuthFlagsError, Authenticator, Caller, StaticFile, StaticToken, StaticTokens,
    bearer_token, request_bearer,
};

/// The TCP peer of a gRPC call, put in each request's extensions by [`serve`] (`req.extensions().get::<PeerAddr>()`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerAddr(pub SocketAddr);

/// How long a client has to finish its TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Serve the gRPC `service` (a tonic-generated server) on `listener` over TLS with HTTP/2 until `shutdown`
/// resolves; open connections are then closed. Each connection's TLS handshake runs in its own task with a
/// deadline ([`HANDSHAKE_TIMEOUT`]), so a stalled client delays nobody.
pub async fn serve<S>(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    service: S,
    shutdown: impl std::future::Future<Output = ()> + Send,
) where
    S: Service<
            http::Request<hyper::body::Incoming>,
            Response = http::Response<tonic::body::Body>,
            Error = Infallible,
        > + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let mut conns = tokio::task::JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        let (tcp, peer) = tokio::select! {
            () = &mut shutdown => break,
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %e, "accept");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        while conns.try_join_next().is_some() {}
        let (acceptor, grpc) = (acceptor.clone(), service.clone());
        let span = tracing::info_span!("grpc_conn", %peer);
        conns.spawn(
            async move {
                let _ = tcp.set_nodelay(true);
                let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await
                {
                    Ok(Ok(s)) => s,
                    Ok(Err(e)) => return tracing::info!(error = %e, "TLS handshake failed"),
                    Err(_) => return tracing::info!("TLS handshake timed out"),
                };
                let svc = hyper::service::service_fn(
                    move |mut req: http::Request<hyper::body::Incoming>| {
                        req.extensions_mut().insert(PeerAddr(peer));
                        let mut grpc = grpc.clone();
                        async move { grpc.call(req).await }
                    },
                );
                if let Err(e) = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tls), svc)
                    .await
                {
                    tracing::debug!(error = %e, "gRPC connection ended");
                }
            }
            .instrument(span),
        );
    }
    conns.shutdown().await;
}
