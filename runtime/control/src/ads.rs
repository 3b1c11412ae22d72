//! The gRPC service `envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources`: authenticate
//! the caller's bearer token, then run the stream (see `stream.rs`) in its own task.

use std::sync::Arc;

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};
use tracing::Instrument as _;
use weft_grpc_server::{AuthError, Authenticator, PeerAddr};
use weft_proto::envoy::service::discovery::v3::aggregated_discovery_service_server::AggregatedDiscoveryService;
use weft_proto::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DeltaDiscoveryResponse};

use crate::metrics::ReasonLabel;
use crate::publish::Publisher;
use crate::registry::Registry;

/// Responses buffered per stream before the stream task waits for the node to read.
const STREAM_BUFFER: usize = 16;

/// The ADS service.
#[derive(Debug)]
pub struct Ads {
    /// What is served.
    pub publisher: Arc<Publisher>,
    /// Who is connected.
    pub registry: Arc<Registry>,
    /// How callers are authenticated.
    pub auth: Authenticator,
}

impl Ads {
    fn refuse(&self, reason: &str, peer: Option<std::net::SocketAddr>, status: Status) -> Status {
        self.registry
            .metrics()
            .refused
            .get_or_create(&ReasonLabel {
                reason: reason.to_owned(),
            })
            .inc();
        tracing::warn!(?peer, reason, message = status.message(), "stream refused");
        status
    }
}

#[tonic::async_trait]
impl AggregatedDiscoveryService for Ads {
    type DeltaAggregatedResourcesStream = ReceiverStream<Result<DeltaDiscoveryResponse, Status>>;

    async fn delta_aggregated_resources(
        &self,
        req: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
        let peer = req.extensions().get::<PeerAddr>().map(|p| p.0);
        let Some(token) = weft_grpc_server::request_bearer(&req) else {
            return Err(self.refuse("no_token", peer, Status::unauthenticated("no bearer token")));
        };
        let caller = match self.auth.authenticate(&token).await {
            Ok(c) => c,
            Err(e @ AuthError::Unavailable(_)) => {
                return Err(self.refuse(
                    "auth_unavailable",
                    peer,
                    Status::unavailable(e.to_string()),
                ));
            }
            Err(e) => {
                return Err(self.refuse(
                    "token_rejected",
                    peer,
                    Status::unauthenticated(e.to_string()),
                ));
            }
        };
        let (tx, rx) = mpsc::channel(STREAM_BUFFER);
        let span = tracing::info_span!("ads", peer = ?peer, caller = %caller.identity);
        tokio::spawn(
            crate::stream::run(
                self.publisher.clone(),
                self.registry.clone(),
                caller,
                peer,
                req.into_inner(),
                tx,
            )
            .instrument(span),
        );
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}
