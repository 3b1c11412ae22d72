//! A live handover between Istio's real ztunnel and weft on one node, both ways (issue #43): pods with steady
//! traffic, the new proxy started in in-pod mode against the same CNI agent, the old one stopped with SIGTERM.
//!
//! The node (node A) has client and server pods and is served first by one proxy, then by the other; a second node
//! (node B), served by weft throughout, has a client and a server too, so traffic crosses the handover node in every
//! direction (outbound from its pods on 15001, HBONE into them on 15008, between the two proxies over HBONE). The
//! CNI agent ([`weft_conformance::cni::Agent`]) does what istio-cni's node agent does (istio/istio
//! `cni/pkg/nodeagent/ztunnelserver.go` at 86c9f01fd735fb01d8192f5bcaf0d424afb7f14c): a snapshot of every pod to each
//! proxy that connects, new pods to the newest connection, deletes to all. So a second proxy on the node receives
//! every pod in its snapshot and opens its listeners in each pod beside the first one's: both set `SO_REUSEPORT`
//! (ztunnel's `INPOD_PORT_REUSE`, true by default, in its `src/inpod/config.rs`; weft's `--inpod-port-reuse`), bind
//! the same wildcard (`[::]` where the pod has IPv6) and run as the same user, so the kernel puts them in one group
//! per port and spreads new connections over both. The old proxy then gets SIGTERM: it stops accepting (its
//! listeners leave the groups; `net.ipv4.tcp_migrate_req`, which weft turns on in each pod, hands connections still
//! queued on them to the new proxy's) and keeps the connections it has until its drain deadline (ztunnel's
//! `CONNECTION_TERMINATION_DEADLINE`, weft's `--drain-deadline`), then exits.
//!
//! Some losses are ztunnel's own, not the handover's: they happen in a rollout of ztunnel itself (the comparison
//! test, ztunnel → ztunnel) and the tests name them, with the log line that proves each, instead of counting them:
//! - drain race: when ztunnel drains, its HBONE server sends GOAWAY and stops accepting streams (its
//!   `src/proxy/h2/server.rs`: `graceful_shutdown()`, then only `poll_closed`), so a CONNECT already on its way
//!   on a pooled connection at that instant is neither served nor refused: it waits until the drain deadline cuts
//!   the connection;
//! - GOAWAY not retried: ztunnel's HBONE client opens a stream on a pooled connection without retrying it
//!   elsewhere when the h2 layer refuses it because the peer's GOAWAY has just arrived (its
//!   `src/proxy/h2/client.rs`, `internal_send`), so a connection it proxies at the instant the old proxy (weft
//!   or ztunnel) starts draining fails at once;
//! - listener reset: ztunnel does not turn on `net.ipv4.tcp_migrate_req`, so in a pod weft never served, closing
//!   a ztunnel listener resets the connections queued on it.
//!
//! As in a cluster, each ztunnel runs in a network namespace of its own (its pod's), with the CA it asks for the
//! pods' certificates (`weft-ca`, trusting ztunnel's account `istio-system/ztunnel` as a node agent, so it may ask
//! for the identities of node A's workloads); weft runs in node A's namespace and signs from the same CA's files.
//! Needs root and `ZTUNNEL_BIN` (a ztunnel built from its public source); without it each test prints why and passes.
#![allow(clippy::unwrap_used)] // a test panics to fail

#[path = "ztunnel_handover/bed.rs"]
mod bed;
mod inpod_common;
#[path = "ztunnel_handover/traffic.rs"]
mod traffic;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bed::*;
use inpod_common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use traffic::*;
use weft_conformance::ztunnel::{NsProcess, ztunnel_binary};
use weft_devmesh::netns::Netns;

/// Both proxies' drain deadline: short, so the test is quick, but long enough to tell from an early close.
const DRAIN: Duration = Duration::from_secs(3);
/// How long one short connection's round trip may take before it counts as failed.
const HUNG: Duration = Duration::from_secs(10);
/// How often a long-lived connection carries a ping (traffic, not a wait).
const PING_EVERY: Duration = Duration::from_millis(50);

/// ztunnel first, weft takes over: ztunnel's SIGTERM loses no connection to the handover.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ztunnel_to_weft_loses_no_connection() {
    handover(Kind::Ztunnel, Kind::Weft, "zh", 226, true).await;
}

/// weft first, ztunnel takes over (a rollback): weft's SIGTERM loses no connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weft_to_ztunnel_loses_no_connection() {
    handover(Kind::Weft, Kind::Ztunnel, "hz", 227, true).await;
}

/// For comparison, ztunnel's own rollout (ztunnel → ztunnel) with the same traffic and the same checks, except
/// that failures are printed, not asserted: they show ztunnel's own losses (module doc) without weft.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ztunnel_to_ztunnel_for_comparison() {
    handover(Kind::Ztunnel, Kind::Ztunnel, "zz", 228, false).await;
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Weft,
    Ztunnel,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Weft => "weft",
            Kind::Ztunnel => "ztunnel",
        }
    }
}

/// Hand node A over from `old_kind` to `new_kind` under traffic; with `strict`, no failure that is not one of
/// ztunnel's own losses may happen.
async fn handover(old_kind: Kind, new_kind: Kind, tag: &str, net: u8, strict: bool) {
    let bin = match ztunnel_binary() {
        Ok(b) => b,
        Err(why) => {
            eprintln!("skipped: {why}");
            return;
        }
    };
    let bed = Bed::new(tag, net, bin).await;
    let (old_name, new_name) = (old_kind.name(), new_kind.name());
    let mut old = bed.start(old_kind, 0, &format!("{old_name}-a-old")).await;

    let tally = Arc::new(Mutex::new(Tally::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let mut threads = Vec::new();
    for c in &bed.clients {
        // Node B's client goes to node A's servers only (the handover node), node A's clients to every server.
        let servers: Vec<_> = if c.name.ends_with("b1") {
            bed.servers[..2].to_vec()
        } else {
            bed.servers.clone()
        };
        threads.push(steady_client(c, servers, tally.clone(), stop.clone()));
    }
    let mut longs = Vec::new();
    for (c, s) in [(0, 1), (0, 2), (1, 0), (2, 0), (2, 1)] {
        let (rec, h) = long_lived(&bed.clients[c], bed.servers[s], stop.clone()).await;
        longs.push(rec);
        threads.push(h);
    }
    let more = |n: u64| {
        let tally = tally.clone();
        async move {
            let target = tally.lock().unwrap().ok + n;
            eventually(WAIT, "steady client progress", || {
                let ok = tally.lock().unwrap().ok;
                async move { (ok >= target).then_some(()) }
            })
            .await
        }
    };
    more(100).await;
    let served_by_old_before = old.served();

    // The new proxy joins; both serve.
    let pings_at_start = pings(&longs);
    let t0 = Instant::now();
    let new = bed.start(new_kind, 1, &format!("{new_name}-a-new")).await;
    let new_ready = t0.elapsed();
    // Both proxies listen in every pod of node A: one listener each per port, in the same SO_REUSEPORT group.
    let mut overlap = String::new();
    for pod in bed.clients[..2].iter().chain(&bed.server_pods[..2]) {
        let ls = proxy_listeners(pod);
        for port in [":15001", ":15006", ":15008"] {
            let owners: Vec<&(String, String)> =
                ls.iter().filter(|(a, _)| a.ends_with(port)).collect();
            let names: Vec<&str> = owners.iter().map(|(_, n)| n.as_str()).collect();
            assert!(
                owners.len() == 2
                    && names.contains(&old_name)
                    && names.contains(&new_name)
                    && owners[0].0 == owners[1].0,
                "{}: during the overlap, port {port} should have one listener of each proxy on the same \
                 address: {ls:?}",
                pod.name
            );
        }
        if overlap.is_empty() {
            overlap = format!("{}: {ls:?}", pod.name);
        }
    }
    more(100).await;
    // Every long-lived connection carries data while both proxies serve.
    eventually(
        WAIT,
        "long-lived connections' pings during the overlap",
        || {
            let now = pings(&longs);
            let moved = now.iter().zip(&pings_at_start).all(|(n, s)| n > s);
            async move { moved.then_some(()) }
        },
    )
    .await;
    let pings_at_sigterm = pings(&longs);

    // The old one goes.
    let t1 = Instant::now();
    let old_exit = old.stop(WAIT).await;
    let taken_over = t0.elapsed();
    more(100).await;
    let served_by_new = new.served();
    stop.store(true, Ordering::Relaxed);
    for h in threads {
        tokio::task::spawn_blocking(move || h.join())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
    }
    let pings_at_end = pings(&longs);

    let t = tally.lock().unwrap();
    let attempted = t.ok + t.failed.len() as u64;
    let label = format!("{old_name} -> {new_name}");
    let since_sigterm = |i: Instant| {
        let ms = |i: Instant| i.saturating_duration_since(t0).as_millis() as i64;
        format!("SIGTERM{:+} ms", ms(i) - ms(t1))
    };
    let logs = ProxyLogs {
        old: old.log_text(),
        new: new.log_text(),
        weft_b: std::fs::read_to_string(&bed.weft_b.log_path).unwrap_or_default(),
    };
    let (mut races, mut lost) = (Vec::new(), Vec::new());
    for f in &t.failed {
        let from = f.local.map(|a| format!(", from {a}")).unwrap_or_default();
        let line = format!("{} (at {}{from})", f.what, since_sigterm(f.at));
        match bed.ztunnel_loss(f, old_kind, &logs, t1) {
            Some(evidence) => races.push(format!("{line}; {evidence}")),
            None => lost.push(line),
        }
    }
    println!(
        "handover {label}: {attempted} connections attempted, {} failed: {} to the handover {lost:?}, {} to \
         ztunnel's own behaviour",
        t.failed.len(),
        lost.len(),
        races.len()
    );
    for r in &races {
        println!("handover {label}: ztunnel's own: {r}");
    }
    if let Some((took, what, at)) = &t.slowest {
        println!(
            "handover {label}: slowest connection that worked {took:?} ({what}, started at {})",
            since_sigterm(*at)
        );
    }
    println!("handover {label}: listeners during the overlap, {overlap}");
    println!(
        "handover {label}: new proxy ready (listeners in every pod) {new_ready:?} after its start; old proxy \
         exited {old_exit:?} after SIGTERM (drain deadline {DRAIN:?}); node taken over {taken_over:?} after the \
         new proxy's start; connections logged: old {served_by_old_before}+ before the overlap, new {served_by_new}"
    );
    if !lost.is_empty() {
        // Keep the logs of a run with failures not named as ztunnel's own, to see what they were.
        let keep = std::env::temp_dir().join(format!("weft-handover-{tag}-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&keep);
        for e in std::fs::read_dir(bed.dir.path()).unwrap().flatten() {
            if e.path().extension().is_some_and(|x| x == "log") {
                let _ = std::fs::copy(e.path(), keep.join(e.file_name()));
            }
        }
        println!("handover {label}: logs kept in {}", keep.display());
    }
    let mut early = Vec::new();
    for (i, l) in longs.iter().enumerate() {
        let broke = l.broke.lock().unwrap().clone();
        let lifetime = broke
            .as_ref()
            .map(|(at, why)| format!("closed {:?} after SIGTERM ({why})", at.duration_since(t1)));
        println!(
            "handover {label}: long-lived {}: {} pings ({} before the new proxy, {} before SIGTERM), {}",
            l.what,
            pings_at_end[i],
            pings_at_start[i],
            pings_at_sigterm[i],
            lifetime.as_deref().unwrap_or("still up")
        );
        if let Some((at, why)) = broke
            && at < t1 + DRAIN
        {
            early.push(format!(
                "{} closed {:?} after SIGTERM: {why}",
                l.what,
                at.duration_since(t1)
            ));
        }
    }

    assert!(
        old_exit.is_some(),
        "the old proxy ({old_name}) did not exit within {WAIT:?} of SIGTERM:\n{}",
        old.log_tail()
    );
    assert!(
        served_by_new > 0,
        "the new proxy ({new_name}) served nothing:\n{}",
        new.log_tail()
    );
    assert!(attempted >= 300, "too few connections: {attempted}");
    assert!(
        !strict || lost.is_empty(),
        "connections failed across the handover {label}: {} of {attempted} ({lost:?})",
        lost.len()
    );
    assert!(
        early.is_empty(),
        "long-lived connections closed before the old proxy's drain deadline ({DRAIN:?}): {early:?}"
    );
    for (i, l) in longs.iter().enumerate() {
        assert!(
            pings_at_sigterm[i] > pings_at_start[i] && pings_at_end[i] > pings_at_sigterm[i],
            "long-lived {} carried no data while both proxies served or while the old one drained: {} pings \
             before the new proxy, {} at SIGTERM, {} in all",
            l.what,
            pings_at_start[i],
            pings_at_sigterm[i],
            pings_at_end[i]
        );
    }
    drop(new);
    drop(bed);
}
