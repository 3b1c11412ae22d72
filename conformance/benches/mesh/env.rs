//! What a run of a side-by-side bench is asked for (the mesh bench's and the in-pod bench's): full or smoke sizes,
//! the parts and pairs selected, the open-file limit, and the never-matching policy of the `weft-pol` pairs.

use std::time::Duration;

/// The `weft-pol` pair's policy: a DENY on the server's namespace for a port nothing uses, so every connection to
/// the server is in istio-authz's scope, decided by the plugin, and allowed.
pub(crate) const POLICY_NEVER_MATCHING: &str = r#"policies:
- name: deny-port-1
  namespace: default
  scope: Namespace
  action: Deny
  rules:
  - - - destinationPorts: [1]
"#;

/// Sizes of one run.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Sizes {
    pub(crate) rounds: usize,
    pub(crate) mib: u64,
    pub(crate) window: Duration,
    pub(crate) conc: usize,
    pub(crate) lat_n: usize,
    pub(crate) idle: usize,
    /// How long each time-bounded flow of the `flow` part lasts (iperf3-style: a new connection, its slow start and
    /// buffer growth included).
    pub(crate) flow: Duration,
}

/// Whether this is a full run: `cargo bench` (which passes `--bench`) or `BENCH_FULL=1`; a smoke run otherwise.
pub(crate) fn full() -> bool {
    std::env::args().any(|a| a == "--bench") || std::env::var("BENCH_FULL").is_ok_and(|v| v == "1")
}

/// The number in the environment variable `k` (finite, not negative), or `full_v` in a full run and `smoke_v` in a
/// smoke run.
pub(crate) fn num(k: &str, full_v: f64, smoke_v: f64) -> f64 {
    std::env::var(k)
        .ok()
        .and_then(|v| v.parse::<f64>().ok())
        .filter(|v| v.is_finite() && *v >= 0.0)
        .unwrap_or(if full() { full_v } else { smoke_v })
}

impl Sizes {
    /// Full sizes under `cargo bench` or with `BENCH_FULL=1`, a smoke run otherwise; each overridden by its
    /// variable. Also whether the run is a full one.
    pub(crate) fn from_env() -> (Self, bool) {
        let sizes = Self {
            rounds: (num("BENCH_ROUNDS", 5.0, 1.0) as usize).max(1),
            mib: (num("BENCH_MIB", 2048.0, 8.0) as u64).max(1),
            window: Duration::from_secs_f64(num("BENCH_SECS", 3.0, 0.3)),
            conc: (num("BENCH_CONC", 16.0, 16.0) as usize).max(1),
            lat_n: (num("BENCH_LAT_N", 5000.0, 200.0) as usize).max(10),
            idle: num("BENCH_IDLE", 10_000.0, 100.0) as usize,
            flow: Duration::from_secs_f64(num("BENCH_FLOW_SECS", 7.0, 0.2).max(0.05)),
        };
        (sizes, full())
    }
}

impl Sizes {
    /// What a run does, for its heading: "{rounds} alternating rounds of … RTT samples", and full or smoke.
    pub(crate) fn describe(&self, full: bool) -> String {
        format!(
            "{}; {} alternating rounds of {} MiB bulk, {:?} x {} connectors, {} RTT samples; median (min-max) over \
             rounds",
            if full { "full" } else { "smoke run" },
            self.rounds,
            self.mib,
            self.window,
            self.conc,
            self.lat_n,
        )
    }
}

/// Whether the part `what` is to run (`BENCH_ONLY` unset: every part).
pub(crate) fn part(what: &str) -> bool {
    std::env::var("BENCH_ONLY").map_or(true, |v| v.split(',').any(|p| p.trim() == what))
}

/// Whether the pair `name` is to start (`BENCH_PAIRS` unset: every available one).
pub(crate) fn wanted(name: &str) -> bool {
    std::env::var("BENCH_PAIRS").map_or(true, |v| v.split(',').any(|p| p.trim() == name))
}

/// Raises the open-file limit for holding `idle` idle connections (and everything else a run opens) and returns
/// how many it can hold: `idle`, or fewer (said on stdout) when the limit cannot go high enough.
pub(crate) fn idle_that_fits(idle: usize) -> usize {
    let nofile = weft_conformance::load::raise_nofile((idle as u64 * 4).max(65_536));
    if idle as u64 + 4096 > nofile {
        let fit = nofile.saturating_sub(4096) as usize;
        println!(
            "open-file limit {nofile}: holding {idle} idle connections needs more; holding {fit}"
        );
        fit
    } else {
        idle
    }
}
