//! The Istio CA client: `istio.v1.auth.IstioCertificateService/CreateCertificate` over gRPC and TLS, as ztunnel
//! speaks it. The node authenticates with its service-account token (`authorization: Bearer`, the token file read
//! anew on every call, since the kubelet rotates it) and names the workload identity it wants in the request
//! metadata (`ImpersonatedIdentity`). The TLS channel trusts the roots in a file, and is rebuilt when that file
//! changes. An answer is accepted only if its leaf proves exactly the identity asked for and its chain verifies to
//! the trust roots; the root it ends with joins the trust bundle.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::BoxFuture;
use hyper_util::rt::TokioIo;
use rustls_pki_types::ServerName;
use tokio::net::TcpStream;
use tonic::transport::{Channel, Endpoint, Uri};
use weft_proto::istio_ca::IstioCertificateRequest;
use weft_proto::istio_ca::istio_certificate_service_client::IstioCertificateServiceClient;

use crate::Error;
use crate::ca::{CaClient, CertRequest, IssuedChain};
use crate::cert::to_pem;
use crate::chain::{parse_pems, validate_issued};

/// How to reach and authenticate to an Istio-protocol CA.
#[derive(Debug, Clone)]
pub struct IstioCaConfig {
    /// `https://host:port` (istiod: port 15012). `http://` is accepted for tests only: the token would travel in
    /// clear.
    pub address: String,
    /// PEM roots trusted for the CA's TLS certificate, and the initial trust bundle. Re-read on every call; the
    /// channel is rebuilt when its content changes.
    pub root_cert: Option<PathBuf>,
    /// Service-account token file (audience `istio-ca`), sent as `authorization: Bearer <token>`; re-read on every
    /// call.
    pub token_file: Option<PathBuf>,
    /// Sent as the `clusterid` header.
    pub cluster_id: String,
    /// TLS server name to verify, when it differs from the address's host (e.g. `istiod.istio-system.svc`).
    pub server_name: Option<String>,
    /// Deadline of one call, connection included.
    pub timeout: Duration,
}

impl IstioCaConfig {
    /// A config for `address` with defaults: cluster `Kubernetes`, 10 s deadline, no token, no roots.
    pub fn new(address: impl Into<String>) -> Self {
        Self {
            address: address.into(),
            root_cert: None,
            token_file: None,
            cluster_id: "Kubernetes".into(),
            server_name: None,
            timeout: Duration::from_secs(10),
        }
    }
}

struct ChannelState {
    root_bytes: Vec<u8>,
    roots_pem: Vec<String>,
    client: IstioCertificateServiceClient<Channel>,
}

/// The Istio CA client.
pub struct IstioCaClient {
    cfg: IstioCaConfig,
    channel: Mutex<Option<ChannelState>>,
    /// Roots learned from answers (the chain's last element).
    learned: Mutex<Vec<String>>,
}

impl std::fmt::Debug for IstioCaClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IstioCaClient")
            .field("address", &self.cfg.address)
            .field("cluster_id", &self.cfg.cluster_id)
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl IstioCaClient {
    /// A client; checks the address and the root file now, so a bad flag fails at startup. Connects on first use.
    pub fn new(cfg: IstioCaConfig) -> Result<Self, Error> {
        let uri: Uri = cfg
            .address
            .parse()
            .map_err(|e| Error::Ca(format!("CA address {:?}: {e}", cfg.address)))?;
        match uri.scheme_str() {
            Some("https") => {
                if cfg.root_cert.is_none() {
                    return Err(Error::Ca(
                        "an https CA address needs a root certificate file to trust".into(),
                    ));
                }
            }
            Some("http") => {
                tracing::warn!(address = %cfg.address, "CA address is plaintext http: the token travels in clear (tests only)");
            }
            _ => {
                return Err(Error::Ca(format!(
                    "CA address {:?}: expected https://host:port",
                    cfg.address
                )));
            }
        }
        let me = Self {
            cfg,
            channel: Mutex::new(None),
            learned: Mutex::new(Vec::new()),
        };
        // Fail now on an unreadable or empty root file; the channel itself is built on the first call (it needs a
        // runtime).
        let bytes = me.read_roots()?;
        if !bytes.is_empty()
            && parse_pems(&[String::from_utf8_lossy(&bytes).into_owned()])?.is_empty()
        {
            return Err(Error::Ca("CA root file holds no certificate".into()));
        }
        Ok(me)
    }

    fn read_roots(&self) -> Result<Vec<u8>, Error> {
        match &self.cfg.root_cert {
            None => Ok(Vec::new()),
            Some(p) => std::fs::read(p)
                .map_err(|e| Error::Ca(format!("reading CA root file {}: {e}", p.display()))),
        }
    }

    /// The gRPC client, rebuilt when the root file's content changed since the last call.
    fn client_now(&self) -> Result<(IstioCertificateServiceClient<Channel>, Vec<String>), Error> {
        let bytes = self.read_roots()?;
        let mut g = lock(&self.channel);
        if let Some(s) = g.as_ref()
            && s.root_bytes == bytes
        {
            return Ok((s.client.clone(), s.roots_pem.clone()));
        }
        let roots_pem: Vec<String> = if bytes.is_empty() {
            Vec::new()
        } else {
            let text = String::from_utf8_lossy(&bytes).into_owned();
            let ders = parse_pems(&[text])?;
            if ders.is_empty() {
                return Err(Error::Ca("CA root file holds no certificate".into()));
            }
            ders.iter().map(to_pem).collect()
        };
        let channel = self.build_channel(&roots_pem)?;
        if g.is_some() {
            tracing::info!(address = %self.cfg.address, "CA root file changed: TLS channel rebuilt");
        }
        let client = IstioCertificateServiceClient::new(channel);
        *g = Some(ChannelState {
            root_bytes: bytes,
            roots_pem: roots_pem.clone(),
            client: client.clone(),
        });
        Ok((client, roots_pem))
    }

    fn build_channel(&self, roots_pem: &[String]) -> Result<Channel, Error> {
        let endpoint = Endpoint::from_shared(self.cfg.address.clone())
            .map_err(|e| Error::Ca(format!("CA address {:?}: {e}", self.cfg.address)))?
            .connect_timeout(self.cfg.timeout)
            .timeout(self.cfg.timeout)
            .tcp_nodelay(true);
        let uri = endpoint.uri().clone();
        if uri.scheme_str() != Some("https") {
            return Ok(endpoint.connect_lazy());
        }
        let host = uri
            .host()
            .ok_or_else(|| Error::Ca(format!("CA address {:?} has no host", self.cfg.address)))?
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let name = self.cfg.server_name.clone().unwrap_or_else(|| host.clone());
        let server_name = ServerName::try_from(name.clone())
            .map_err(|e| Error::Ca(format!("TLS server name {name:?}: {e}")))?;
        let tls = Arc::new(control_plane_tls(roots_pem)?);
        let connect_timeout = self.cfg.timeout;
        let connector = tower::service_fn(move |dst: Uri| {
            let (tls, server_name) = (tls.clone(), server_name.clone());
            async move {
                let host = dst
                    .host()
                    .unwrap_or_default()
                    .trim_start_matches('[')
                    .trim_end_matches(']')
                    .to_owned();
                let port = dst.port_u16().unwrap_or(443);
                let connect = async {
                    let tcp = TcpStream::connect((host.as_str(), port)).await?;
                    tcp.set_nodelay(true)?;
                    tokio_rustls::TlsConnector::from(tls)
                        .connect(server_name, tcp)
                        .await
                };
                match tokio::time::timeout(connect_timeout, connect).await {
                    Ok(Ok(s)) => Ok(TokioIo::new(s)),
                    Ok(Err(e)) => Err(e),
                    Err(_) => Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "connecting to the CA timed out",
                    )),
                }
            }
        });
        Ok(endpoint.connect_with_connector_lazy(connector))
    }

    async fn create(&self, req: &CertRequest) -> Result<IssuedChain, Error> {
        let (mut client, file_roots) = self.client_now()?;
        let body = IstioCertificateRequest {
            csr: req.csr_pem.clone(),
            validity_duration: i64::try_from(req.validity.as_secs()).unwrap_or(i64::MAX),
            metadata: Some(weft_proto::string_struct(
                weft_proto::IMPERSONATED_IDENTITY,
                &req.identity.to_string(),
            )),
        };
        let mut request = tonic::Request::new(body);
        let md = request.metadata_mut();
        if let Some(p) = &self.cfg.token_file {
            let token = tokio::fs::read_to_string(p)
                .await
                .map_err(|e| Error::Ca(format!("reading token file {}: {e}", p.display())))?;
            let value = format!("Bearer {}", token.trim())
                .parse()
                .map_err(|_| Error::Ca("the token is not a valid header value".into()))?;
            md.insert("authorization", value);
        }
        let cluster = self
            .cfg
            .cluster_id
            .parse()
            .map_err(|_| Error::Ca("the cluster id is not a valid header value".into()))?;
        md.insert("clusterid", cluster);
        request.set_timeout(self.cfg.timeout);
        let resp = client
            .create_certificate(request)
            .await
            .map_err(status_error)?
            .into_inner();
        let mut trusted = file_roots;
        trusted.extend(lock(&self.learned).iter().cloned());
        let issued = validate_issued(&req.identity, &resp.cert_chain, &trusted).inspect_err(
            |e| tracing::error!(identity = %req.identity, error = %e, "refusing the CA's certificate"),
        )?;
        let mut learned = lock(&self.learned);
        for r in &issued.roots_pem {
            if !learned.contains(r) && !trusted.contains(r) {
                tracing::info!(identity = %req.identity, "trust bundle: new root from the CA");
                learned.push(r.clone());
            }
        }
        Ok(issued)
    }
}

/// Map a gRPC status to the identity error: an answer that refuses is `CaRefused`, anything else (transport,
/// deadline, server trouble) is `CaUnavailable`.
pub fn status_error(s: tonic::Status) -> Error {
    use tonic::Code;
    let mut message = s.message().to_owned();
    let mut src = std::error::Error::source(&s);
    while let Some(e) = src {
        message.push_str(": ");
        message.push_str(&e.to_string());
        src = e.source();
    }
    match s.code() {
        Code::PermissionDenied
        | Code::Unauthenticated
        | Code::InvalidArgument
        | Code::FailedPrecondition
        | Code::OutOfRange
        | Code::Unimplemented
        | Code::NotFound => Error::CaRefused {
            code: format!("{:?}", s.code()),
            message,
        },
        code => Error::CaUnavailable(format!("{code:?}: {message}")),
    }
}

/// A rustls client config for control-plane connections: TLS 1.2 and 1.3 with aws-lc-rs, ALPN `h2`, the given
/// roots.
pub fn control_plane_tls(roots_pem: &[String]) -> Result<rustls::ClientConfig, Error> {
    let roots = crate::manager::root_store(roots_pem)?;
    let mut cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| Error::Tls(e.to_string()))?
    .with_root_certificates(roots)
    .with_no_client_auth();
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    Ok(cfg)
}

impl CaClient for IstioCaClient {
    fn sign<'a>(&'a self, req: &'a CertRequest) -> BoxFuture<'a, Result<IssuedChain, Error>> {
        Box::pin(self.create(req))
    }

    fn trust_roots(&self) -> Vec<String> {
        let mut roots = lock(&self.channel)
            .as_ref()
            .map(|s| s.roots_pem.clone())
            .unwrap_or_default();
        roots.extend(lock(&self.learned).iter().cloned());
        roots
    }
}
