//! The per-listener connection cap on a real listener: with the cap at N and N connections held, the next one
//! is closed at once and counted; once one of the N ends, a new connection is served again. With shards the cap
//! holds for the listener as a whole, whichever shard a connection runs on.
#![allow(clippy::unwrap_used)] // a test panics to fail

use std::net::SocketAddr;
use std::sync::Arc;

use common::{greet, proxy_on, shards};
use tokio::net::TcpStream;
use weft_proxy::metrics::ListenerLabels;
use weft_proxy::shards::SPILL_MARGIN;
use weft_proxy::{Proxy, ProxyMetrics};
use weft_testkit::until;

mod common;

const CAP: usize = 3;
const SOCKS5: ListenerLabels = ListenerLabels { listener: "socks5" };

async fn proxy(metrics: Arc<ProxyMetrics>, cap: Option<usize>) -> (Arc<Proxy>, SocketAddr) {
    proxy_on(metrics, cap, None).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_listener_refuses_at_once_and_recovers() {
    let metrics = Arc::new(ProxyMetrics::default());
    let (_proxy, addr) = proxy(metrics.clone(), Some(CAP)).await;
    full_listener_refuses_and_recovers(&metrics, addr, 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cap_holds_for_the_listener_across_its_shards() {
    // Held connections spill from the listener's home shard to the other (past the margin): the cap counts them
    // all, on whichever shard they run.
    let metrics = Arc::new(ProxyMetrics::default());
    let (shards, _) = shards(2);
    let cap = 2 * (SPILL_MARGIN + 1);
    let (_proxy, addr) = proxy_on(metrics.clone(), Some(cap), Some(shards.clone())).await;
    let mut held = hold(addr, cap).await;
    let live = [shards.live(0), shards.live(1)];
    assert!(
        live.iter().sum::<usize>() == cap
            && live.iter().all(|&n| n > 0)
            && live[0].abs_diff(live[1]) <= SPILL_MARGIN,
        "held connections not spread over the shards: {live:?}"
    );
    for _ in 0..3 {
        assert!(greet(addr).await.is_none(), "the cap did not hold");
    }
    assert_eq!(metrics.listener_refused.get_or_create(&SOCKS5).get(), 3);
    // Ended connections leave their shards' counts.
    held.clear();
    until("the shards to see their connections end", || {
        shards.live(0) + shards.live(1) == 0
    })
    .await;
}

/// `n` connections served and held (each must be).
async fn hold(addr: SocketAddr, n: usize) -> Vec<TcpStream> {
    let mut held = Vec::new();
    for i in 0..n {
        held.push(
            greet(addr)
                .await
                .unwrap_or_else(|| panic!("connection {i} under the cap was refused")),
        );
    }
    held
}

/// With `CAP` connections held, `over` more are refused and counted; once one held ends, a new one is served.
async fn full_listener_refuses_and_recovers(metrics: &ProxyMetrics, addr: SocketAddr, over: u64) {
    let refused = || metrics.listener_refused.get_or_create(&SOCKS5).get();
    let open = || metrics.listener_open.get_or_create(&SOCKS5).get();

    let mut held = hold(addr, CAP).await;
    assert_eq!(open(), i64::try_from(CAP).unwrap());
    assert_eq!(refused(), 0);

    // Over the cap: closed without being served, and counted.
    for i in 1..=over {
        assert!(greet(addr).await.is_none(), "the cap did not hold");
        assert_eq!(refused(), i);
    }
    assert_eq!(open(), i64::try_from(CAP).unwrap());

    // One held connection ends: once the listener has seen it go, a new one is served.
    drop(held.pop());
    until("the listener to see a connection end", || {
        open() == i64::try_from(CAP - 1).unwrap()
    })
    .await;
    held.push(greet(addr).await.expect("a freed slot was not reused"));
    assert_eq!(refused(), over);

    // The metric's exported name.
    let mut reg = prometheus_client::registry::Registry::default();
    metrics.register(&mut reg);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &reg).unwrap();
    assert!(
        text.contains(&format!(
            "weft_listener_connections_refused_total{{listener=\"socks5\"}} {over}"
        )),
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
