//! A real Delta ADS client for tests and the bench: tonic over rustls (TLS 1.3, the server's certificate verified
//! against the dev root), a bearer token, and explicit requests (subscribe, ACK, NACK) so a test controls every
//! message. The node's own client (weft-xds) is tested against weft control in conformance/.

#![allow(dead_code)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use rustls_pki_types::ServerName;
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Channel, Endpoint, Uri};
use tonic::{Status, Streaming};
use weft_proto::envoy::config::core::v3::Node;
use weft_proto::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use weft_proto::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DeltaDiscoveryResponse};

/// Event waits: generous, they only matter on a loaded machine.
pub const WAIT: Duration = Duration::from_secs(30);

/// A TLS channel to `addr` trusting `root_pem`, verifying the server name `localhost`.
pub fn channel(addr: SocketAddr, root_pem: &str) -> Channel {
    let roots = weft_identity::chain::parse_pems(&[root_pem.to_owned()]).expect("root pem");
    let mut store = rustls::RootCertStore::empty();
    for r in roots {
        store.add(r).expect("root");
    }
    let mut cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("tls versions")
    .with_root_certificates(store)
    .with_no_client_auth();
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    let tls = Arc::new(cfg);
    let connector = tower::service_fn(move |_: Uri| {
        let tls = tls.clone();
        async move {
            let tcp = TcpStream::connect(addr).await?;
            tcp.set_nodelay(true)?;
            let name = ServerName::try_from("localhost").expect("name");
            let s = tokio_rustls::TlsConnector::from(tls)
                .connect(name, tcp)
                .await?;
            Ok::<_, std::io::Error>(TokioIo::new(s))
        }
    });
    Endpoint::from_static("https://localhost").connect_with_connector_lazy(connector)
}

/// The node part of a first request, as weft-xds sends it (ztunnel's id shape and NODE_NAME).
pub fn node(name: &str) -> Node {
    Node {
        id: format!("ztunnel~127.0.0.1~{name}.weft-system~weft-system.svc.cluster.local"),
        cluster: "Kubernetes".into(),
        metadata: Some(weft_proto::string_struct("NODE_NAME", name)),
        ..Default::default()
    }
}

/// One node's stream.
pub struct AdsClient {
    pub node: Node,
    tx: mpsc::Sender<DeltaDiscoveryRequest>,
    rx: Streaming<DeltaDiscoveryResponse>,
    first: bool,
}

impl AdsClient {
    /// Open a stream (the call returns once the server accepted it, or with its refusal).
    pub async fn open(
        channel: Channel,
        token: Option<&str>,
        node: Node,
    ) -> Result<AdsClient, Status> {
        let (tx, rx) = mpsc::channel(16);
        let mut req = tonic::Request::new(ReceiverStream::new(rx));
        if let Some(t) = token {
            req.metadata_mut().insert(
                "authorization",
                format!("Bearer {t}").parse().expect("header"),
            );
        }
        let mut client =
            AggregatedDiscoveryServiceClient::new(channel).max_decoding_message_size(64 << 20);
        // The server reads the first request before it answers anything, and tonic waits for the response
        // headers: send the request in parallel with the call.
        let call = client.delta_aggregated_resources(req);
        let rx = call.await?.into_inner();
        Ok(AdsClient {
            node,
            tx,
            rx,
            first: true,
        })
    }

    /// Send a raw request (the node is added to the first one).
    pub async fn send(&mut self, mut req: DeltaDiscoveryRequest) {
        if self.first {
            req.node = Some(self.node.clone());
            self.first = false;
        }
        self.tx.send(req).await.expect("stream open");
    }

    /// Subscribe (wildcard) to `type_url`, saying what it already has.
    pub async fn subscribe(&mut self, type_url: &str, initial: HashMap<String, String>) {
        self.send(DeltaDiscoveryRequest {
            type_url: type_url.into(),
            initial_resource_versions: initial,
            ..Default::default()
        })
        .await;
    }

    /// The next response (panics after [`WAIT`]).
    pub async fn recv(&mut self) -> DeltaDiscoveryResponse {
        self.try_recv().await.expect("a response")
    }

    /// The next response or the stream's error.
    pub async fn try_recv(&mut self) -> Result<DeltaDiscoveryResponse, Status> {
        match tokio::time::timeout(WAIT, self.rx.message()).await {
            Ok(Ok(Some(r))) => Ok(r),
            Ok(Ok(None)) => Err(Status::unavailable("stream ended")),
            Ok(Err(s)) => Err(s),
            Err(_) => panic!("no response within {WAIT:?}"),
        }
    }

    /// The next response, however long it takes (the bench's idle nodes); `None` when the stream ended.
    pub async fn next(&mut self) -> Option<DeltaDiscoveryResponse> {
        self.rx.message().await.ok().flatten()
    }

    /// ACK a response.
    pub async fn ack(&mut self, r: &DeltaDiscoveryResponse) {
        self.send(DeltaDiscoveryRequest {
            type_url: r.type_url.clone(),
            response_nonce: r.nonce.clone(),
            ..Default::default()
        })
        .await;
    }

    /// NACK a response.
    pub async fn nack(
        &mut self,
        r: &DeltaDiscoveryResponse,
        message: &str,
        details: Vec<prost_types::Any>,
    ) {
        self.send(DeltaDiscoveryRequest {
            type_url: r.type_url.clone(),
            response_nonce: r.nonce.clone(),
            error_detail: Some(weft_proto::google::rpc::Status {
                code: 3,
                message: message.into(),
                details,
            }),
            ..Default::default()
        })
        .await;
    }
}

/// `name → version` of a response's resources.
pub fn versions(r: &DeltaDiscoveryResponse) -> HashMap<String, String> {
    r.resources
        .iter()
        .map(|x| (x.name.clone(), x.version.clone()))
        .collect()
}

/// A response's resource names, sorted.
pub fn names(r: &DeltaDiscoveryResponse) -> Vec<String> {
    let mut v: Vec<String> = r.resources.iter().map(|x| x.name.clone()).collect();
    v.sort();
    v
}
