//! Opening a connection to the control plane: TCP (keepalive as ztunnel sets it), TLS 1.3 against the roots in the
//! configured file (re-read for every connection, so a rotated root is picked up), HTTP/2 with pings, and the
//! request headers (`authorization: Bearer <token>` from the token file, re-read for every stream, and
//! `clusterid`).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use rustls_pki_types::{CertificateDer, ServerName, pem::PemObject};
use tokio::net::TcpStream;
use tonic::metadata::{AsciiMetadataValue, MetadataMap};
use tonic::transport::{Channel, Endpoint, Uri};

use crate::config::SourceConfig;
use crate::error::Error;

/// HTTP/2 ping interval and timeout (ztunnel's).
const H2_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
const H2_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);
/// TCP keepalive (ztunnel's, after istio's Envoy bootstrap).
const TCP_KEEPALIVE_IDLE: Duration = Duration::from_secs(300);
const TCP_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(75);
const TCP_KEEPALIVE_RETRIES: u32 = 9;

/// Connect to the source's server and return a channel for one stream.
pub(crate) async fn channel(cfg: &SourceConfig) -> Result<Channel, Error> {
    let uri = cfg.uri()?;
    let address = cfg.address.clone();
    let connect_err = |message: String| Error::Connect {
        address: address.clone(),
        message,
    };
    let endpoint = Endpoint::from(uri.clone())
        .connect_timeout(cfg.connect_timeout)
        .http2_keep_alive_interval(H2_KEEPALIVE_INTERVAL)
        .keep_alive_timeout(H2_KEEPALIVE_TIMEOUT)
        .tcp_nodelay(true);
    if uri.scheme_str() != Some("https") {
        return endpoint
            .connect()
            .await
            .map_err(|e| connect_err(source_chain(&e)));
    }
    let host = uri
        .host()
        .unwrap_or_default()
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    let name = cfg.server_name.clone().unwrap_or(host);
    let server_name = ServerName::try_from(name.clone())
        .map_err(|e| Error::Config(format!("TLS server name {name:?}: {e}")))?;
    let roots = match &cfg.root_cert {
        Some(p) => read_roots(p).await?,
        None => return Err(Error::Config("https needs a root certificate file".into())),
    };
    let tls = Arc::new(client_tls(roots)?);
    let timeout = cfg.connect_timeout;
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
                tune(&tcp)?;
                tokio_rustls::TlsConnector::from(tls)
                    .connect(server_name, tcp)
                    .await
            };
            match tokio::time::timeout(timeout, connect).await {
                Ok(Ok(s)) => Ok(TokioIo::new(s)),
                Ok(Err(e)) => Err(e),
                Err(_) => Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "TCP connect and TLS handshake timed out",
                )),
            }
        }
    });
    endpoint
        .connect_with_connector(connector)
        .await
        .map_err(|e| connect_err(source_chain(&e)))
}

fn tune(tcp: &TcpStream) -> std::io::Result<()> {
    tcp.set_nodelay(true)?;
    let keepalive = socket2::TcpKeepalive::new()
        .with_time(TCP_KEEPALIVE_IDLE)
        .with_interval(TCP_KEEPALIVE_INTERVAL)
        .with_retries(TCP_KEEPALIVE_RETRIES);
    socket2::SockRef::from(tcp).set_tcp_keepalive(&keepalive)
}

async fn read_roots(path: &Path) -> Result<Vec<CertificateDer<'static>>, Error> {
    let bytes = tokio::fs::read(path).await.map_err(|e| {
        Error::Credentials(format!("reading xDS root file {}: {e}", path.display()))
    })?;
    let roots = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| Error::Credentials(format!("xDS root file {}: {e}", path.display())))?;
    if roots.is_empty() {
        return Err(Error::Credentials(format!(
            "xDS root file {} holds no certificate",
            path.display()
        )));
    }
    Ok(roots)
}

/// TLS 1.3 only (ztunnel's default for control-plane connections), aws-lc-rs, ALPN `h2`.
fn client_tls(roots: Vec<CertificateDer<'static>>) -> Result<rustls::ClientConfig, Error> {
    let mut store = rustls::RootCertStore::empty();
    for r in roots {
        store
            .add(r)
            .map_err(|e| Error::Credentials(format!("xDS root certificate: {e}")))?;
    }
    let mut cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_protocol_versions(&[&rustls::version::TLS13])
    .map_err(|e| Error::Config(e.to_string()))?
    .with_root_certificates(store)
    .with_no_client_auth();
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    Ok(cfg)
}

/// The stream's request headers: with a token file, `authorization: Bearer <token>` (read now) and `clusterid`.
pub(crate) async fn insert_headers(cfg: &SourceConfig, md: &mut MetadataMap) -> Result<(), Error> {
    let Some(path) = &cfg.token_file else {
        return Ok(());
    };
    let token = tokio::fs::read_to_string(path).await.map_err(|e| {
        Error::Credentials(format!("reading xDS token file {}: {e}", path.display()))
    })?;
    let token = token.trim();
    if token.is_empty() {
        return Err(Error::Credentials(format!(
            "xDS token file {} is empty",
            path.display()
        )));
    }
    let bearer: AsciiMetadataValue = format!("Bearer {token}")
        .parse()
        .map_err(|_| Error::Credentials("the xDS token is not a valid header value".into()))?;
    let cluster: AsciiMetadataValue = cfg
        .cluster_id
        .parse()
        .map_err(|_| Error::Config("the cluster id is not a valid header value".into()))?;
    md.insert("authorization", bearer);
    md.insert("clusterid", cluster);
    Ok(())
}

fn source_chain(e: &dyn std::error::Error) -> String {
    let mut message = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        message.push_str(": ");
        message.push_str(&s.to_string());
        src = s.source();
    }
    message
}
