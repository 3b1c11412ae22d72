//! Drain against real listeners: a connection the data path has accepted but is still setting up when the drain
//! starts (a SOCKS5 client in its handshake, an inbound HBONE connection before its HTTP/2 preface) keeps the drain
//! waiting and is served to its end; the listeners stop accepting at once; and one still in setup at the drain
//! deadline is closed then. (Before the fix a drain saw nothing tracked and returned at once: in a process that
//! exits after its drain, as weft does on SIGTERM, such a connection died unanswered.)
#![allow(clippy::unwrap_used)] // a test panics to fail

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use weft_hbone::{ConnectRequest, H2Config};
use weft_identity::{SecretManager, SpiffeId};
use weft_proxy::{InboundBind, Proxy, ProxyConfig, ProxyMetrics};
use weft_testkit::echo_server;

/// The floor of every event wait.
const WAIT: Duration = Duration::from_secs(30);

fn identity() -> Arc<SecretManager> {
    let (cert, key) =
        weft_identity::ca::generate_root("cluster.local", Duration::from_secs(3600)).unwrap();
    let ca = weft_identity::LocalCa::from_pem(&cert, &key, vec![]).unwrap();
    SecretManager::new(Arc::new(ca), weft_identity::ManagerConfig::default())
}

/// A config with no listener, and timeouts far beyond anything a test waits for unless it sets them.
fn config(drain_deadline: Duration) -> ProxyConfig {
    let mut cfg = ProxyConfig::new("node-a");
    cfg.outbound_addr = None;
    cfg.inbound_plaintext_addr = None;
    cfg.socks5_addr = None;
    cfg.inbound = InboundBind::Disabled;
    cfg.drain_deadline = drain_deadline;
    cfg.connect_timeout = Duration::from_secs(3600);
    cfg
}

async fn start(cfg: ProxyConfig, mesh: &str, identity: Arc<SecretManager>) -> Arc<Proxy> {
    let state = Arc::new(weft_state::StateStore::new());
    state.replace(weft_state::local::parse(mesh, std::path::Path::new(".")).unwrap());
    Proxy::start(
        cfg,
        state,
        identity,
        Arc::new(weft_hooks::NoHooks::default()),
        Arc::new(ProxyMetrics::default()),
    )
    .await
    .unwrap()
}

fn bound(p: &Proxy, what: &str) -> SocketAddr {
    p.bound_addrs()
        .into_iter()
        .find(|(w, _)| *w == what)
        .unwrap()
        .1
}

/// Resolves once `addr` refuses connections (the listener is closed). Each attempt that still connects gives the
/// runtime a turn before the next.
async fn refused(addr: SocketAddr) {
    while TcpStream::connect(addr).await.is_ok() {
        tokio::task::yield_now().await;
    }
}

/// A SOCKS5 client that has greeted the proxy and had its method chosen: the proxy has accepted it and waits for
/// its request, i.e. the connection is still being set up.
async fn socks5_greeted(proxy: SocketAddr) -> TcpStream {
    let mut s = TcpStream::connect(proxy).await.unwrap();
    s.write_all(&[5, 1, 0]).await.unwrap();
    let mut m = [0u8; 2];
    s.read_exact(&mut m).await.unwrap();
    assert_eq!(m, [5, 0]);
    s
}

/// Finish the SOCKS5 setup (a CONNECT to `dst`), then one echo round trip.
async fn socks5_round_trip(s: &mut TcpStream, dst: SocketAddr) {
    let IpAddr::V4(ip) = dst.ip() else {
        unreachable!()
    };
    let mut req = vec![5, 1, 0, 1];
    req.extend_from_slice(&ip.octets());
    req.extend_from_slice(&dst.port().to_be_bytes());
    s.write_all(&req).await.unwrap();
    let mut reply = [0u8; 10];
    s.read_exact(&mut reply).await.unwrap();
    assert_eq!(reply[1], 0, "SOCKS5 CONNECT refused: {reply:?}");
    s.write_all(b"served after the drain started")
        .await
        .unwrap();
    let mut back = [0u8; 30];
    s.read_exact(&mut back).await.unwrap();
    assert_eq!(&back, b"served after the drain started");
}

#[tokio::test]
async fn drain_waits_for_a_connection_accepted_but_still_being_set_up() {
    let dst = echo_server(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0))
        .await
        .unwrap()
        .0;
    let mut cfg = config(Duration::from_secs(3600));
    cfg.socks5_addr = Some(SocketAddr::from(([127, 0, 0, 1], 0)));
    let proxy = start(cfg, "workloads: []\n", identity()).await;
    let addr = bound(&proxy, "socks5");
    let mut client = socks5_greeted(addr).await;

    let drain = proxy.drain();
    tokio::pin!(drain);
    tokio::select! {
        biased;
        () = &mut drain => panic!("the drain returned while an accepted connection was still being set up"),
        () = refused(addr) => {}
    }
    // The listener is closed, the connection it accepted is served to its end, and the drain waits for it.
    tokio::select! {
        biased;
        () = &mut drain => panic!("the drain returned before the connection it had to wait for was served"),
        () = socks5_round_trip(&mut client, dst) => {}
    }
    drop(client);
    tokio::time::timeout(WAIT, drain)
        .await
        .expect("the drain did not end after its last connection");
    assert_eq!(proxy.tracker().len(), 0);
}

/// Paused clock: the drain deadline passes (and only it) while a connection is still in its setup.
#[tokio::test(start_paused = true)]
async fn a_connection_still_being_set_up_at_the_drain_deadline_is_closed() {
    const DEADLINE: Duration = Duration::from_secs(5);
    let mut cfg = config(DEADLINE);
    cfg.socks5_addr = Some(SocketAddr::from(([127, 0, 0, 1], 0)));
    let proxy = start(cfg, "workloads: []\n", identity()).await;
    let mut client = socks5_greeted(bound(&proxy, "socks5")).await;

    let t0 = tokio::time::Instant::now();
    proxy.drain().await;
    assert!(
        t0.elapsed() >= DEADLINE,
        "the drain returned after {:?}, before its deadline, with a connection still being set up",
        t0.elapsed()
    );
    let mut b = [0u8; 1];
    let closed = tokio::time::timeout(WAIT, client.read(&mut b))
        .await
        .expect("the connection still in setup was not closed at the drain deadline");
    assert!(
        matches!(closed, Ok(0) | Err(_)),
        "unexpected bytes: {closed:?}"
    );
}

/// Inbound HBONE: a client whose TLS handshake is done but who has not sent its HTTP/2 preface when the drain
/// starts still gets its CONNECT served, then the drain ends.
#[tokio::test]
async fn an_hbone_connection_accepted_before_the_drain_is_served() {
    let ip = IpAddr::V4(Ipv4Addr::new(127, 88, 0, 2));
    let dst = echo_server(SocketAddr::new(ip, 0)).await.unwrap().0;
    let mesh = format!(
        "workloads:
- uid: Kubernetes//Pod/default/echo
  name: echo
  namespace: default
  serviceAccount: echo
  workloadIps: [{ip}]
  protocol: HBONE
  node: node-a
"
    );
    let identity = identity();
    let mut cfg = config(Duration::from_secs(3600));
    cfg.connect_timeout = Duration::from_secs(10);
    cfg.inbound = InboundBind::Addr(SocketAddr::new(ip, 0));
    let proxy = start(cfg, &mesh, identity.clone()).await;
    let hbone = bound(&proxy, "inbound_hbone");

    let client_id: SpiffeId = "spiffe://cluster.local/ns/default/sa/client"
        .parse()
        .unwrap();
    let echo_id: SpiffeId = "spiffe://cluster.local/ns/default/sa/echo".parse().unwrap();
    let cert = identity.fetch(&client_id).await.unwrap();
    let tls_cfg = cert.client_config(vec![echo_id]).unwrap();
    let tcp = TcpStream::connect(hbone).await.unwrap();
    let name = rustls::pki_types::ServerName::IpAddress(ip.into());
    let tls = tokio_rustls::TlsConnector::from(tls_cfg)
        .connect(name, tcp)
        .await
        .unwrap();

    let drain = proxy.drain();
    tokio::pin!(drain);
    tokio::select! {
        biased;
        () = &mut drain => panic!("the drain returned while an accepted HBONE connection was still being set up"),
        () = refused(hbone) => {}
    }
    let served = async {
        let h2 = weft_hbone::handshake(tls, &H2Config::default())
            .await
            .unwrap();
        let (mut s, _) = h2
            .connect(ConnectRequest::new(dst.to_string()))
            .await
            .expect("the CONNECT on the connection accepted before the drain was refused");
        s.write_all(b"tunnelled").await.unwrap();
        let mut back = [0u8; 9];
        s.read_exact(&mut back).await.unwrap();
        assert_eq!(&back, b"tunnelled");
        (h2, s)
    };
    // Until the client half-closes, the tunnel is open: the drain cannot be over.
    let (h2, mut s) = tokio::select! {
        biased;
        () = &mut drain => panic!("the drain returned before the HBONE stream it had to wait for was served"),
        served = served => served,
    };
    s.shutdown().await.unwrap();
    let mut rest = Vec::new();
    tokio::time::timeout(WAIT, s.read_to_end(&mut rest))
        .await
        .expect("the tunnel did not end")
        .unwrap();
    drop((s, h2));
    tokio::time::timeout(WAIT, drain)
        .await
        .expect("the drain did not end after its last stream");
}
