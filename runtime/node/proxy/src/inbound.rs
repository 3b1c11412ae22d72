//! Inbound HBONE: mutual TLS terminated with the destination workload's certificate (chosen by the local address
//! the peer dialled), the peer's SPIFFE identity taken from its verified chain, then one CONNECT stream per
//! tunnelled connection: authority checked, policy asked, the local workload dialled (on its application tunnel's
//! port, with a PROXY v2 header first when it asks for one), bytes copied.

use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use http::{HeaderMap, Method, StatusCode};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use weft_hbone::InboundRequest;
use weft_hooks::{ConnectionRecord, Direction, Verdict};
use weft_identity::SpiffeId;
use weft_state::{AppTunnelProtocol, TunnelProtocol, Workload};

use crate::conn::{Halves, Via};
use crate::{Inner, socket};

impl Inner {
    /// One TCP connection on an HBONE listener.
    pub(crate) async fn handle_hbone_conn(self: Arc<Self>, tcp: TcpStream, peer: SocketAddr) {
        let local = match tcp.local_addr().map(socket::canonical) {
            Ok(a) => a,
            Err(e) => {
                tracing::debug!(%peer, error = %e, "no local address");
                return;
            }
        };
        // Only the workload is kept: an HBONE connection lives long, and must not pin this state snapshot.
        let wl = self
            .state
            .current()
            .workload_by_ip(local.ip())
            .filter(|w| self.is_local(w) && w.protocol == TunnelProtocol::Hbone)
            .cloned();
        let Some(wl) = wl else {
            self.metrics.fail("inbound", "unknown_local_address");
            tracing::warn!(%peer, %local, "HBONE connection to an address that is no local HBONE workload; closing");
            return;
        };
        let id = match SpiffeId::new(&wl.trust_domain, &wl.namespace, &wl.service_account) {
            Ok(id) => id,
            Err(e) => {
                self.metrics.fail("inbound", "identity");
                tracing::warn!(%peer, %local, error = %e, "local workload has no valid identity");
                return;
            }
        };
        let cert = match tokio::time::timeout(self.cfg.identity_timeout, self.identity.fetch(&id))
            .await
        {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => {
                self.metrics.fail("inbound", "identity");
                tracing::warn!(%peer, identity = %id, error = %e, "no certificate to terminate HBONE with");
                return;
            }
            Err(_) => {
                self.metrics.fail("inbound", "identity");
                tracing::warn!(%peer, identity = %id, "certificate fetch timed out");
                return;
            }
        };
        let server_cfg = match cert.server_config() {
            Ok(c) => c,
            Err(e) => {
                self.metrics.fail("inbound", "tls");
                tracing::warn!(%peer, error = %e, "TLS config");
                return;
            }
        };
        let accept = weft_tls::accept_on(self.cfg.tls_record_layer, server_cfg, tcp);
        let tls = match tokio::time::timeout(self.cfg.connect_timeout, accept).await {
            Ok(Ok(t)) => t,
            Ok(Err(e)) => {
                self.metrics.fail("inbound", "tls");
                tracing::warn!(%peer, %local, error = %e, "HBONE TLS handshake failed");
                return;
            }
            Err(_) => {
                self.metrics.fail("inbound", "tls");
                tracing::warn!(%peer, %local, "HBONE TLS handshake timed out");
                return;
            }
        };
        let peer_id = match tls
            .peer_certificates()
            .and_then(|c| c.first())
            .map(weft_identity::tls::identity_of)
        {
            Some(Ok(id)) => id,
            other => {
                self.metrics.fail("inbound", "tls");
                tracing::warn!(%peer, ?other, "HBONE peer without a usable SPIFFE identity");
                return;
            }
        };
        let span = tracing::info_span!("hbone", %peer, %local, peer_identity = %peer_id);
        let _e = span.enter();
        tracing::debug!("HBONE connection accepted");
        drop(_e);
        let me = self.clone();
        let peer_id: Arc<str> = Arc::from(peer_id.to_string());
        let served =
            weft_hbone::serve_connection(tls, &self.cfg.h2, self.drain.child_token(), move |req| {
                // Each stream is counted from its dispatch (this runs before its task is spawned), so a drain
                // waits for a CONNECT that arrived before the GOAWAY even while it is still being set up.
                let tracked = me.tracker.accepted();
                tracked.serve(me.clone().handle_hbone_stream(
                    req,
                    peer,
                    local,
                    id.clone(),
                    peer_id.clone(),
                ))
            })
            .await;
        if let Err(e) = served {
            tracing::debug!(%peer, error = %e, "HBONE connection ended with an error");
        }
    }

    /// The local workload a CONNECT to `dst` (arriving at `local`, served as `served_id`) is for, and the address
    /// to hand it to. The authority is the local address itself (the usual case); or the local workload is a
    /// waypoint (or has an application tunnel) and the authority names what it is the waypoint of (a service VIP or
    /// a workload: ztunnel's "sandwich"), and the traffic goes to the local workload on the authority's port; or the
    /// authority is another local workload with the identity served.
    fn inbound_target(
        &self,
        state: &weft_state::MeshState,
        dst: SocketAddr,
        local: SocketAddr,
        served_id: &SpiffeId,
    ) -> Option<(Arc<Workload>, SocketAddr)> {
        // Field by field: no string is formatted per stream.
        let served = |w: &Arc<Workload>| {
            self.is_local(w)
                && w.trust_domain == served_id.trust_domain()
                && w.namespace == served_id.namespace()
                && w.service_account == served_id.service_account()
        };
        if dst.ip() != local.ip()
            && let Some(w) = state.workload_by_ip(local.ip()).filter(|w| served(w))
            && (w.application_tunnel.is_some() || state.is_waypoint_for(dst.ip(), w))
        {
            return Some((w.clone(), SocketAddr::new(local.ip(), dst.port())));
        }
        state
            .workload_by_ip(dst.ip())
            .filter(|w| served(w))
            .map(|w| (w.clone(), dst))
    }

    /// One CONNECT stream on an accepted HBONE connection, from its request to the end of its relay.
    fn handle_hbone_stream(
        self: Arc<Self>,
        req: InboundRequest,
        peer: SocketAddr,
        local: SocketAddr,
        served_id: SpiffeId,
        peer_id: Arc<str>,
    ) -> impl Future<Output = ()> + Send {
        // Setting up (routing, policy, dialling the workload) is boxed: its state, the request included, is on the
        // heap only while it runs, so an established connection's task holds the relay's state and nothing of its
        // setup (nor the state snapshot it routed with). The setup is built here, outside the stream's future: an
        // `async fn` (or a block capturing the request) would keep the arguments for the stream's whole life.
        let me = self.clone();
        let setup = Box::pin(async move {
            me.setup_hbone_stream(req, peer, local, served_id, peer_id)
                .await
        });
        async move {
            let Some(InboundSetup {
                record,
                epoch,
                via,
                tunnel,
                upstream,
            }) = setup.await
            else {
                return;
            };
            self.run(record, epoch, "hbone", via, tunnel, upstream)
                .await;
        }
    }

    /// Everything up to the relay of one CONNECT stream; `None` when it was refused or failed (reported here).
    async fn setup_hbone_stream(
        &self,
        req: InboundRequest,
        peer: SocketAddr,
        local: SocketAddr,
        served_id: SpiffeId,
        peer_id: Arc<str>,
    ) -> Option<InboundSetup> {
        let reject = |req: InboundRequest,
                      status: StatusCode,
                      reason: &'static str,
                      why: String|
         -> Option<InboundSetup> {
            self.metrics.fail("inbound", reason);
            tracing::warn!(%peer, authority = req.authority(), %status, "HBONE CONNECT refused: {why}");
            let _ = req.reject(status);
            None
        };
        if req.method() != Method::CONNECT {
            let m = req.method().to_string();
            return reject(
                req,
                StatusCode::BAD_REQUEST,
                "bad_request",
                format!("method {m} is not CONNECT"),
            );
        }
        let state = self.state.current();
        // `ip:port`; or, through a network gateway, `service-hostname:port`, which names the local workload (the one
        // dialled) as an endpoint of that service, on the endpoint's target port.
        let (dst, by_host) = match req.authority_addr() {
            Ok(a) => (a, None),
            Err(e) => match hostname_target(&state, req.authority(), local) {
                Ok((a, key)) => (a, Some(key)),
                Err(HostTargetError::NotAHostname) => {
                    return reject(req, StatusCode::BAD_REQUEST, "bad_request", e.to_string());
                }
                Err(HostTargetError::Unknown(why)) => {
                    return reject(req, StatusCode::SERVICE_UNAVAILABLE, "no_service_port", why);
                }
            },
        };
        let Some((dst_wl, target)) = self.inbound_target(&state, dst, local, &served_id) else {
            return reject(
                req,
                StatusCode::BAD_REQUEST,
                "bad_request",
                format!(
                    "{dst} is not a workload on this node served as {served_id} at {local}, nor something whose \
                     waypoint is {local}"
                ),
            );
        };
        if crate::config::RESERVED_PORTS.contains(&dst.port()) {
            return reject(
                req,
                StatusCode::BAD_REQUEST,
                "self_call",
                format!("port {} is weft's own", dst.port()),
            );
        }
        // The source is the TCP peer of the HBONE connection: the one address the peer cannot choose. The
        // `forwarded: for=` address is the peer's claim and is only logged (see `source_of`).
        let (src, claimed) = source_of(peer, req.headers());
        if let Some(claimed) = claimed.filter(|c| *c != peer) {
            tracing::debug!(%peer, forwarded_for = %claimed, "forwarded for= differs from the TCP peer; the TCP peer is used");
        }
        // From another network (through its gateway) the TCP peer is the gateway: no source workload is known.
        // "Another" than this node's network, as ztunnel decides it (`src/proxy/inbound.rs`, `from_gateway`), or
        // than the destination workload's when the node's is not configured.
        let network = match self.cfg.network.as_str() {
            "" => dst_wl.network.as_str(),
            n => n,
        };
        let other_network = req
            .headers()
            .get(crate::outbound::FORWARDED_NETWORK)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|n| !n.eq_ignore_ascii_case(network));
        let src_wl = state
            .workload_by_ip(src.ip())
            .filter(|w| !other_network && w.has_identity(&peer_id))
            .map(|w| w.meta.clone());
        // An application tunnel may move the port (and, in-pod, the address) the application is dialled on; as in
        // ztunnel, policy and telemetry see the workload's address with the port actually dialled.
        let tunnel = AppTunnel::of(&dst_wl, target, self.cfg.app_tunnel_loopback);
        let record = Arc::new(ConnectionRecord {
            id: self.tracker.next_id(),
            direction: Direction::Inbound,
            src,
            dst: tunnel.policy_dst,
            peer_identity: Some(peer_id.clone()),
            src_workload: src_wl,
            dst_workload: Some(dst_wl.meta.clone()),
            // The service the client targeted, from `forwarded: ...;host=`, if this workload backs it. The peer
            // chooses it (among this workload's services): a telemetry label, not a fact to authorize on.
            dst_service: by_host.or_else(|| {
                forwarded_host(req.headers()).and_then(|host| {
                    dst_wl
                        .services
                        .keys()
                        .find(|k| k.split_once('/').is_some_and(|(_, h)| h == host))
                        .cloned()
                })
            }),
            hbone: true,
        });
        let via = Via {
            hbone_addr: Some(local),
            forwarded_for: claimed,
        };
        let Ok(epoch) = self.authorize_inbound(&record, via) else {
            let _ = req.reject(StatusCode::UNAUTHORIZED);
            return None;
        };
        // A loopback application tunnel is dialled from loopback (the client's address is in the PROXY header);
        // anything else from the client's address when the listeners are transparent, as ztunnel does.
        let source = match tunnel.bind {
            Some(lo) => crate::socket::Source::Local(lo),
            None => self.inbound_source(src, tunnel.connect),
        };
        let Ok(mut upstream) = self
            .connect_workload(&record, via, tunnel.connect, source)
            .await
        else {
            let _ = req.reject(StatusCode::SERVICE_UNAVAILABLE);
            return None;
        };
        // As ztunnel (its default): the 200 carries `baggage` describing the destination workload.
        let mut response = HeaderMap::new();
        if self.cfg.response_baggage {
            let b = crate::headers::baggage(&dst_wl.meta, &self.cfg.cluster_id);
            if let Ok(v) = http::HeaderValue::from_str(&b)
                && !b.is_empty()
            {
                response.insert(http::header::HeaderName::from_static("baggage"), v);
            }
        }
        let stream = match req.accept(response) {
            Ok(s) => s,
            Err(e) => {
                self.failed(&record, via, "h2", Verdict::Allow, e.to_string(), "-");
                return None;
            }
        };
        if tunnel.proxy_protocol {
            // The original client and the CONNECT authority, and the verified peer identity, before any byte.
            let header = crate::proxy_protocol::v2_header(src, dst, Some(&*peer_id));
            if let Err(e) = upstream.write_all(&header).await {
                let error = format!("writing the PROXY header to {}: {e}", tunnel.connect);
                self.failed(
                    &record,
                    via,
                    "proxy_protocol",
                    Verdict::Allow,
                    error,
                    "CONNECT",
                );
                return None;
            }
        }
        let (tr, tw) = stream.into_split();
        let (ur, uw) = upstream.into_split();
        Some(InboundSetup {
            record,
            epoch,
            via,
            tunnel: Halves(tr, tw),
            upstream: Halves(ur, uw),
        })
    }
}

/// An inbound CONNECT stream ready to relay: what [`Inner::run`] needs of its setup.
struct InboundSetup {
    record: Arc<ConnectionRecord>,
    epoch: u64,
    via: Via,
    tunnel: Halves<weft_hbone::H2RecvHalf, weft_hbone::H2SendHalf>,
    upstream: Halves<tokio::net::tcp::OwnedReadHalf, tokio::net::tcp::OwnedWriteHalf>,
}

/// Why a `hostname:port` authority names no local target.
enum HostTargetError {
    /// Not of that form at all.
    NotAHostname,
    /// No service of that name that the local workload backs, or no target port for it.
    Unknown(String),
}

/// The target of a `hostname:port` CONNECT arriving at `local`: the local workload's address and the port it serves
/// the service port on (its own port map, else the service's target port), and the service's key.
fn hostname_target(
    state: &weft_state::MeshState,
    authority: &str,
    local: SocketAddr,
) -> Result<(SocketAddr, String), HostTargetError> {
    let (host, port) = authority
        .rsplit_once(':')
        .and_then(|(h, p)| Some((h, p.parse::<u16>().ok()?)))
        .filter(|(h, _)| !h.is_empty() && h.parse::<IpAddr>().is_err() && !h.starts_with('['))
        .ok_or(HostTargetError::NotAHostname)?;
    let wl = state
        .workload_by_ip(local.ip())
        .ok_or_else(|| HostTargetError::Unknown(format!("no workload at {local}")))?;
    // A hostname may exist in several namespaces: the one this workload backs (its own namespace first).
    let mut candidates: Vec<_> = state
        .services_by_host(host)
        .iter()
        .filter(|s| wl.services.contains_key(&s.key()))
        .collect();
    candidates.sort_by_key(|s| s.namespace != wl.namespace);
    let svc = candidates
        .first()
        .ok_or_else(|| HostTargetError::Unknown(format!("{} backs no service {host}", wl.uid)))?;
    let key = svc.key();
    let target = wl
        .services
        .get(&key)
        .and_then(|m| m.get(&port).copied())
        .filter(|p| *p != 0)
        .or(svc.ports.get(&port).copied().filter(|p| *p != 0))
        .ok_or_else(|| {
            HostTargetError::Unknown(format!("service {key} has no target port for {port}"))
        })?;
    Ok((SocketAddr::new(local.ip(), target), key))
}

/// Where an inbound HBONE stream goes, given the destination workload's application tunnel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct AppTunnel {
    /// What policy and telemetry see as the destination: the workload's address and the port dialled.
    policy_dst: SocketAddr,
    /// The address dialled.
    connect: SocketAddr,
    /// The source address to bind when dialling (loopback for a loopback tunnel).
    bind: Option<IpAddr>,
    /// Whether a PROXY v2 header goes first.
    proxy_protocol: bool,
}

impl AppTunnel {
    /// `dst` is the CONNECT authority (a local workload's address). No tunnel: dial it as it is. A tunnel: its
    /// port (or the authority's); a PROXY tunnel is dialled on loopback when `loopback` (in-pod: ztunnel's
    /// LOCALHOST_APP_TUNNEL, so the application may listen on loopback only), else on the workload's address.
    fn of(wl: &Workload, dst: SocketAddr, loopback: bool) -> Self {
        let Some(t) = wl.application_tunnel else {
            return Self {
                policy_dst: dst,
                connect: dst,
                bind: None,
                proxy_protocol: false,
            };
        };
        let port = t.port.unwrap_or(dst.port());
        let policy_dst = SocketAddr::new(dst.ip(), port);
        let proxy_protocol = t.protocol == AppTunnelProtocol::Proxy;
        if proxy_protocol && loopback {
            let lo = if dst.is_ipv4() {
                IpAddr::V4(Ipv4Addr::LOCALHOST)
            } else {
                IpAddr::V6(Ipv6Addr::LOCALHOST)
            };
            return Self {
                policy_dst,
                connect: SocketAddr::new(lo, port),
                bind: Some(lo),
                proxy_protocol,
            };
        }
        Self {
            policy_dst,
            connect: policy_dst,
            bind: None,
            proxy_protocol,
        }
    }
}

/// The source address of an inbound HBONE stream, and the address the peer claims in `forwarded: for=`.
///
/// Security rule: policy (`sourceIps`/`notSourceIps`) and the source-workload lookup see only the TCP peer
/// address of the HBONE connection (`peer`), which the kernel reports and the peer cannot choose (with
/// `--bind-source-ip` or in-pod mode it is the client workload's own address). The `forwarded` header is written by
/// the peer: its `for=` address is returned as a claim to be logged (`forwarded_for` in the access log) and must
/// never be trusted for a decision. ztunnel does the same (its inbound takes the connection's source address).
fn source_of(peer: SocketAddr, h: &HeaderMap) -> (SocketAddr, Option<SocketAddr>) {
    (peer, forwarded_for(h))
}

/// The `for="ip:port"` element of a `forwarded` header.
pub(crate) fn forwarded_for(h: &HeaderMap) -> Option<SocketAddr> {
    let v = h.get("forwarded")?.to_str().ok()?;
    v.split(';').find_map(|part| {
        let part = part.trim();
        let val = part.strip_prefix("for=")?;
        val.trim_matches('"').parse().ok()
    })
}

/// The `host=` element of a `forwarded` header (the service hostname the client targeted).
pub(crate) fn forwarded_host(h: &HeaderMap) -> Option<&str> {
    let v = h.get("forwarded")?.to_str().ok()?;
    v.split(';')
        .find_map(|part| part.trim().strip_prefix("host="))
        .map(|host| host.trim_matches('"'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workload(tunnel: Option<weft_state::ApplicationTunnel>) -> Workload {
        let mut cfg = weft_state::local::parse(
            "workloads:\n- {uid: w, namespace: ns, workloadIps: [10.0.0.2]}\n",
            std::path::Path::new("/"),
        )
        .unwrap();
        let mut w = cfg.workloads.remove(0);
        w.application_tunnel = tunnel;
        w
    }

    #[test]
    fn application_tunnels_pick_the_dialled_address() {
        use weft_state::ApplicationTunnel as T;
        let dst: SocketAddr = "10.0.0.2:8080".parse().unwrap();
        let plain = AppTunnel::of(&workload(None), dst, true);
        assert_eq!(
            (plain.connect, plain.policy_dst, plain.proxy_protocol),
            (dst, dst, false)
        );
        let proxy = T {
            protocol: AppTunnelProtocol::Proxy,
            port: Some(15088),
        };
        let node = AppTunnel::of(&workload(Some(proxy)), dst, false);
        assert_eq!(node.connect, "10.0.0.2:15088".parse().unwrap());
        assert_eq!(node.policy_dst, node.connect);
        assert!(node.proxy_protocol && node.bind.is_none());
        let pod = AppTunnel::of(&workload(Some(proxy)), dst, true);
        assert_eq!(pod.connect, "127.0.0.1:15088".parse().unwrap());
        assert_eq!(pod.bind, Some(IpAddr::V4(Ipv4Addr::LOCALHOST)));
        assert_eq!(pod.policy_dst, "10.0.0.2:15088".parse().unwrap());
        let same_port = T {
            protocol: AppTunnelProtocol::Proxy,
            port: None,
        };
        assert_eq!(
            AppTunnel::of(&workload(Some(same_port)), dst, false).connect,
            dst
        );
        let none = T {
            protocol: AppTunnelProtocol::None,
            port: Some(9000),
        };
        let n = AppTunnel::of(&workload(Some(none)), dst, true);
        assert_eq!(
            n.connect,
            "10.0.0.2:9000".parse().unwrap(),
            "only PROXY tunnels go to loopback"
        );
        assert!(!n.proxy_protocol);
    }

    #[test]
    fn hostname_authorities_name_the_local_endpoint_of_the_service() {
        let state = weft_state::local::parse(
            "workloads:
- {uid: w, namespace: ns, workloadIps: [10.0.0.2], services: {ns/svc.example: {80: 8080, 81: 0}}}
- {uid: v, namespace: ns, workloadIps: [10.0.0.3]}
services:
- {name: svc, namespace: ns, hostname: svc.example, vips: [/10.96.0.1], ports: {80: 9999, 81: 8181, 82: 0}}
",
            std::path::Path::new("/"),
        )
        .unwrap()
        .into_state(1);
        let local: SocketAddr = "10.0.0.2:15008".parse().unwrap();
        let ok = |a: &str| hostname_target(&state, a, local).ok();
        assert_eq!(
            ok("svc.example:80"),
            Some(("10.0.0.2:8080".parse().unwrap(), "ns/svc.example".into())),
            "the endpoint's own port first"
        );
        assert_eq!(
            ok("svc.example:81").map(|t| t.0),
            Some("10.0.0.2:8181".parse().unwrap()),
            "then the service's target port"
        );
        for unknown in ["svc.example:82", "other.example:80"] {
            assert!(matches!(
                hostname_target(&state, unknown, local),
                Err(HostTargetError::Unknown(_))
            ));
        }
        let other: SocketAddr = "10.0.0.3:15008".parse().unwrap();
        assert!(
            matches!(
                hostname_target(&state, "svc.example:80", other),
                Err(HostTargetError::Unknown(_))
            ),
            "a workload that does not back the service"
        );
        for not_host in [
            "10.0.0.2:80",
            "svc.example",
            "svc.example:x",
            ":80",
            "[::1]:80",
        ] {
            assert!(
                matches!(
                    hostname_target(&state, not_host, local),
                    Err(HostTargetError::NotAHostname)
                ),
                "{not_host}"
            );
        }
    }

    #[test]
    fn parses_forwarded_for() {
        let mut h = HeaderMap::new();
        h.insert(
            "forwarded",
            "for=\"10.0.0.1:4000\";host=x.svc".parse().unwrap(),
        );
        assert_eq!(forwarded_for(&h), Some("10.0.0.1:4000".parse().unwrap()));
        assert_eq!(forwarded_host(&h), Some("x.svc"));
        h.insert("forwarded", "for=garbage".parse().unwrap());
        assert_eq!(forwarded_for(&h), None);
        assert_eq!(forwarded_host(&h), None);
    }

    #[test]
    fn the_source_is_the_tcp_peer_whatever_forwarded_claims() {
        let peer: SocketAddr = "127.0.0.5:41000".parse().unwrap();
        let mut h = HeaderMap::new();
        assert_eq!(source_of(peer, &h), (peer, None));
        h.insert("forwarded", "for=\"127.0.0.9:4000\"".parse().unwrap());
        assert_eq!(
            source_of(peer, &h),
            (peer, Some("127.0.0.9:4000".parse().unwrap()))
        );
    }
}
