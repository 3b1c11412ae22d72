//! What the proxy's integration tests share: shards as `weft run` starts them, a proxy with only its SOCKS5
//! listener, and a SOCKS5 greeting.
#![allow(clippy::unwrap_used, dead_code)] // a test panics to fail; each test file uses part of this

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use weft_proxy::shards::Shards;
use weft_proxy::{InboundBind, Proxy, ProxyConfig, ProxyMetrics};

/// `n` shards as `weft run` starts them: current-thread runtimes, each driven by a thread of its own (left
/// running until the test process ends), and their handles.
pub fn shards(n: usize) -> (Arc<Shards>, Vec<tokio::runtime::Handle>) {
    let handles = (0..n)
        .map(|i| {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            let handle = rt.handle().clone();
            std::thread::spawn(move || {
                weft_proxy::shards::enter(i);
                rt.block_on(std::future::pending::<()>());
            });
            handle
        })
        .collect::<Vec<_>>();
    (Arc::new(Shards::new(handles.clone()).unwrap()), handles)
}

pub async fn proxy_on(
    metrics: Arc<ProxyMetrics>,
    cap: Option<usize>,
    shards: Option<Arc<Shards>>,
) -> (Arc<Proxy>, SocketAddr) {
    let mut cfg = ProxyConfig::new("node-a");
    cfg.shards = shards;
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
pub async fn greet(addr: SocketAddr) -> Option<TcpStream> {
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
