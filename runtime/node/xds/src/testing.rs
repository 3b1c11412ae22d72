//! A scripted Delta ADS server for tests (feature `testing`; never linked by the node): real gRPC over real TLS (a
//! development root issues the server's certificate), where the test reads each stream's requests and writes its
//! responses, and can stop and restart the server on the same port. A test that wants a real control plane uses
//! `weft control`; this one is for what a real control plane never sends (malformed resources, odd errors).

#![allow(clippy::unwrap_used, clippy::missing_panics_doc, missing_docs)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures_util::Stream;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tonic::{Request, Response, Status, Streaming};
use weft_proto::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use weft_proto::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, Resource,
};

/// Waits in tests have this floor; they end as soon as the event happens.
pub const WAIT: Duration = Duration::from_secs(30);

/// `fut` within [`WAIT`], or a panic naming `what`.
pub async fn within<T>(what: &str, fut: impl std::future::Future<Output = T>) -> T {
    match tokio::time::timeout(WAIT, fut).await {
        Ok(v) => v,
        Err(_) => panic!("timed out waiting for {what}"),
    }
}

/// A development root and the files a client needs.
pub struct Pki {
    pub dir: tempfile::TempDir,
    pub root: PathBuf,
    pub token: PathBuf,
    ca: weft_identity::LocalCa,
}

impl Default for Pki {
    fn default() -> Self {
        Self::new()
    }
}

impl Pki {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) =
            weft_identity::ca::generate_root("cluster.local", Duration::from_secs(3600)).unwrap();
        let root = dir.path().join("root-cert.pem");
        std::fs::write(&root, &cert).unwrap();
        let token = dir.path().join("token");
        std::fs::write(&token, "token-1\n").unwrap();
        let ca = weft_identity::LocalCa::from_pem(&cert, &key, vec![]).unwrap();
        Self {
            dir,
            root,
            token,
            ca,
        }
    }

    /// A server config for `names` (DNS names or IPs).
    pub fn server_tls(&self, names: &[&str]) -> Arc<rustls::ServerConfig> {
        let names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
        let (chain, key) = self
            .ca
            .issue_server_cert(&names, Duration::from_secs(3600))
            .unwrap();
        let chain = CertificateDer::pem_slice_iter(chain.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        let key = PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap();
        let mut cfg = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::aws_lc_rs::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .unwrap();
        cfg.alpn_protocols = vec![b"h2".to_vec()];
        Arc::new(cfg)
    }
}

/// One stream the server accepted: what the client sends, and a way to answer.
pub struct Conn {
    pub metadata: tonic::metadata::MetadataMap,
    pub requests: mpsc::UnboundedReceiver<Result<DeltaDiscoveryRequest, Status>>,
    pub responses: mpsc::UnboundedSender<Result<DeltaDiscoveryResponse, Status>>,
}

impl Conn {
    /// The next request (panics if the stream ends first).
    pub async fn next(&mut self) -> DeltaDiscoveryRequest {
        within("a request", self.requests.recv())
            .await
            .expect("the stream ended")
            .expect("the client sent an error")
    }

    /// The next request of `type_url`, skipping others.
    pub async fn next_of(&mut self, type_url: &str) -> DeltaDiscoveryRequest {
        loop {
            let r = self.next().await;
            if r.type_url == type_url {
                return r;
            }
        }
    }

    pub fn send(&self, r: DeltaDiscoveryResponse) {
        self.responses.send(Ok(r)).unwrap();
    }

    /// End the stream with a status.
    pub fn fail(&self, s: Status) {
        let _ = self.responses.send(Err(s));
    }
}

/// A response of `type_url`.
pub fn response(
    type_url: &str,
    nonce: &str,
    resources: Vec<Resource>,
    removed: &[&str],
) -> DeltaDiscoveryResponse {
    DeltaDiscoveryResponse {
        system_version_info: format!("v-{nonce}"),
        resources,
        type_url: type_url.to_owned(),
        nonce: nonce.to_owned(),
        removed_resources: removed.iter().map(|s| s.to_string()).collect(),
    }
}

/// A resource named `name` at `version` holding `msg` as a `type_url`.
pub fn resource<M: prost::Message>(type_url: &str, name: &str, version: &str, msg: &M) -> Resource {
    Resource {
        name: name.to_owned(),
        version: version.to_owned(),
        resource: Some(weft_proto::to_any(type_url, msg)),
        ..Default::default()
    }
}

type ResponseStream =
    Pin<Box<dyn Stream<Item = Result<DeltaDiscoveryResponse, Status>> + Send + 'static>>;

struct Service {
    conns: mpsc::UnboundedSender<Conn>,
}

#[tonic::async_trait]
impl AggregatedDiscoveryService for Service {
    type DeltaAggregatedResourcesStream = ResponseStream;

    async fn delta_aggregated_resources(
        &self,
        request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<ResponseStream>, Status> {
        let metadata = request.metadata().clone();
        let mut inbound = request.into_inner();
        let (req_tx, req_rx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            loop {
                match inbound.message().await {
                    Ok(Some(m)) => {
                        if req_tx.send(Ok(m)).is_err() {
                            return;
                        }
                    }
                    Ok(None) => return,
                    Err(s) => {
                        let _ = req_tx.send(Err(s));
                        return;
                    }
                }
            }
        });
        let (resp_tx, resp_rx) = mpsc::unbounded_channel();
        let _ = self.conns.send(Conn {
            metadata,
            requests: req_rx,
            responses: resp_tx,
        });
        let out = futures_util::stream::unfold(resp_rx, |mut rx| async move {
            rx.recv().await.map(|m| (m, rx))
        });
        Ok(Response::new(Box::pin(out)))
    }
}

/// The server: listens on one port until stopped; can be started again on the same port.
pub struct Server {
    pub addr: SocketAddr,
    tls: Arc<rustls::ServerConfig>,
    conns_tx: mpsc::UnboundedSender<Conn>,
    pub conns: mpsc::UnboundedReceiver<Conn>,
    tasks: Option<JoinSet<()>>,
}

impl Server {
    /// Serve on a free loopback port.
    pub async fn start(tls: Arc<rustls::ServerConfig>) -> Self {
        Self::start_on(tls, std::net::TcpListener::bind("127.0.0.1:0").unwrap())
    }

    /// Serve on `listener`, bound already (e.g. inside another network namespace: a socket stays in the namespace
    /// it was created in, whichever thread uses it).
    pub fn start_on(tls: Arc<rustls::ServerConfig>, listener: std::net::TcpListener) -> Self {
        listener.set_nonblocking(true).unwrap();
        let listener = TcpListener::from_std(listener).unwrap();
        let addr = listener.local_addr().unwrap();
        let (conns_tx, conns) = mpsc::unbounded_channel();
        let mut s = Self {
            addr,
            tls,
            conns_tx,
            conns,
            tasks: None,
        };
        s.serve(listener);
        s
    }

    /// `https://localhost:<port>`.
    pub fn url(&self) -> String {
        format!("https://localhost:{}", self.addr.port())
    }

    fn serve(&mut self, listener: TcpListener) {
        let acceptor = tokio_rustls::TlsAcceptor::from(self.tls.clone());
        let grpc = AggregatedDiscoveryServiceServer::new(Service {
            conns: self.conns_tx.clone(),
        });
        let mut tasks = JoinSet::new();
        tasks.spawn(async move {
            let mut conns = JoinSet::new();
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    continue;
                };
                let (acceptor, grpc) = (acceptor.clone(), grpc.clone());
                conns.spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let svc = hyper::service::service_fn(
                        move |req: http::Request<hyper::body::Incoming>| {
                            let mut grpc = grpc.clone();
                            async move {
                                use tower::Service as _;
                                grpc.call(req).await
                            }
                        },
                    );
                    let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(tls), svc)
                        .await;
                });
            }
        });
        self.tasks = Some(tasks);
    }

    /// Stop: the listener closes and every connection is cut (as when the control plane's process dies).
    pub async fn stop(&mut self) {
        if let Some(mut t) = self.tasks.take() {
            t.shutdown().await;
        }
    }

    /// Start again on the same port.
    pub async fn restart(&mut self) {
        self.stop().await;
        let listener = TcpListener::bind(self.addr).await.unwrap();
        self.serve(listener);
    }

    /// The next stream the server accepts.
    pub async fn accept(&mut self) -> Conn {
        within("a stream", self.conns.recv()).await.unwrap()
    }
}
