//! weft side by side with Istio's ztunnel, in the topology of docs/performance.md: each proxy pair runs on its own two
//! network namespaces joined by a veth pair; the client's connections in node A are captured by iptables to the
//! proxy's 15001 and tunnelled over mTLS HBONE to node B, whose proxy hands them to the server. "direct" is the same
//! client and server with the capture skipped (a marked socket): the baseline. Client, servers and every proxy
//! share the machine's cores.
//!
//! Pairs: `weft` (its default plugins, istio-authz and istio-telemetry; no authorization policy, so istio-authz's
//! declared scope leaves every connection out and it is never called), `weft-pol` (the same with a namespace DENY
//! policy on the server's namespace that never matches: istio-authz decides every connection), `weft-shadow`
//! (`weft-pol` plus a shadow version of istio-authz, the same component and config, decided beside the serving one
//! off the data path on node B; a node reads a shadow only from its plugin source, so node B gets one served by this
//! bench: `mesh/shadow.rs`; after the rounds the bench reads node B's shadow figures and fails if the shadow decided
//! no connection; the target is `weft-shadow / weft-pol` conn/s ≥ 0.95), `weft-np`
//! (`--default-plugins false`),
//! `weft-base` when `WEFT_BASE_BIN` names another weft build (default plugins; before and after a change, in one
//! run; with `BENCH_BASE_POLICY=1` it gets `weft-pol`'s policy, to compare a change to the decision path; with
//! `BENCH_BASE_FLAGS` both its nodes get those flags, whitespace-separated, to compare a setting: `WEFT_BASE_BIN`
//! may name the same build), and
//! `ztunnel` when `ZTUNNEL_BIN` names a ztunnel binary built from its public source ([`weft_conformance::ztunnel`];
//! without it the bench says why and runs the weft figures only: CI has no ztunnel and never needs one), and
//! `relay`, the yardstick: the same capture and hop carried by a plain TCP relay on each node
//! ([`weft_conformance::relay`]: no TLS, no HTTP/2, no policy; this bench binary again, one process a node), the
//! least work per byte any userspace node proxy could do on this path, so `relay / ztunnel` bounds what a proxy's
//! one-flow throughput and keep-alive latency against ztunnel's can be on this machine (kernel TLS, which would let a
//! proxy splice the encrypted side too, is not offered by every kernel: `/proc/sys/net/ipv4/tcp_available_ulp`; this
//! one offers none). Its connection rate and memory are no yardstick: each connection takes two 256 KiB buffers and a
//! task per node, and it is left out of the memory case. Every
//! pair stays up for the whole run (an idle pair's own background work lands on every measurement alike) and the
//! measurements alternate: each part of a round is cut into slices (512 MiB each way, half a second of new
//! connections, 500 round trips) that the pairs take in turn, so two pairs' figures of one round come from the same
//! few seconds and a load that comes and goes on the machine falls on both alike, in an order shuffled per slice
//! (from a fixed seed), so no pair always runs first or right after the same other pair, on a machine that one
//! has just warmed or loaded.
//! Reported: the median over rounds with the spread (min–max), and ratios taken per round (paired: the same figure
//! of two pairs in the same round) with theirs.
//!
//! Figures: one-flow bulk throughput, client to server (upload) and server to client (download, `bulk down`); the
//! same as time-bounded flows on a new connection each (`flow`, `flow down`: iperf3's way, `BENCH_FLOW_SECS` each,
//! one each way per pair and round, so a flow's start, slow start and buffer growth, counts and every round's
//! ratio shows, not only the median of good slices); new
//! connections/s (1 byte each way, the server closes first, as an HTTP server does for `Connection: close`); keep-alive
//! 1-byte request latency p50/p99; a new connection's time to first byte p50/p99 (it includes the HBONE CONNECT round
//! trip); the CPU both proxies of a pair spend per GiB (of the upload) and per connection
//! (`/proc/<pid>/task/*/schedstat`); the machine's idle share during the upload (`/proc/stat`: a one-flow pipeline that
//! leaves cores idle is bound by its stages waiting on each other as well as by CPU); and, first, on fresh processes
//! after one warm-up, the CPU an idle pair uses by itself (ms per second, over 2 s), idle RSS (and its anonymous part,
//! the process's own memory) and RSS per connection while `BENCH_IDLE` idle connections are held open through each pair
//! (spread over four keep-alive servers, so 100,000 fit the ephemeral ports; the bench raises RLIMIT_NOFILE for
//! itself, the servers and the proxies, which inherit it), and while they are held, new connections' time to first
//! byte one after another (`BENCH_IDLE / 20` of them, 20 to 1,000: the accept latency under that load). Only ratios mean
//! anything, and only on a quiet machine; nothing here asserts a time.
//!
//! Run for figures (root, release builds; ztunnel's certificates come from `weft-ca`, found next to `weft`):
//!   cargo build --release --workspace --bins
//!   ZTUNNEL_BIN=/path/to/ztunnel cargo bench --workspace --bench mesh
//! or build the bench in the test profile and point it at the release weft (much less to compile; the `--config`
//! optimises this crate, whose code the relay pair runs, as the dependencies already are in the test profile):
//!   WEFT_BIN=target/release/weft ZTUNNEL_BIN=... BENCH_FULL=1 cargo test -p weft-conformance --bench mesh \
//!     --config 'profile.dev.package.weft-conformance.opt-level=3'
//! Without `--bench` on its command line (`cargo test --bench mesh`) and without `BENCH_FULL=1` it is a smoke run:
//! one round of tiny sizes, every code path once. (`cargo test --workspace` alone does not build or run benches.)
//! Environment (defaults full / smoke): BENCH_ROUNDS (5 / 1), BENCH_MIB bulk size per round and way (2048 / 8; in
//! slices of up to 512 MiB, each a transfer of most of a second, so a slice is not one scheduling accident),
//! BENCH_SECS connection-rate window per round, fractional allowed (3 / 0.3), BENCH_CONC concurrent connectors (16),
//! BENCH_LAT_N latency samples per round (5000 / 200), BENCH_IDLE idle connections for the memory case, 0 skips it
//! (10000 / 100), BENCH_LOG both proxies' log filter (`info`, both proxies' default), BENCH_ONLY comma list of
//! `mem`, `bulk`, `flow`, `cps`, `lat` (run only those parts; default all), BENCH_FLOW_SECS each flow's length
//! (7 / 0.2), BENCH_PAIRS comma list of pairs to start
//! (default all available).
#![allow(clippy::unwrap_used)] // a bench panics to fail

use std::net::SocketAddr;
use std::time::Duration;

#[path = "mesh/env.rs"]
mod env;
#[path = "mesh/output.rs"]
mod output;
#[path = "mesh/pairs.rs"]
mod pairs;
#[path = "mesh/probes.rs"]
mod probes;
#[path = "mesh/rounds.rs"]
mod rounds;
#[path = "mesh/shadow.rs"]
mod shadow;

use env::{Sizes, idle_that_fits, part};
use output::{memory, report};
use pairs::{Running, run_relay, start_pairs};
use probes::{CLOSE, servers};
use rounds::{Pair, Round, round, wait_listening};

/// The ratios the report prints: (numerator, denominator) pairs, where both ran.
const RATIOS: &[(&str, &str)] = &[
    ("weft", "ztunnel"),
    ("weft-pol", "ztunnel"),
    ("weft-np", "ztunnel"),
    ("weft-base", "ztunnel"),
    ("weft-shadow", "weft-pol"),
    ("weft", "weft-np"),
    ("weft-pol", "weft-np"),
    ("weft-base", "weft-np"),
    ("weft", "weft-base"),
    ("weft-pol", "weft-base"),
    ("weft", "direct"),
    ("ztunnel", "direct"),
    ("relay", "ztunnel"),
    ("weft", "relay"),
    ("relay", "direct"),
];

/// The check that makes `weft-shadow / weft-pol` mean something: the shadow decided connections of the rounds
/// (the new connections of the `cps` part, mostly; also those of `lat` and `bulk`), read from node B's
/// `/config_dump` before and after them. Panics when it decided none; prints what it decided, skipped (a full
/// queue) and decided otherwise than the serving version (the same component and policy: none expected).
async fn check_shadow(
    pairs: &[Pair],
    running: &[Running],
    node: &weft_devmesh::NodeProcess,
    before: shadow::Figures,
) {
    if !["bulk", "cps", "lat"].into_iter().any(part) {
        return;
    }
    // The shadow decides off the data path: let its queue drain before reading.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let after = shadow::figures(node).await;
    let decided = after.decided.saturating_sub(before.decided);
    let skipped = after.skipped.saturating_sub(before.skipped);
    println!(
        "weft-shadow: node B's shadow of {} decided {decided} connections of the rounds, skipped {skipped} (queue \
         full, {:.1}% of those offered), {} decided otherwise than the serving version",
        shadow::PLUGIN,
        skipped as f64 * 100.0 / (decided + skipped).max(1) as f64,
        after.divergences.saturating_sub(before.divergences),
    );
    // The serving istio-authz of weft-shadow is the plugin build's; weft-pol's is the one its weft build embeds.
    if let Some(pol) = node_b(pairs, running, "weft-pol") {
        let (mine, theirs) = (
            shadow::serving_sha(node).await,
            shadow::serving_sha(pol).await,
        );
        if mine != theirs {
            println!(
                "weft-shadow: its istio-authz ({mine:?}) is not the one weft-pol's weft embeds ({theirs:?}): \
                 the ratio compares two builds of it"
            );
        }
    }
    assert!(
        decided > 0,
        "weft-shadow: the shadow decided no connection during the rounds ({skipped} skipped): \
         weft-shadow / weft-pol would compare nothing"
    );
}

/// Node B of the weft pair `name`, if it runs (for `weft-shadow`, the node whose istio-authz has the shadow).
fn node_b<'a>(
    pairs: &[Pair],
    running: &'a [Running],
    name: &str,
) -> Option<&'a weft_devmesh::NodeProcess> {
    let i = pairs.iter().find(|p| p.name == name)?.running?;
    match &running[i] {
        Running::Weft(m) => Some(&m.b),
        _ => None,
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    if let Ok(ip) = std::env::var("BENCH_SERVE") {
        servers(ip.parse().expect("BENCH_SERVE ip")).await;
        return;
    }
    if let Ok(spec) = std::env::var("BENCH_RELAY") {
        run_relay(&spec).await;
        return;
    }
    let (z, full) = Sizes::from_env();
    let log = std::env::var("BENCH_LOG").unwrap_or_else(|_| "info".into());
    let idle = idle_that_fits(z.idle);
    let (mut running, pairs, _servers) = start_pairs(&log).await;
    for p in &pairs {
        wait_listening(&p.ns(), SocketAddr::from((p.server_ip, CLOSE)));
    }
    // Warm every path up once (certificates, pooled HBONE connections, plugin instances).
    for p in &pairs {
        let failed = p.warm_up();
        if failed > 0 {
            let logs = p
                .running
                .map(|i| running[i].log_tails())
                .unwrap_or_default();
            panic!(
                "warm-up: {failed} connections through {} failed; the path does not work:\n{logs}",
                p.name
            );
        }
    }
    println!(
        "weft mesh bench: two netns nodes per pair, capture -> HBONE/mTLS -> node B; {}",
        z.describe(full)
    );
    if part("mem") && idle > 0 {
        memory(&pairs, idle);
    }
    let n = pairs.len();
    let mut results: Vec<Vec<Round>> = vec![Vec::new(); n];
    let shadowed = node_b(&pairs, &running, "weft-shadow");
    let before = match shadowed {
        Some(node) => Some(shadow::figures(node).await),
        None => None,
    };
    for r in 0..z.rounds {
        for (i, figures) in round(&pairs, z, r).into_iter().enumerate() {
            results[i].push(figures);
        }
    }
    if let (Some(node), Some(before)) = (shadowed, before) {
        check_shadow(&pairs, &running, node, before).await;
    }
    report(&pairs, &results, RATIOS);
    for r in running.iter_mut() {
        match r {
            Running::Weft(m) => {
                m.a.terminate(Duration::from_secs(5)).await;
                m.b.terminate(Duration::from_secs(5)).await;
            }
            Running::Ztunnel(z) => z.stop().await,
            Running::Relay(_) => {}
        }
    }
}
