//! A connection a listener hands to another shard is served by that shard alone: its socket's readiness comes
//! from the running shard's reactor, so it keeps working while the accepting shard stands still.
#![allow(clippy::unwrap_used)] // a test panics to fail

use std::sync::Arc;
use std::time::Duration;

use common::{greet, proxy_on, shards};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use weft_proxy::ProxyMetrics;
use weft_proxy::shards::SPILL_MARGIN;

mod common;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handed_off_connection_is_served_while_the_accepting_shard_is_blocked() {
    let (shards, handles) = shards(2);
    let (_proxy, addr) = proxy_on(
        Arc::new(ProxyMetrics::default()),
        None,
        Some(shards.clone()),
    )
    .await;

    // The listener's home shard keeps SPILL_MARGIN + 1 held connections; the next goes to the other shard.
    let mut held = Vec::new();
    for _ in 0..=SPILL_MARGIN {
        held.push(greet(addr).await.unwrap());
    }
    let home = usize::from(shards.live(1) > shards.live(0));
    assert_eq!(shards.live(home), SPILL_MARGIN + 1);
    let mut moved = greet(addr).await.unwrap();
    assert_eq!(shards.live(1 - home), 1, "the connection did not spill");

    // Block the home shard's thread (a blocking wait inside one of its tasks) and wait until it is blocked.
    let (blocked_tx, blocked_rx) = tokio::sync::oneshot::channel();
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    handles[home].spawn(async move {
        blocked_tx.send(()).unwrap();
        let _ = release_rx.recv();
    });
    blocked_rx.await.unwrap();

    // The moved connection's handler has answered the greeting and waits for the request: reading it needs a
    // readiness event, which only the running shard's reactor can deliver now. An unsupported command (BIND)
    // gets its reply without any upstream.
    moved
        .write_all(&[5, 2, 0, 1, 127, 0, 0, 1, 0, 80])
        .await
        .unwrap();
    let mut reply = [0u8; 10];
    tokio::time::timeout(Duration::from_secs(30), moved.read_exact(&mut reply))
        .await
        .expect("the shard running the connection did not see its socket readable")
        .unwrap();
    assert_eq!(
        reply[..2],
        [5, 7],
        "SOCKS5 reply to BIND: command not supported"
    );

    release_tx.send(()).unwrap();
    held.clear();
}
