//! weft side by side with Istio's ztunnel in in-pod mode (Istio ambient's model, issue #48): each pair is two nodes
//! (network namespaces) with a client pod and a server pod on node A and a server pod on node B, every pod a network
//! namespace of its own with istio-cni's in-pod rules, and one proxy per node serving its node's pods over ZDS from
//! a CNI node agent ([`weft_conformance::inpodpair`]): weft in the node's namespace, ztunnel in a namespace of its
//! own (its pod's in a cluster) with its certificates from `weft-ca`. A connection from the client pod is captured
//! inside the pod to the proxy's 15001 there, carried over mTLS HBONE to the server pod's 15008 (node B's proxy,
//! for the cross-node path; the same proxy, for the same-node path) and handed to the server from inside its pod.
//! Client, servers and every proxy share the machine's cores.
//!
//! Pairs: `weft` (its default plugins; no policy, so istio-authz's scope leaves every connection out), `weft-pol`
//! (the same with a namespace DENY policy that never matches: istio-authz decides every connection), and `ztunnel`
//! when `ZTUNNEL_BIN` names a ztunnel built from its public source (without it the bench says why and runs weft
//! only: CI has none). Each pair has its own namespaces and addresses and all stay up together; the cross-node path
//! of a pair is measured as `<pair>` (client pod on A to the server pod on B: both proxies' CPU), the same-node path
//! as `<pair>-same` (client pod on A to the server pod on A: node A's proxy only; `BENCH_SAME_NODE=0` leaves it out).
//! There is no direct path: a pod's inbound capture takes every unmarked connection, and a mark does not cross the
//! veth into the server pod.
//!
//! The measurements are the mesh bench's, by its own code (`benches/mesh/rounds.rs`, `probes.rs`, `output.rs`,
//! `env.rs`, included here): one-flow bulk throughput both ways, new connections/s, keep-alive 1-byte round trips
//! p50/p99, a new connection's time to first byte, the proxies' CPU per connection and per GiB
//! (`/proc/<pid>/task/*/schedstat`), and first, on fresh processes, idle CPU, idle RSS and RSS per idle connection
//! (`BENCH_IDLE` held, cross-node paths only); each part cut into slices the paths take in turn, in an order shuffled
//! per slice; ratios per round (`weft / ztunnel` and others), median and range over rounds.
//!
//! The per-pod part (`pods`, last; `inpod/pods.rs`): `BENCH_PODS` more pods, declared in the mesh file from the
//! start, are created on node A of each pair and handed to its proxy one at a time through the CNI agent
//! (`AddWorkload` with the pod's namespace), the pairs taking turns pod by pod. Per pod: the time from the
//! `AddWorkload` sent to its ack, and to the pod serving: the first connection from inside the new pod through its
//! own outbound capture (the proxy's 15001 in that pod) to the server pod on node A that carries a byte there and
//! back (it goes over HBONE through the proxy's 15008 in the server pod). A prober in the new pod retries every
//! 200 µs from before the `AddWorkload` (refused while no listener is there), so the figure is the same real
//! event for both proxies, to about 0.2 ms. Then node A's proxy's RSS and thread count (`/proc/<pid>/task`) after
//! the last pod, less before the first, over the pods: the memory and threads a pod costs.
//!
//! Run for figures (root; release weft and weft-ca; ztunnel built from its public source):
//!   cargo build --release -p weft -p weft-control
//!   WEFT_BIN=$PWD/target/release/weft ZTUNNEL_BIN=/path/to/ztunnel BENCH_FULL=1 cargo test -p weft-conformance \
//!     --bench inpod --config 'profile.dev.package.weft-conformance.opt-level=3' -- --nocapture
//! Without `--bench` on its command line and without `BENCH_FULL=1` it is a smoke run: one round of tiny sizes, every
//! path and part once. Environment as the mesh bench's (BENCH_ROUNDS, BENCH_MIB, BENCH_SECS, BENCH_CONC,
//! BENCH_LAT_N, BENCH_IDLE, BENCH_LOG, BENCH_PAIRS of `weft`, `weft-pol`, `ztunnel`), plus BENCH_PODS (100 / 5),
//! BENCH_SAME_NODE (1; 0 skips the same-node paths), BENCH_FLOW_SECS, and BENCH_ONLY, a comma list of `mem`,
//! `bulk`, `flow`, `cps`, `lat`, `pods`.
#![allow(clippy::unwrap_used)] // a bench panics to fail

use std::net::SocketAddr;
use std::time::Duration;

use weft_conformance::inpodpair::{InpodPair, MAX_SPARES, PairOptions, ProxyKind};
use weft_conformance::ztunnel::ztunnel_binary;
use weft_devmesh::netns::Netns;

#[path = "mesh/env.rs"]
mod env;
#[path = "mesh/output.rs"]
mod output;
#[path = "inpod/pods.rs"]
mod pods;
#[path = "mesh/probes.rs"]
mod probes;
#[path = "mesh/rounds.rs"]
mod rounds;

use env::{POLICY_NEVER_MATCHING, Sizes, idle_that_fits, num, part, wanted};
use output::{memory, report};
use probes::{CLOSE, Servers, servers};
use rounds::{Pair, Round, round, wait_listening};

/// The ratios the report prints (numerator, denominator), where both ran.
const RATIOS: &[(&str, &str)] = &[
    ("weft", "ztunnel"),
    ("weft-pol", "ztunnel"),
    ("weft-same", "ztunnel-same"),
    ("weft-pol-same", "ztunnel-same"),
    ("weft-pol", "weft"),
    ("weft-pol-same", "weft-same"),
];

/// A running pair and the names of its two paths.
struct Started {
    name: &'static str,
    same: &'static str,
    pair: InpodPair,
}

/// Start the pairs asked for (each with `spares` spare pods declared on node A).
async fn start(log: &str, spares: usize) -> Vec<Started> {
    let mut started = Vec::new();
    let options = |proxy, mesh_extra: &str| PairOptions {
        proxy,
        log: log.to_owned(),
        mesh_extra: mesh_extra.to_owned(),
        spares,
    };
    for (name, same, tag, net, extra) in [
        ("weft", "weft-same", "bw", 200u8, ""),
        (
            "weft-pol",
            "weft-pol-same",
            "bp",
            201,
            POLICY_NEVER_MATCHING,
        ),
    ] {
        if !wanted(name) {
            continue;
        }
        let pair = InpodPair::start(tag, net, &options(ProxyKind::Weft, extra))
            .await
            .unwrap_or_else(|e| {
                panic!("the {name} pair (network namespaces need root, and a weft build): {e}")
            });
        started.push(Started { name, same, pair });
    }
    match ztunnel_binary() {
        Ok(bin) if wanted("ztunnel") => {
            let pair = InpodPair::start("bz", 202, &options(ProxyKind::Ztunnel(bin), ""))
                .await
                .unwrap_or_else(|e| panic!("the ztunnel pair (ZTUNNEL_BIN is set): {e}"));
            started.push(Started {
                name: "ztunnel",
                same: "ztunnel-same",
                pair,
            });
        }
        Ok(_) => println!("ztunnel pair skipped: not in BENCH_PAIRS"),
        Err(why) => println!("ztunnel pair skipped: {why}; running weft only"),
    }
    started
}

/// Waits until the servers in `pod` (address `ip`) accept connections, probed from inside the pod (marked, so the
/// pod's capture leaves the probe alone).
fn wait_servers(pod_ns: &str, ip: std::net::Ipv4Addr) {
    wait_listening(&Netns::existing(pod_ns), SocketAddr::from((ip, CLOSE)));
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    if let Ok(ip) = std::env::var("BENCH_SERVE") {
        servers(ip.parse().expect("BENCH_SERVE ip")).await;
        return;
    }
    let (z, full) = Sizes::from_env();
    let log = std::env::var("BENCH_LOG").unwrap_or_else(|_| "info".into());
    let n_pods = if part("pods") {
        (num("BENCH_PODS", 100.0, 5.0) as usize).min(MAX_SPARES)
    } else {
        0
    };
    let same_node = num("BENCH_SAME_NODE", 1.0, 1.0) != 0.0;
    let idle = idle_that_fits(z.idle);
    let mut started = start(&log, n_pods).await;
    // The paths: every pair's cross-node path first (the memory case takes those), then the same-node ones.
    let mut pairs = Vec::new();
    let mut servers = Vec::new();
    for (i, s) in started.iter().enumerate() {
        let p = &s.pair;
        for pod in [&p.server_b, &p.server_a] {
            servers.push(Servers::spawn(&pod.ns.name, pod.ip));
        }
        pairs.push(Pair {
            name: s.name,
            ns_a: p.client.ns.name.clone(),
            server_ip: p.server_b.ip,
            bypass: false,
            pids: (p.a.pid(), p.b.pid()),
            running: Some(i),
        });
    }
    let cross = pairs.len();
    if same_node {
        for (i, s) in started.iter().enumerate() {
            pairs.push(Pair {
                name: s.same,
                ns_a: s.pair.client.ns.name.clone(),
                server_ip: s.pair.server_a.ip,
                bypass: false,
                pids: (s.pair.a.pid(), None),
                running: Some(i),
            });
        }
    }
    for s in &started {
        for pod in [&s.pair.server_b, &s.pair.server_a] {
            wait_servers(&pod.ns.name, pod.ip);
        }
    }
    // Warm every path up once (certificates, pooled HBONE connections, plugin instances).
    for p in &pairs {
        let failed = p.warm_up();
        if failed > 0 {
            let s = &started[p.running.unwrap()].pair;
            panic!(
                "warm-up: {failed} connections through {} failed; the path does not work:\nnode A:\n{}\nnode B:\n{}",
                p.name,
                s.a.log_tail(20),
                s.b.log_tail(20)
            );
        }
    }
    println!(
        "weft in-pod bench: pods with istio-cni's rules, proxies in in-pod mode over ZDS; client pod -> capture in \
         the pod -> HBONE/mTLS -> server pod on node B (`<pair>`) or node A (`<pair>-same`); {}",
        z.describe(full)
    );
    if part("mem") && idle > 0 {
        memory(&pairs[..cross], idle);
    }
    if ["bulk", "cps", "lat"].into_iter().any(part) {
        let mut results: Vec<Vec<Round>> = vec![Vec::new(); pairs.len()];
        for r in 0..z.rounds {
            for (i, figures) in round(&pairs, z, r).into_iter().enumerate() {
                results[i].push(figures);
            }
        }
        report(&pairs, &results, RATIOS);
    }
    if n_pods > 0 {
        pods::per_pod(&mut started, n_pods).await;
    }
    for s in &mut started {
        s.pair.a.terminate(Duration::from_secs(5)).await;
        s.pair.b.terminate(Duration::from_secs(5)).await;
    }
    drop(servers);
}
