//! Double HBONE through a network gateway, as ztunnel does it: the outer tunnel (pooled) is terminated by the
//! gateway of the destination's network; inside it, a second mutual-TLS HBONE connection, not pooled (each one may
//! land on another remote endpoint), to the remote node, whose identity must be the service's (its SANs, or the
//! endpoint's identity when the service lists none). Both CONNECTs name the service as `hostname:port`; the inner
//! one carries `x-forwarded-network` with the client's network.

use bytes::Bytes;
use std::net::SocketAddr;
use std::sync::Arc;

use http::{HeaderMap, HeaderValue};
use weft_hbone::{ConnectRequest, H2Config, H2Stream};
use weft_identity::{SpiffeId, WorkloadCert};
use weft_state::{Service, WaypointHop, Workload};

use super::DialError;

/// The header that tells the remote node which network a tunnel comes from (ztunnel's `x-forwarded-network`).
pub(crate) const FORWARDED_NETWORK: &str = "x-forwarded-network";

/// Who may terminate the inner tunnel: the remote waypoint's service SANs when the service's waypoint is behind the
/// gateway, else the service's SANs (as ztunnel); when those are empty, the waypoint instance's or the endpoint's
/// own identity.
pub(crate) fn inner_identities(
    svc: &Service,
    waypoint: Option<&WaypointHop>,
    endpoint: Option<&Workload>,
) -> Vec<SpiffeId> {
    let (sans, fallback) = match waypoint {
        Some(wp) => (
            wp.service
                .as_ref()
                .map(|s| s.subject_alt_names.clone())
                .unwrap_or_default(),
            Some(wp.workload.spiffe_id()),
        ),
        None => (
            svc.subject_alt_names.clone(),
            endpoint.map(|w| w.spiffe_id()),
        ),
    };
    let ids: Vec<SpiffeId> = sans.iter().filter_map(|s| s.parse().ok()).collect();
    if ids.is_empty() {
        return fallback.and_then(|f| f.parse().ok()).into_iter().collect();
    }
    ids
}

/// The inner tunnel of one connection through a network gateway.
pub(crate) struct InnerTunnel {
    /// `hostname:port` of the service.
    pub authority: String,
    expected: Vec<SpiffeId>,
    network: String,
    cert: Arc<WorkloadCert>,
}

impl InnerTunnel {
    /// The inner tunnel to `svc` port `port`, terminated by one of `expected`, from a client on `network`
    /// presenting `cert`.
    pub(crate) fn new(
        svc: &Service,
        expected: Vec<SpiffeId>,
        network: &str,
        port: u16,
        cert: Arc<WorkloadCert>,
    ) -> Self {
        Self {
            authority: format!("{}:{port}", svc.hostname),
            expected,
            network: network.to_owned(),
            cert,
        }
    }

    /// TLS, HTTP/2 and CONNECT inside `outer` (the gateway's tunnel, opened to `gateway`); failures are typed as
    /// the pool's connect failures are, so they classify the same way.
    pub(crate) async fn open(
        self,
        outer: H2Stream,
        mut headers: HeaderMap,
        gateway: SocketAddr,
        h2: &H2Config,
        layer: weft_tls::RecordLayer,
    ) -> Result<H2Stream, weft_hbone::Error> {
        let failed = |e: DialError| weft_hbone::Error::ConnectFailed(Arc::new(e));
        let addr = gateway;
        let cfg = self
            .cert
            .client_config(self.expected)
            .map_err(|source| failed(DialError::TlsConfig { addr, source }))?;
        let name = rustls::pki_types::ServerName::IpAddress(addr.ip().into());
        let tls = weft_tls::connect_on(layer, cfg, name, outer)
            .await
            .map_err(|source| failed(DialError::Tls { addr, source }))?;
        let client = weft_hbone::handshake(tls, h2)
            .await
            .map_err(|source| failed(DialError::H2 { addr, source }))?;
        if let Ok(v) = HeaderValue::from_str(&self.network) {
            headers.insert(FORWARDED_NETWORK, v);
        }
        let (stream, _) = client
            .connect(ConnectRequest {
                authority: self.authority,
                headers,
                early_data: Bytes::new(),
            })
            .await?;
        Ok(stream)
    }
}
