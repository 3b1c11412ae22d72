//! What the bench prints: medians with their spread, the memory case's table and the per-round ratios.

use std::time::Instant;

use super::probes::{IDLE_CPU_WINDOW, anon_kib, hold_idle, pct, rss_kib};
use super::rounds::{Pair, Round};

/// Median and spread (min, max) of the finite values of a sample.
fn stats(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.retain(|x| x.is_finite());
    if v.is_empty() {
        return (f64::NAN, f64::NAN, f64::NAN);
    }
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

/// `median (min-max)`, or `-` where the figure does not apply (e.g. proxy CPU on the direct path).
fn fmt_stats(v: Vec<f64>, prec: usize) -> String {
    let (m, lo, hi) = stats(v);
    if m.is_nan() {
        return "-".into();
    }
    format!("{m:.prec$} ({lo:.prec$}-{hi:.prec$})")
}

/// The idle-connection memory case, pair by pair.
pub(crate) fn memory(pairs: &[Pair], idle: usize) {
    println!(
        "idle memory (after one warm-up; then {idle} idle connections held through the pair), MiB; per connection, bytes:"
    );
    let mut per_conn = Vec::new();
    // The relay's per-connection buffers are sized for throughput (two of relay::BUF), not memory: not a yardstick
    // for this case.
    for p in pairs.iter().filter(|p| !p.bypass && p.name != "relay") {
        // CPU an idle pair burns on its own (timers, tickers, housekeeping), over a short quiet window.
        let (c0, t0) = (p.cpu(), Instant::now());
        std::thread::sleep(IDLE_CPU_WINDOW);
        let idle_cpu = (p.cpu() - c0) / 1e6 / t0.elapsed().as_secs_f64();
        let before = (rss_kib(p.pids.0), rss_kib(p.pids.1));
        let anon = (anon_kib(p.pids.0), anon_kib(p.pids.1));
        let (ip, pids) = (p.server_ip, p.pids);
        let setup_n = (idle / 20).clamp(20, 1000);
        let mut h = p.in_a(move || hold_idle(ip, idle, pids, setup_n));
        let held = h.rss;
        h.setup.sort_by(f64::total_cmp);
        let setup = (pct(&h.setup, 50), pct(&h.setup, 99));
        let per =
            |after: u64, before: u64| after.saturating_sub(before) as f64 * 1024.0 / idle as f64;
        let mib = |k: u64| k as f64 / 1024.0;
        println!(
            "  {:11} idle CPU A+B {idle_cpu:5.2} ms/s | idle RSS A {:6.1}  B {:6.1} (anon A {:5.1}  B {:5.1}) | holding {idle}: A {:6.1}  B {:6.1} | per connection A {:6.0}  B {:6.0} | new connection while holding, 1st byte p50 {:5.0} p99 {:5.0} us",
            p.name,
            mib(before.0),
            mib(before.1),
            mib(anon.0),
            mib(anon.1),
            mib(held.0),
            mib(held.1),
            per(held.0, before.0),
            per(held.1, before.1),
            setup.0,
            setup.1,
        );
        per_conn.push((
            p.name,
            before.0 + before.1,
            per(held.0, before.0) + per(held.1, before.1),
            anon.0 + anon.1,
            setup,
        ));
    }
    let find = |n: &str| per_conn.iter().find(|(name, ..)| *name == n);
    for w in ["weft", "weft-pol", "weft-shadow", "weft-np", "weft-base"] {
        if let (Some(w), Some(z)) = (find(w), find("ztunnel")) {
            println!(
                "  {} / ztunnel: idle RSS (A+B) {:.2} (anon {:.2})   per idle connection (A+B) {:.2}   new connection while holding p50 {:.2} p99 {:.2}",
                w.0,
                w.1 as f64 / z.1 as f64,
                w.3 as f64 / z.3 as f64,
                w.2 / z.2,
                w.4.0 / z.4.0,
                w.4.1 / z.4.1
            );
        }
    }
}

/// The table of medians per pair, then the paired ratios `ratios` (numerator, denominator) of the pairs that ran.
pub(crate) fn report(pairs: &[Pair], results: &[Vec<Round>], ratios: &[(&str, &str)]) {
    let col = |i: usize, f: fn(&Round) -> f64| results[i].iter().map(f).collect::<Vec<_>>();
    println!(
        "{:13} | {:20} | {:20} | {:20} | {:20} | {:20} | {:16} | {:16} | {:16} | {:16} | {:16} | {:16} | {:16}",
        "pair",
        "bulk Gb/s",
        "bulk down Gb/s",
        "flow Gb/s",
        "flow down Gb/s",
        "new conn/s",
        "CPU us/conn A+B",
        "RTT p50 us",
        "RTT p99 us",
        "1st byte p50 us",
        "1st byte p99 us",
        "CPU ms/GiB A+B",
        "bulk: idle %"
    );
    for (i, p) in pairs.iter().enumerate() {
        let failed: u64 = results[i].iter().map(|r| r.failed).sum();
        println!(
            "{:13} | {:20} | {:20} | {:20} | {:20} | {:20} | {:16} | {:16} | {:16} | {:16} | {:16} | {:16} | {:16}{}",
            p.name,
            fmt_stats(col(i, |r| r.gbps), 2),
            fmt_stats(col(i, |r| r.down_gbps), 2),
            fmt_stats(col(i, |r| r.flow_up), 2),
            fmt_stats(col(i, |r| r.flow_down), 2),
            fmt_stats(col(i, |r| r.cps), 0),
            fmt_stats(col(i, |r| r.cpu_conn_us), 0),
            fmt_stats(col(i, |r| r.p50), 0),
            fmt_stats(col(i, |r| r.p99), 0),
            fmt_stats(col(i, |r| r.setup50), 0),
            fmt_stats(col(i, |r| r.setup99), 0),
            fmt_stats(col(i, |r| r.cpu_gib_ms), 0),
            fmt_stats(col(i, |r| r.bulk_idle), 1),
            if failed > 0 {
                format!("  ({failed} connections failed)")
            } else {
                String::new()
            }
        );
    }
    let idx = |name: &str| pairs.iter().position(|p| p.name == name);
    let ratio = |a: usize, b: usize, f: fn(&Round) -> f64| {
        results[a]
            .iter()
            .zip(&results[b])
            .map(|(x, y)| f(x) / f(y))
            .collect::<Vec<_>>()
    };
    println!(
        "ratios per round, median (min-max) (bulk, flow and conn/s: higher is better; the rest: lower is better):"
    );
    for &(a, b) in ratios {
        let (Some(i), Some(j)) = (idx(a), idx(b)) else {
            continue;
        };
        println!(
            "  {:22} bulk {}   down {}   flow {}   flow down {}   conn/s {}   CPU/conn {}   RTT p50 {}   RTT p99 {}   1st byte p50 {}",
            format!("{a} / {b}"),
            fmt_stats(ratio(i, j, |r| r.gbps), 3),
            fmt_stats(ratio(i, j, |r| r.down_gbps), 3),
            fmt_stats(ratio(i, j, |r| r.flow_up), 3),
            fmt_stats(ratio(i, j, |r| r.flow_down), 3),
            fmt_stats(ratio(i, j, |r| r.cps), 3),
            fmt_stats(ratio(i, j, |r| r.cpu_conn_us), 3),
            fmt_stats(ratio(i, j, |r| r.p50), 3),
            fmt_stats(ratio(i, j, |r| r.p99), 3),
            fmt_stats(ratio(i, j, |r| r.setup50), 3),
        );
    }
}
