//! The gRPC service `envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources`: authenticate
//! the caller's bearer token, then run the stream (see `stream.rs`) in its own task.

use std::sync::Arc;

use crate::auth::{AuthError, Authenticator, PeerAddr};
use tokio::sync::mpsc;
use tonic::{Request, Response, Status, Streaming};
use tracing::Instrument as _;
use weft_proto::envoy::service::discovery::v3::aggregated_discovery_service_server::AggregatedDiscoveryService;
use weft_proto::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DeltaDiscoveryResponse};

use crate::ads::metrics::ReasonLabel;
use crate::ads::publish::Publisher;
use crate::ads::registry::Registry;

/// Responses buffered per stream before the stream task waits for the node to read.
const STREAM_BUFFER: usize = 16;

/// What a stream's task hands the gRPC response stream: boxed, so the channel's slots (allocated a block at a time,
/// for every stream) hold a pointer, not a response.
pub type Outgoing = Box<Result<DeltaDiscoveryResponse, Status>>;

/// The gRPC response stream of one node: what its stream task sends.
#[derive(Debug)]
pub struct Responses(mpsc::Receiver<Outgoing>);

impl tokio_stream::Stream for Responses {
    type Item = Result<DeltaDiscoveryResponse, Status>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        self.0.poll_recv(cx).map(|o| o.map(|b| *b))
    }
}

/// The ADS service.
#[derive(Debug)]
pub struct Ads {
    /// What is served.
    pub publisher: Arc<Publisher>,
    /// Who is connected.
    pub registry: Arc<Registry>,
    /// How callers are authenticated.
    pub auth: Authenticator,
    /// The service accounts node agents run as; any other caller is refused (empty: any authenticated caller).
    pub node_accounts: Vec<NodeAccount>,
}

/// A service account a node agent runs as (`namespace/name`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeAccount {
    /// Namespace.
    pub namespace: String,
    /// Service account name.
    pub name: String,
}

impl std::str::FromStr for NodeAccount {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.split_once('/') {
            Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
                Ok(Self {
                    namespace: ns.to_owned(),
                    name: name.to_owned(),
                })
            }
            _ => Err(format!(
                "invalid node account {s:?} (expected \"namespace/service-account\")"
            )),
        }
    }
}

impl std::fmt::Display for NodeAccount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
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
    type DeltaAggregatedResourcesStream = Responses;

    async fn delta_aggregated_resources(
        &self,
        req: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
        let peer = req.extensions().get::<PeerAddr>().map(|p| p.0);
        let Some(token) = crate::auth::request_bearer(&req) else {
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
        let account = NodeAccount {
            namespace: caller.identity.namespace().to_owned(),
            name: caller.identity.service_account().to_owned(),
        };
        if !self.node_accounts.is_empty() && !self.node_accounts.contains(&account) {
            // Audit: an authenticated caller that is no node agent (a workload's token, another component's).
            tracing::warn!(target: "audit", ?peer, account = %account, identity = %caller.identity,
                node = caller.node.as_deref().unwrap_or("-"), decision = "deny",
                "caller is not a node agent account (--node-accounts); stream refused");
            return Err(self.refuse(
                "account_not_allowed",
                peer,
                Status::permission_denied(format!(
                    "service account {account} is not a node agent account of this control plane"
                )),
            ));
        }
        let (tx, rx) = mpsc::channel(STREAM_BUFFER);
        let span = tracing::info_span!("ads", peer = ?peer, caller = %caller.identity);
        tokio::spawn(
            crate::ads::stream::run(
                self.publisher.clone(),
                self.registry.clone(),
                caller,
                peer,
                req.into_inner(),
                tx,
            )
            .instrument(span),
        );
        Ok(Response::new(Responses(rx)))
    }
}
