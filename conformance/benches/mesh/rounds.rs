//! One round of measurements through the pairs of a side-by-side bench (the mesh bench's and the in-pod bench's):
//! a pair as measured (where its client runs, which processes are its proxies), what it measured, and the slices
//! the pairs take in turn.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use weft_conformance::load::conn_rate;
use weft_conformance::netmesh::connect;
use weft_devmesh::netns::Netns;

use super::env::{Sizes, part};
use super::probes::{
    CLOSE, RR, SINK, SOURCE, bulk, bulk_down, cpu_ns, flow_down, flow_up, idle_percent, latency,
    machine_ticks, pct, setup_latency,
};

/// One proxy pair (or the direct path) as measured: where its client runs and which processes are its proxies.
pub(crate) struct Pair {
    pub(crate) name: &'static str,
    pub(crate) ns_a: String,
    pub(crate) server_ip: Ipv4Addr,
    pub(crate) bypass: bool,
    pub(crate) pids: (Option<u32>, Option<u32>),
    /// Its entry in the list of running pairs (none for direct).
    pub(crate) running: Option<usize>,
}

/// What one pair measured in one round (NaN: not measured, shown as `-`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Round {
    pub(crate) gbps: f64,
    /// One flow from the server to the client (a download), Gb/s.
    pub(crate) down_gbps: f64,
    /// Proxy CPU (A+B) per GiB, ms.
    pub(crate) cpu_gib_ms: f64,
    /// The machine's idle share (all cores) during the bulk transfer, %: how far the one-flow case is from
    /// being bound by CPU (a pipeline that waits on itself leaves cores idle however cheap each stage is).
    pub(crate) bulk_idle: f64,
    pub(crate) cps: f64,
    pub(crate) failed: u64,
    /// Proxy CPU (A+B) per connection, µs.
    pub(crate) cpu_conn_us: f64,
    pub(crate) p50: f64,
    pub(crate) p99: f64,
    /// New connection: connect to first byte back, µs.
    pub(crate) setup50: f64,
    pub(crate) setup99: f64,
    /// The time-bounded flows of the `flow` part (one each way per round), Gb/s.
    pub(crate) flow_up: f64,
    pub(crate) flow_down: f64,
}

impl Default for Round {
    fn default() -> Self {
        Self {
            gbps: f64::NAN,
            down_gbps: f64::NAN,
            cpu_gib_ms: f64::NAN,
            bulk_idle: f64::NAN,
            cps: f64::NAN,
            failed: 0,
            cpu_conn_us: f64::NAN,
            p50: f64::NAN,
            p99: f64::NAN,
            setup50: f64::NAN,
            setup99: f64::NAN,
            flow_up: f64::NAN,
            flow_down: f64::NAN,
        }
    }
}

impl Pair {
    pub(crate) fn ns(&self) -> Netns {
        Netns::existing(&self.ns_a)
    }

    /// CPU time (ns) both proxies have used so far; NaN for the direct path (no proxy, the figure does not apply).
    pub(crate) fn cpu(&self) -> f64 {
        if self.pids == (None, None) {
            return f64::NAN;
        }
        (cpu_ns(self.pids.0) + cpu_ns(self.pids.1)) as f64
    }

    /// Run `f`'s future in node A's namespace, on its own thread.
    pub(crate) fn in_a<F, Fut, T>(&self, f: F) -> T
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = T>,
        T: Send + 'static,
    {
        self.ns().run(f).join().expect("bench thread").unwrap()
    }

    /// One slice of the one-flow case (`bulk` part): `mib` up, then `mib` down, each on a new connection, added to
    /// `t`.
    pub(crate) fn bulk_slice(&self, mib: u64, t: &mut Tally) {
        let (ip, bypass) = (self.server_ip, self.bypass);
        let c0 = self.cpu();
        let t0 = machine_ticks();
        t.up_secs += self.in_a(move || bulk(SocketAddr::from((ip, SINK)), bypass, mib << 20));
        t.up_cpu_ns += self.cpu() - c0;
        let t1 = machine_ticks();
        t.up_ticks.0 += t1.0.saturating_sub(t0.0);
        t.up_ticks.1 += t1.1.saturating_sub(t0.1);
        t.up_mib += mib;
        t.down_secs +=
            self.in_a(move || bulk_down(SocketAddr::from((ip, SOURCE)), bypass, mib << 20));
        t.down_mib += mib;
    }

    /// One warm-up through the pair (certificates, pooled HBONE connections, plugin instances): 300 ms of new
    /// connections, four at a time; how many failed.
    pub(crate) fn warm_up(&self) -> u64 {
        let (ip, bypass) = (self.server_ip, self.bypass);
        let (_, failed, _) = self.in_a(move || {
            conn_rate(
                SocketAddr::from((ip, CLOSE)),
                bypass,
                Duration::from_millis(300),
                4,
            )
        });
        failed
    }

    /// The `flow` part: one time-bounded flow each way, added to `t`.
    pub(crate) fn flow_slice(&self, secs: Duration, t: &mut Tally) {
        let (ip, bypass) = (self.server_ip, self.bypass);
        t.flow_up
            .push(self.in_a(move || flow_up(SocketAddr::from((ip, SINK)), bypass, secs)));
        t.flow_down
            .push(self.in_a(move || flow_down(SocketAddr::from((ip, SOURCE)), bypass, secs)));
    }

    /// One slice of the connection-rate window (`cps` part), added to `t`.
    pub(crate) fn cps_slice(&self, window: Duration, conc: usize, t: &mut Tally) {
        let (ip, bypass) = (self.server_ip, self.bypass);
        let c0 = self.cpu();
        let (ok, failed, secs) =
            self.in_a(move || conn_rate(SocketAddr::from((ip, CLOSE)), bypass, window, conc));
        t.cpu_ns += self.cpu() - c0;
        t.ok += ok;
        t.failed += failed;
        t.secs += secs;
    }

    /// One slice of the latency case (`lat` part): `n` keep-alive round trips on a new connection and `n / 10`
    /// (at least one) new connections' times to first byte, added to `t`.
    pub(crate) fn lat_slice(&self, n: usize, t: &mut Tally) {
        let (ip, bypass) = (self.server_ip, self.bypass);
        let rtt = self.in_a(move || latency(SocketAddr::from((ip, RR)), bypass, n));
        t.rtt.extend(rtt);
        let m = (n / 10).max(1);
        let setup = self.in_a(move || setup_latency(SocketAddr::from((ip, CLOSE)), bypass, m));
        t.setup.extend(setup);
    }
}

/// What one pair gathers in one round, slice by slice, until [`Tally::finish`] turns it into its [`Round`].
#[derive(Default)]
pub(crate) struct Tally {
    up_mib: u64,
    up_secs: f64,
    /// Proxy CPU (A+B) over the uploads, ns.
    up_cpu_ns: f64,
    /// The machine's (idle, total) ticks over the uploads.
    up_ticks: (u64, u64),
    down_mib: u64,
    down_secs: f64,
    ok: u64,
    failed: u64,
    secs: f64,
    /// Proxy CPU (A+B) over the connection-rate slices, ns.
    cpu_ns: f64,
    rtt: Vec<f64>,
    setup: Vec<f64>,
    flow_up: Vec<f64>,
    flow_down: Vec<f64>,
}

impl Tally {
    pub(crate) fn finish(mut self) -> Round {
        let mut r = Round::default();
        let gbps = |mib: u64, secs: f64| (mib << 20) as f64 * 8.0 / secs / 1e9;
        if self.up_mib > 0 {
            r.gbps = gbps(self.up_mib, self.up_secs);
            r.cpu_gib_ms = self.up_cpu_ns / 1e6 / (self.up_mib as f64 / 1024.0);
            r.bulk_idle = idle_percent((0, 0), self.up_ticks);
            r.down_gbps = gbps(self.down_mib, self.down_secs);
        }
        if self.secs > 0.0 {
            r.cps = self.ok as f64 / self.secs;
            r.failed = self.failed;
            r.cpu_conn_us = self.cpu_ns / 1e3 / self.ok.max(1) as f64;
        }
        if !self.rtt.is_empty() {
            self.rtt.sort_by(f64::total_cmp);
            self.setup.sort_by(f64::total_cmp);
            (r.p50, r.p99) = (pct(&self.rtt, 50), pct(&self.rtt, 99));
            (r.setup50, r.setup99) = (pct(&self.setup, 50), pct(&self.setup, 99));
        }
        for (v, out) in [
            (&mut self.flow_up, &mut r.flow_up),
            (&mut self.flow_down, &mut r.flow_down),
        ] {
            v.sort_by(f64::total_cmp);
            if !v.is_empty() {
                *out = pct(v, 50);
            }
        }
        r
    }
}

/// The most one bulk slice moves each way (MiB), how long one connection-rate slice lasts at most, and how many
/// round trips one latency slice takes at most.
const BULK_SLICE_MIB: u64 = 512;
const CPS_SLICE: Duration = Duration::from_millis(500);
const LAT_SLICE: usize = 500;

/// The order in which `n` pairs take one slice: a shuffle drawn from `seed` (splitmix64, Fisher–Yates), so a run
/// is repeatable and, over many slices, every pair runs first, last and right after every other pair about equally
/// often (a rotation keeps each pair behind the same neighbour, and what a pair leaves behind, a fast transfer's
/// buffers or a burst of closing connections, would always fall on the same next one).
pub(crate) fn turn_order(n: usize, seed: u64) -> Vec<usize> {
    let mut state = seed;
    let mut next = move || {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    let mut order: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        let j = (next() % (i as u64 + 1)) as usize;
        order.swap(i, j);
    }
    order
}

/// One round through every pair. Each part is cut into slices (≤ [`BULK_SLICE_MIB`] each way, ≤ [`CPS_SLICE`],
/// ≤ [`LAT_SLICE`] round trips) and the pairs take turns slice by slice, in an order shuffled per slice, so the
/// figures two pairs are compared by were taken interleaved over the same few seconds: a load that comes and goes
/// on the machine lands on both alike instead of on whichever pair happened to run while it lasted.
pub(crate) fn round(pairs: &[Pair], z: Sizes, round: usize) -> Vec<Round> {
    let mut tallies: Vec<Tally> = (0..pairs.len()).map(|_| Tally::default()).collect();
    // Each slice's order is drawn from its own seed: the round in the high half, the slice's number in the low.
    let mut seed = (round as u64) << 32;
    if part("bulk") {
        let slices = z.mib.div_ceil(BULK_SLICE_MIB).max(1);
        take_turns(
            pairs,
            &mut tallies,
            &mut seed,
            slices as usize,
            |p, s, t| {
                // The last slice takes what is left, so a round moves exactly `z.mib` each way.
                let done = s as u64 * BULK_SLICE_MIB;
                p.bulk_slice(BULK_SLICE_MIB.min(z.mib - done), t);
            },
        );
    }
    if part("cps") {
        let slices = (z.window.as_secs_f64() / CPS_SLICE.as_secs_f64())
            .ceil()
            .max(1.0) as usize;
        let window = z.window / slices as u32;
        take_turns(pairs, &mut tallies, &mut seed, slices, |p, _, t| {
            p.cps_slice(window, z.conc, t);
        });
    }
    if part("lat") {
        let slices = z.lat_n.div_ceil(LAT_SLICE).max(1);
        take_turns(pairs, &mut tallies, &mut seed, slices, |p, _, t| {
            p.lat_slice(z.lat_n / slices, t);
        });
    }
    if part("flow") {
        take_turns(pairs, &mut tallies, &mut seed, 1, |p, _, t| {
            p.flow_slice(z.flow, t);
        });
    }
    tallies.into_iter().map(Tally::finish).collect()
}

/// `slices` slices of one part: in each, every pair in [`turn_order`] runs `measure(pair, slice, its tally)`.
fn take_turns(
    pairs: &[Pair],
    tallies: &mut [Tally],
    seed: &mut u64,
    slices: usize,
    mut measure: impl FnMut(&Pair, usize, &mut Tally),
) {
    for s in 0..slices {
        *seed += 1;
        for i in turn_order(pairs.len(), *seed) {
            measure(&pairs[i], s, &mut tallies[i]);
        }
    }
}

/// Waits until `addr` accepts direct connections from inside `ns` (the servers are up).
pub(crate) fn wait_listening(ns: &Netns, addr: SocketAddr) {
    let ok = ns
        .run(move || async move {
            let start = Instant::now();
            while start.elapsed() < Duration::from_secs(30) {
                if connect(addr, true).await.is_ok() {
                    return true;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            false
        })
        .join()
        .unwrap()
        .unwrap();
    assert!(ok, "servers at {addr} did not start");
}
