//! The per-listener connection cap on a real listener: with the cap at N and N connections held, the next one
//! is closed at once and counted; once one of the N ends, a new connection is served again.
#![allow(clippy::unwrap_used)] // a test panics to fail

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use weft_proxy::metrics::ListenerLabels;
use weft_proxy::{InboundBind, Proxy, ProxyConfig, ProxyMetrics};

const CAP: usize = 3;
const SOCKS5: ListenerLabels = ListenerLabels { listener: "socks5" };

async fn proxy(metrics: Arc<ProxyMetrics>, cap: Option<usize>) -> (Arc<Proxy>, SocketAddr) {
    let mut cfg = ProxyConfig::new("node-a");
    cfg.outbound_addr = None;
    cfg.inbound_plaintext_addr = None;
    cfg.inbound = InboundBind::Disabled;
    cfg.socks5_addr = Some(SocketAddr::from(([127, 0, 0, 1], 0)));
    cfg.max_connections_per_listener = cap;
    // Held clients sit in the SOCKS5 handshake: they must not time out during the test.
    cfg.connect_timeout = Duration::from_secs(3600);
    let (cert, key) =
        weft_identity::ca::generate_root("cluster.local", Duration::from_secs(3600)).unwrap();
    let ca = weft_identity::LocalCa::from_pem(&cert, &key, vec![]).unwrap();
    let identity =
        weft_identity::SecretManager::new(Arc::new(ca), weft_identity::ManagerConfig::default());
    let p = Proxy::start(
        cfg,
        Arc::new(weft_state::StateStore::new()),
        identity,
        Arc::new(weft_hooks::NoHooks::default()),
        metrics,
    )
    .await
    .unwrap();
    let addr = p
        .bound_addrs()
        .into_iter()
        .find(|(w, _)| *w == "socks5")
        .unwrap()
        .1;
    (p, addr)
}

/// Connect and send a SOCKS5 greeting: `Some(stream)` if the listener served it (method selection came back),
/// `None` if the connection was closed instead.
async fn greet(addr: SocketAddr) -> Option<TcpStream> {
    let mut s = TcpStream::connect(addr).await.unwrap();
    // The listener may have closed the connection already: a failed write means the same as a closed read.
    if s.write_all(&[5, 1, 0]).await.is_err() {
        return None;
    }
    let mut answer = [0u8; 2];
    match s.read_exact(&mut answer).await {
        Ok(_) => {
            assert_eq!(answer, [5, 0]);
            Some(s)
        }
        Err(_) => None,
    }
}

/// Wait until `f` holds (checked each time the runtime has run other tasks), at most a generous while.
async fn until(what: &str, f: impl Fn() -> bool) {
    tokio::time::timeout(Duration::from_secs(30), async {
        while !f() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("timed out waiting for {what}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_listener_refuses_at_once_and_recovers() {
    let metrics = Arc::new(ProxyMetrics::default());
    let (_proxy, addr) = proxy(metrics.clone(), Some(CAP)).await;
    let refused = || metrics.listener_refused.get_or_create(&SOCKS5).get();
    let open = || metrics.listener_open.get_or_create(&SOCKS5).get();

    let mut held = Vec::new();
    for i in 0..CAP {
        held.push(
            greet(addr)
                .await
                .unwrap_or_else(|| panic!("connection {i} under the cap was refused")),
        );
    }
    assert_eq!(open(), i64::try_from(CAP).unwrap());
    assert_eq!(refused(), 0);

    // N+1: closed without being served, and counted.
    assert!(greet(addr).await.is_none(), "the cap did not hold");
    assert_eq!(refused(), 1);
    assert!(greet(addr).await.is_none(), "the cap did not hold");
    assert_eq!(refused(), 2);
    assert_eq!(open(), i64::try_from(CAP).unwrap());

    // One held connection ends: once the listener has seen it go, a new one is served.
    drop(held.pop());
    until("the listener to see a connection end", || {
        open() == i64::try_from(CAP - 1).unwrap()
    })
    .await;
    held.push(greet(addr).await.expect("a freed slot was not reused"));
    assert_eq!(refused(), 2);

    // The metric's exported name.
    let mut reg = prometheus_client::registry::Registry::default();
    metrics.register(&mut reg);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &reg).unwrap();
    assert!(
        text.contains("weft_listener_connections_refused_total{listener=\"socks5\"} 2"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_cap_means_unlimited() {
    let metrics = Arc::new(ProxyMetrics::default());
    let (_proxy, addr) = proxy(metrics.clone(), None).await;
    let mut held = Vec::new();
    for _ in 0..(4 * CAP) {
        held.push(greet(addr).await.expect("refused without a cap"));
    }
    assert_eq!(metrics.listener_refused.get_or_create(&SOCKS5).get(), 0);
}
