//! Waypoint and network-gateway stand-ins for tests, built on weft-hbone. Each terminates HBONE on `ip:15008` with
//! a certificate for its own identity (issued by the mesh's CA) and records every CONNECT (its authority, the
//! `forwarded` header and the verified identity of the peer). A waypoint re-originates HBONE, from its own address
//! and with its own identity, to the workload the authority stands for; a network gateway forwards the tunnel's
//! bytes (the client's inner HBONE) as they are to the remote node. Routes are the test's: a real waypoint or gateway
//! picks the endpoint of a service by itself. [`WaypointStandIn::start_in`] runs one inside a network namespace, e.g.
//! a gateway on two links that listens on one network and dials onward from its address on the other.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::{Arc, Mutex};

use http::StatusCode;
use tokio::net::{TcpListener, TcpSocket};
use tokio_util::sync::CancellationToken;
use weft_devmesh::netns::Netns;
use weft_hbone::{ConnectRequest, H2Config, InboundRequest};
use weft_identity::{LocalCa, ManagerConfig, SecretManager, SpiffeId, WorkloadCert};

/// One CONNECT the stand-in received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    /// The `:authority` (the original destination as the client dialled it).
    pub authority: String,
    /// The verified SPIFFE id of the peer (the client's node, on the client's behalf).
    pub peer_identity: String,
    /// The peer's TCP address.
    pub peer: SocketAddr,
    /// The `forwarded` header, if any.
    pub forwarded: Option<String>,
}

/// Where a CONNECT goes on.
#[derive(Debug, Clone)]
pub enum Route {
    /// Waypoint: HBONE to this workload address (its node's port 15008, authority = it), which must prove the id.
    Hbone(SocketAddr, SpiffeId),
    /// Network gateway: the tunnel's bytes, unchanged, to this address (the remote node's HBONE port).
    Raw(SocketAddr),
}

/// A running stand-in; stops on drop.
#[derive(Debug)]
pub struct WaypointStandIn {
    /// Where it terminates HBONE.
    pub addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    stop: CancellationToken,
}

impl WaypointStandIn {
    /// Start on `ip:15008` as `id`, with certificates from the CA in `ca_dir`. `routes` maps a CONNECT authority to
    /// where it goes on; an authority with no route is answered 503.
    pub async fn start(
        ip: IpAddr,
        ca_dir: &Path,
        id: SpiffeId,
        routes: HashMap<String, Route>,
    ) -> Result<Self, String> {
        Self::start_from(ip, ip, ca_dir, id, routes).await
    }

    /// Like [`WaypointStandIn::start`] on a thread inside `ns` (its listener and every onward socket belong to that
    /// namespace): it listens on `ip:15008` and dials onward from `source` (e.g. a gateway's address on the remote
    /// network). Stops, and its thread ends, on drop.
    pub async fn start_in(
        ns: &Netns,
        ip: IpAddr,
        source: IpAddr,
        ca_dir: &Path,
        id: SpiffeId,
        routes: HashMap<String, Route>,
    ) -> Result<Self, String> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let stop = CancellationToken::new();
        let stop_thread = stop.clone();
        let ca_dir = ca_dir.to_path_buf();
        let thread = ns.run(move || async move {
            match Self::start_from(ip, source, &ca_dir, id, routes).await {
                Ok(inner) => {
                    let _ = tx.send(Ok((inner.addr, inner.seen.clone())));
                    stop_thread.cancelled().await;
                    drop(inner);
                }
                Err(e) => {
                    let _ = tx.send(Err(e));
                }
            }
        });
        match rx.await {
            Ok(started) => {
                let (addr, seen) = started?;
                Ok(Self { addr, seen, stop })
            }
            // The thread could not enter the namespace (or panicked).
            Err(_) => Err(
                match tokio::task::spawn_blocking(move || thread.join()).await {
                    Ok(Ok(Err(e))) => e,
                    _ => format!("stand-in thread in {} ended", ns.name),
                },
            ),
        }
    }

    async fn start_from(
        ip: IpAddr,
        source: IpAddr,
        ca_dir: &Path,
        id: SpiffeId,
        routes: HashMap<String, Route>,
    ) -> Result<Self, String> {
        let ca = LocalCa::from_dir(ca_dir).map_err(|e| e.to_string())?;
        let identity = SecretManager::new(Arc::new(ca), ManagerConfig::default());
        let cert = identity.fetch(&id).await.map_err(|e| e.to_string())?;
        let server_cfg = cert.server_config().map_err(|e| e.to_string())?;
        let addr = SocketAddr::new(ip, 15008);
        let lis = TcpListener::bind(addr)
            .await
            .map_err(|e| format!("waypoint stand-in on {addr}: {e}"))?;
        let seen = Arc::new(Mutex::new(Vec::new()));
        let routes = Arc::new(routes);
        let (seen2, cert2) = (seen.clone(), cert.clone());
        let stop = CancellationToken::new();
        let stopped = stop.clone();
        tokio::spawn(async move {
            loop {
                let (tcp, peer) = tokio::select! {
                    _ = stopped.cancelled() => break,
                    accepted = lis.accept() => match accepted {
                        Ok(a) => a,
                        Err(_) => break,
                    },
                };
                let acceptor = tokio_rustls::TlsAcceptor::from(server_cfg.clone());
                let (seen, cert, routes) = (seen2.clone(), cert2.clone(), routes.clone());
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let peer_identity = match tls
                        .get_ref()
                        .1
                        .peer_certificates()
                        .and_then(|c| c.first())
                        .map(weft_identity::tls::identity_of)
                    {
                        Some(Ok(id)) => id.to_string(),
                        _ => return,
                    };
                    let cfg = H2Config::default();
                    let _ = weft_hbone::serve_connection(
                        tls,
                        &cfg,
                        CancellationToken::new(),
                        move |req| {
                            let (seen, cert, routes) = (seen.clone(), cert.clone(), routes.clone());
                            let peer_identity = peer_identity.clone();
                            async move {
                                relay(req, peer, peer_identity, source, &seen, &cert, &routes).await
                            }
                        },
                    )
                    .await;
                });
            }
        });
        Ok(Self { addr, seen, stop })
    }

    /// Every CONNECT received so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

impl Drop for WaypointStandIn {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn relay(
    req: InboundRequest,
    peer: SocketAddr,
    peer_identity: String,
    source: IpAddr,
    seen: &Mutex<Vec<Seen>>,
    cert: &Arc<WorkloadCert>,
    routes: &HashMap<String, Route>,
) {
    let authority = req.authority().to_owned();
    if let Ok(mut s) = seen.lock() {
        s.push(Seen {
            authority: authority.clone(),
            peer_identity,
            peer,
            forwarded: req
                .headers()
                .get("forwarded")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned),
        });
    }
    let Some(route) = routes.get(&authority).cloned() else {
        let _ = req.reject(StatusCode::SERVICE_UNAVAILABLE);
        return;
    };
    let (target, server_id) = match route {
        Route::Hbone(target, id) => (target, id),
        Route::Raw(to) => {
            let Ok(mut upstream) = raw(to, source).await else {
                let _ = req.reject(StatusCode::SERVICE_UNAVAILABLE);
                return;
            };
            let Ok(mut down) = req.accept(http::HeaderMap::new()) else {
                return;
            };
            let _ = tokio::io::copy_bidirectional(&mut down, &mut upstream).await;
            return;
        }
    };
    match onward(target, server_id, source, cert).await {
        Ok(mut upstream) => {
            let Ok(mut down) = req.accept(http::HeaderMap::new()) else {
                return;
            };
            let _ = tokio::io::copy_bidirectional(&mut down, &mut upstream).await;
        }
        Err(status) => {
            let _ = req.reject(status);
        }
    }
}

/// HBONE from the stand-in's `source` address to `target`'s node (port 15008 on the workload's address), which must
/// prove `server_id` (the workload's identity).
async fn onward(
    target: SocketAddr,
    server_id: SpiffeId,
    source: IpAddr,
    cert: &Arc<WorkloadCert>,
) -> Result<weft_hbone::H2Stream, StatusCode> {
    let unavailable = |_| StatusCode::SERVICE_UNAVAILABLE;
    let hbone = SocketAddr::new(target.ip(), 15008);
    let sock = TcpSocket::new_v4().map_err(unavailable)?;
    sock.bind(SocketAddr::new(source, 0)).map_err(unavailable)?;
    let tcp = sock.connect(hbone).await.map_err(unavailable)?;
    let cfg = cert
        .client_config(vec![server_id])
        .map_err(|_| StatusCode::INTERNAL_SERVER_ERROR)?;
    let name = rustls::pki_types::ServerName::IpAddress(hbone.ip().into());
    let tls = tokio_rustls::TlsConnector::from(cfg)
        .connect(name, tcp)
        .await
        .map_err(|_| StatusCode::BAD_GATEWAY)?;
    let client = weft_hbone::handshake(tls, &H2Config::default())
        .await
        .map_err(|_| StatusCode::BAD_GATEWAY)?;
    let (stream, _) = client
        .connect(ConnectRequest::to_addr(target))
        .await
        .map_err(|e| match e {
            weft_hbone::Error::Status(s) => s,
            _ => StatusCode::BAD_GATEWAY,
        })?;
    Ok(stream)
}

/// Plain TCP from the stand-in's `source` address to `to`.
async fn raw(to: SocketAddr, source: IpAddr) -> std::io::Result<tokio::net::TcpStream> {
    let sock = TcpSocket::new_v4()?;
    sock.bind(SocketAddr::new(source, 0))?;
    sock.connect(to).await
}
