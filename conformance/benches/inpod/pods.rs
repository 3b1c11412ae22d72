//! The in-pod bench's per-pod part: pods handed to node A's proxy one at a time through the CNI agent, the time each
//! took to be acked and to serve, and the memory and threads a pod costs the proxy (method: `benches/inpod.rs`).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use weft_conformance::inpodpair::InpodPair;

use super::Started;
use super::probes::{CLOSE, pct, rss_kib};
use super::rounds::turn_order;

/// How long a pod may take to serve before the bench fails (an event wait: the floor, not the expected time).
const PATIENCE: Duration = Duration::from_secs(30);
/// The pause between two of the prober's attempts.
const PROBE_EVERY: Duration = Duration::from_micros(200);

/// Threads of process `pid` (`/proc/<pid>/task`); 0 if unknown.
fn threads(pid: Option<u32>) -> usize {
    pid.and_then(|p| std::fs::read_dir(format!("/proc/{p}/task")).ok())
        .map_or(0, |d| d.count())
}

/// One connection from the current namespace to `dst` through capture, a byte there and back.
fn exchange(dst: SocketAddr) -> std::io::Result<()> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect_timeout(&dst, Duration::from_secs(5))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    s.write_all(b"p")?;
    let mut b = [0u8; 1];
    s.read_exact(&mut b)?;
    Ok(())
}

/// Hands spare pod `i` of `pair` to node A's proxy: (ms to the ack, ms to serving), both from the `AddWorkload`
/// sent. A prober in the pod starts first (its first attempt refused: nothing listens yet) and retries every
/// [`PROBE_EVERY`] until a connection through the pod's capture to node A's server pod carries a byte both ways.
async fn add_one(pair: &InpodPair, i: usize) -> (f64, f64) {
    let pod = &pair.spares[i];
    let dst = SocketAddr::from((pair.server_a.ip, CLOSE));
    let (probing_tx, probing) = tokio::sync::oneshot::channel::<bool>();
    let prober = pod.ns.run(move || async move {
        let first = exchange(dst);
        let _ = probing_tx.send(first.is_err());
        let deadline = Instant::now() + PATIENCE;
        let mut last = first;
        while let Err(e) = last {
            if Instant::now() > deadline {
                return Err(format!("not serving after {PATIENCE:?}: {e}"));
            }
            std::thread::sleep(PROBE_EVERY);
            last = exchange(dst);
        }
        Ok(Instant::now())
    });
    assert!(
        probing.await.unwrap_or(false),
        "{}: a connection worked before the pod was handed to the proxy",
        pod.name
    );
    let t0 = Instant::now();
    let acked = pair.agent_a.add_pod(pod.agent_pod()).await;
    let ack = t0.elapsed();
    assert_eq!(
        acked,
        Ok(String::new()),
        "{}: the proxy's ack to AddWorkload:\n{}",
        pod.name,
        pair.a.log_tail(20)
    );
    let serving = tokio::task::spawn_blocking(move || prober.join())
        .await
        .unwrap()
        .unwrap()
        .unwrap()
        .unwrap_or_else(|e| panic!("{}: {e}:\n{}", pod.name, pair.a.log_tail(20)));
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    (ms(ack), ms(serving.saturating_duration_since(t0)))
}

/// What one pair's node A spent on the pods.
struct Cost {
    ack: Vec<f64>,
    serving: Vec<f64>,
    rss_kib: f64,
    threads: f64,
}

/// The per-pod part: `n` spare pods per pair, created first (not timed), then handed over one at a time, the pairs
/// taking turns pod by pod in a shuffled order; prints the figures and the ratios to ztunnel's.
pub(crate) async fn per_pod(started: &mut [Started], n: usize) {
    for s in started.iter_mut() {
        for _ in 0..n {
            s.pair.spare_pod().expect("a spare pod");
        }
    }
    let before: Vec<(u64, usize)> = started
        .iter()
        .map(|s| (rss_kib(s.pair.a.pid()), threads(s.pair.a.pid())))
        .collect();
    let mut times: Vec<(Vec<f64>, Vec<f64>)> = vec![(Vec::new(), Vec::new()); started.len()];
    for i in 0..n {
        for j in turn_order(started.len(), 0x9d0d_0000 + i as u64) {
            let (ack, serving) = add_one(&started[j].pair, i).await;
            times[j].0.push(ack);
            times[j].1.push(serving);
        }
    }
    let costs: Vec<Cost> = started
        .iter()
        .zip(before)
        .zip(times)
        .map(|((s, (rss0, th0)), (mut ack, mut serving))| {
            ack.sort_by(f64::total_cmp);
            serving.sort_by(f64::total_cmp);
            let pid = s.pair.a.pid();
            Cost {
                ack,
                serving,
                rss_kib: rss_kib(pid).saturating_sub(rss0) as f64 / n as f64,
                threads: (threads(pid) as f64 - th0 as f64) / n as f64,
            }
        })
        .collect();
    println!(
        "per pod ({n} pods added to node A one at a time through the CNI agent; times from AddWorkload sent, ms; \
         node A's proxy's RSS and threads after the last pod less before the first, per pod):"
    );
    println!(
        "  {:9} | {:8} | {:8} | {:12} | {:12} | {:11} | {:11} | {:7}",
        "pair",
        "ack p50",
        "ack p99",
        "serving p50",
        "serving p99",
        "RSS KiB/pod",
        "threads/pod",
        "threads"
    );
    for (s, c) in started.iter().zip(&costs) {
        println!(
            "  {:9} | {:8.2} | {:8.2} | {:12.2} | {:12.2} | {:11.0} | {:11.2} | {:7}",
            s.name,
            pct(&c.ack, 50),
            pct(&c.ack, 99),
            pct(&c.serving, 50),
            pct(&c.serving, 99),
            c.rss_kib,
            c.threads,
            threads(s.pair.a.pid()),
        );
    }
    let Some(z) = started.iter().position(|s| s.name == "ztunnel") else {
        return;
    };
    for (s, c) in started.iter().zip(&costs) {
        if s.name == "ztunnel" {
            continue;
        }
        let zc = &costs[z];
        let ratio = |a: f64, b: f64| a / b;
        println!(
            "  {} / ztunnel: ack p50 {:.3}  p99 {:.3}   serving p50 {:.3}  p99 {:.3}   RSS per pod {:.3}   threads per \
             pod {:.2} / {:.2}",
            s.name,
            ratio(pct(&c.ack, 50), pct(&zc.ack, 50)),
            ratio(pct(&c.ack, 99), pct(&zc.ack, 99)),
            ratio(pct(&c.serving, 50), pct(&zc.serving, 50)),
            ratio(pct(&c.serving, 99), pct(&zc.serving, 99)),
            ratio(c.rss_kib, zc.rss_kib),
            c.threads,
            zc.threads,
        );
    }
}
