//! The value types of `weft run`'s flags that are more than a number or a path: listeners (`ip:port` or `off`),
//! thread and shard counts (`auto` or a number), the modes and kinds, with their parsers. Each reads the same from
//! a flag, an env var and the config file (where it is written as on the command line).
// The doc comments of the enums' variants are clap's `--help` text: `[::1]` stays plain there.
#![allow(rustdoc::broken_intra_doc_links)]

use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// A listener address, or `off`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listen {
    /// Bind here.
    At(SocketAddr),
    /// Disabled.
    Off,
}

impl Listen {
    /// The address, unless off.
    pub fn addr(self) -> Option<SocketAddr> {
        match self {
            Listen::At(a) => Some(a),
            Listen::Off => None,
        }
    }
}

pub(crate) fn parse_listen(s: &str) -> Result<Listen, String> {
    if s == "off" {
        return Ok(Listen::Off);
    }
    s.parse()
        .map(Listen::At)
        .map_err(|e| format!("{s:?}: {e} (expected ip:port or off)"))
}

/// Where inbound HBONE listens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HboneListen {
    /// One address.
    At(SocketAddr),
    /// One listener per local workload IP.
    Workloads,
    /// Disabled.
    Off,
}

pub(crate) fn parse_hbone(s: &str) -> Result<HboneListen, String> {
    match s {
        "off" => Ok(HboneListen::Off),
        "workloads" => Ok(HboneListen::Workloads),
        _ => s
            .parse()
            .map(HboneListen::At)
            .map_err(|e| format!("{s:?}: {e} (expected ip:port, workloads or off)")),
    }
}

pub(crate) fn parse_upstream(s: &str) -> Result<SocketAddr, String> {
    let t = s.trim();
    if let Ok(a) = t.parse::<SocketAddr>() {
        return Ok(a);
    }
    t.parse::<std::net::IpAddr>()
        .map(|ip| SocketAddr::new(ip, 53))
        .map_err(|_| format!("{s:?}: expected ip or ip:port ([v6]:port)"))
}

pub(crate) fn parse_mark(s: &str) -> Result<u32, String> {
    let r = match s.strip_prefix("0x") {
        Some(h) => u32::from_str_radix(h, 16),
        None => s.parse(),
    };
    r.map_err(|e| format!("{s:?}: {e}"))
}

/// The shortest epoch tick: finer ticks cost more wake-ups than they buy.
pub(crate) const MIN_EPOCH_TICK: Duration = Duration::from_micros(100);

/// An epoch tick: at least [`MIN_EPOCH_TICK`], at most the 10 ms call deadline (a coarser tick could not
/// enforce it).
pub(crate) fn check_epoch_tick(d: Duration) -> Result<Duration, String> {
    let max = weft_plugin_host::HostConfig::default().call_deadline;
    if d < MIN_EPOCH_TICK || d > max {
        return Err(format!(
            "{} is not within {} and {}",
            humantime::format_duration(d),
            humantime::format_duration(MIN_EPOCH_TICK),
            humantime::format_duration(max)
        ));
    }
    Ok(d)
}

pub(crate) fn parse_epoch_tick(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s).map_err(|e| format!("{s:?}: {e}"))?;
    check_epoch_tick(d)
}

/// A period that must not be zero (a zero interval would spin).
pub(crate) fn check_nonzero(d: Duration) -> Result<Duration, String> {
    if d.is_zero() {
        return Err("must not be zero (e.g. 10s)".to_string());
    }
    Ok(d)
}

pub(crate) fn parse_nonzero_duration(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s).map_err(|e| format!("{s:?}: {e}"))?;
    check_nonzero(d)
}

/// A share within 0..1.
pub(crate) fn check_ratio(v: f64) -> Result<f64, String> {
    if (0.0..=1.0).contains(&v) {
        Ok(v)
    } else {
        Err(format!("{v} is not within 0..1"))
    }
}

pub(crate) fn parse_ratio(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|e| format!("{s:?}: {e}"))?;
    check_ratio(v)
}

/// `weft run --worker-threads`: a fixed count, or sized from the CPUs available.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkerThreads {
    /// A quarter of the CPUs available, rounded up, at least [`WorkerThreads::AUTO_MIN`].
    Auto,
    /// Exactly this many (at least 1).
    Fixed(usize),
}

impl WorkerThreads {
    /// The fewest threads `auto` picks: two, ztunnel's floor too, so a small node's data path is not one thread.
    pub const AUTO_MIN: usize = 2;

    /// The thread count on a machine where this process may use `cpus` CPUs, with `shards` shards carrying the
    /// connections.
    pub fn count(self, cpus: usize, shards: usize) -> usize {
        match self {
            WorkerThreads::Auto if shards > 0 => 1,
            WorkerThreads::Auto => data_threads(cpus),
            WorkerThreads::Fixed(n) => n.max(1),
        }
    }
}

/// How many threads carry connections on a machine where this process may use `cpus` CPUs: a quarter of them,
/// rounded up, at least [`WorkerThreads::AUTO_MIN`].
fn data_threads(cpus: usize) -> usize {
    cpus.div_ceil(4).max(WorkerThreads::AUTO_MIN)
}

/// `weft run --shards`: a fixed count (0: off), or sized from the CPUs available.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShardCount {
    /// As many as `--worker-threads auto` would start workers without shards.
    Auto,
    /// Exactly this many (0: off).
    Fixed(usize),
}

impl ShardCount {
    /// The shard count on a machine where this process may use `cpus` CPUs.
    pub fn count(self, cpus: usize) -> usize {
        match self {
            ShardCount::Auto => data_threads(cpus),
            ShardCount::Fixed(n) => n,
        }
    }
}

pub(crate) fn parse_shards(s: &str) -> Result<ShardCount, String> {
    if s == "auto" {
        return Ok(ShardCount::Auto);
    }
    match s.parse::<usize>() {
        Ok(n) if n <= 1024 => Ok(ShardCount::Fixed(n)),
        _ => Err(format!(
            "{s:?} is neither `auto` nor a shard count from 0 (off) to 1024"
        )),
    }
}

pub(crate) fn parse_worker_threads(s: &str) -> Result<WorkerThreads, String> {
    if s == "auto" {
        return Ok(WorkerThreads::Auto);
    }
    match s.parse::<usize>() {
        Ok(n) if (1..=1024).contains(&n) => Ok(WorkerThreads::Fixed(n)),
        _ => Err(format!(
            "{s:?} is neither `auto` nor a thread count from 1 to 1024"
        )),
    }
}

/// `weft run --plugin-compiler`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PluginCompiler {
    /// A child process per compile.
    Subprocess,
    /// The node process.
    InProcess,
}

/// Which CA signs workload certificates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CaKind {
    /// The CA in `--ca-dir`, in process (standalone nodes, dev meshes).
    Local,
    /// An Istio-protocol CA (istiod, or `weft-ca`) over gRPC+TLS.
    Istio,
    /// Kubernetes' CertificateSigningRequest API.
    K8sCsr,
}

/// How weft gets at workload traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// Shared-node mode: weft's listeners (15001, 15006, 15008, 15080) live in weft's own network namespace and
    /// the node's capture rules send workload traffic there.
    Node,
    /// In-pod mode (Istio ambient's model): the CNI node agent hands each meshed pod's network namespace to weft
    /// over ZDS (--inpod-uds) and weft opens the pod's listeners (15001, 15006, 15008, and the DNS proxy on
    /// 127.0.0.1 and [::1] at --dns's port) inside it; the agent
    /// installs the pod's capture rules. A drop-in for ztunnel next to istio-cni.
    Inpod,
}

impl fmt::Display for Listen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Listen::At(a) => a.fmt(f),
            Listen::Off => f.write_str("off"),
        }
    }
}

impl FromStr for Listen {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        parse_listen(s)
    }
}

impl fmt::Display for HboneListen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HboneListen::At(a) => a.fmt(f),
            HboneListen::Workloads => f.write_str("workloads"),
            HboneListen::Off => f.write_str("off"),
        }
    }
}

impl FromStr for HboneListen {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        parse_hbone(s)
    }
}

impl fmt::Display for WorkerThreads {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WorkerThreads::Auto => f.write_str("auto"),
            WorkerThreads::Fixed(n) => n.fmt(f),
        }
    }
}

impl FromStr for WorkerThreads {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        parse_worker_threads(s)
    }
}

impl fmt::Display for ShardCount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ShardCount::Auto => f.write_str("auto"),
            ShardCount::Fixed(n) => n.fmt(f),
        }
    }
}

impl FromStr for ShardCount {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        parse_shards(s)
    }
}
