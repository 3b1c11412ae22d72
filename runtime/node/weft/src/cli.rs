//! Command line and environment: `weft run` (the node proxy), `weft ca init` (a development root), `weft demo`
//! (a two-node mesh on this machine), `weft control` (the Delta ADS server, flags in `weft_control::cli`).
// The doc comments of the argument structs are clap's `--help` text, written for a terminal: addresses such as
// `[::1]` and URLs stay plain there, not rustdoc links.
#![allow(rustdoc::broken_intra_doc_links, rustdoc::bare_urls)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use weft_logging::LogFormat;

/// weft: a node proxy for sidecar-less service meshes.
#[derive(Debug, Parser)]
#[command(version, about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the node proxy.
    ///
    /// Two modes (--mode, env WEFT_MODE). node (the default): weft's listeners (15001 outbound capture, 15006
    /// inbound plaintext, 15008 HBONE, 15080 SOCKS5) live in weft's own network namespace and the node's capture
    /// rules send workload traffic to them (a dev mesh, a VM, the demo). inpod (Istio ambient's model, a drop-in
    /// for ztunnel next to istio-cni): the CNI node agent installs capture rules inside each meshed pod and hands
    /// the pod's network namespace to weft over the ZDS socket (--inpod-uds); weft opens 15001, 15006 and 15008
    /// inside the pod (with SO_REUSEPORT unless --inpod-port-reuse false, so an upgrade can overlap), dials out
    /// from the pod's own address, and drains a pod when the agent deletes it.
    Run(Box<RunArgs>),
    /// Certificate authority helpers.
    #[command(subcommand)]
    Ca(CaCommand),
    /// Start a two-node mesh on 127.0.0.x, send traffic through it and show the mTLS identities.
    Demo(DemoArgs),
    /// Serve the mesh and plugins to nodes over Delta ADS (the control plane for plugins, and for meshes
    /// without istiod).
    Control(Box<weft_control::cli::ControlArgs>),
    /// Compile one plugin component (stdin) to an artifact (stdout) for `weft run`'s plugin host, which runs this
    /// in a child process so the node never pages in the compiler. Not for direct use.
    #[command(hide = true)]
    CompilePlugin {
        /// The engine settings (`--max-wasm-stack N`), from the parent.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        settings: Vec<String>,
    },
}

/// `weft ca ...`
#[derive(Debug, Subcommand)]
pub enum CaCommand {
    /// Write a development root (root-cert.pem, root-key.pem) into a directory.
    Init {
        /// Output directory.
        #[arg(long)]
        out: PathBuf,
        /// Trust domain recorded in the root's subject.
        #[arg(long, default_value = "cluster.local")]
        trust_domain: String,
        /// Root lifetime.
        #[arg(long, default_value = "3650d", value_parser = humantime::parse_duration)]
        validity: Duration,
    },
}

/// `weft demo`
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Keep the mesh running until Ctrl-C after the traffic has been shown.
    #[arg(long)]
    pub keep: bool,
}

/// A listener address, or `off`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listen {
    /// Bind here.
    At(SocketAddr),
    /// Disabled.
    Off,
}

fn parse_listen(s: &str) -> Result<Listen, String> {
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

fn parse_hbone(s: &str) -> Result<HboneListen, String> {
    match s {
        "off" => Ok(HboneListen::Off),
        "workloads" => Ok(HboneListen::Workloads),
        _ => s
            .parse()
            .map(HboneListen::At)
            .map_err(|e| format!("{s:?}: {e} (expected ip:port, workloads or off)")),
    }
}

fn parse_upstream(s: &str) -> Result<SocketAddr, String> {
    let t = s.trim();
    if let Ok(a) = t.parse::<SocketAddr>() {
        return Ok(a);
    }
    t.parse::<std::net::IpAddr>()
        .map(|ip| SocketAddr::new(ip, 53))
        .map_err(|_| format!("{s:?}: expected ip or ip:port ([v6]:port)"))
}

fn parse_mark(s: &str) -> Result<u32, String> {
    let r = match s.strip_prefix("0x") {
        Some(h) => u32::from_str_radix(h, 16),
        None => s.parse(),
    };
    r.map_err(|e| format!("{s:?}: {e}"))
}

/// `weft run` (a flag given twice: the last one wins)
#[derive(Debug, Args)]
#[command(args_override_self = true)]
pub struct RunArgs {
    /// Mesh config file (ztunnel's local-config format plus `plugins`); watched for edits. Optional with
    /// --xds-address (both may be combined: the file is one more source, xDS wins a conflict).
    #[arg(long, env = "WEFT_CONFIG", required_unless_present = "xds_address")]
    pub config: Option<PathBuf>,
    /// The mesh over xDS, and the node id sent.
    #[command(flatten)]
    pub xds: crate::xds::XdsArgs,
    /// Plugins over xDS (`weft control`).
    #[command(flatten)]
    pub plugin_xds: crate::plugin_xds::PluginXdsArgs,
    /// This node's name (workloads with this `node` are local).
    #[arg(long, env = "NODE_NAME")]
    pub node: String,
    /// Directory with the local CA: root-cert.pem + root-key.pem (or ca-cert.pem + ca-key.pem + root-cert.pem).
    /// Required with `--ca-kind local` (the default).
    #[arg(long, env = "WEFT_CA_DIR")]
    pub ca_dir: Option<PathBuf>,
    /// Which CA signs workload certificates, and how to reach it.
    #[command(flatten)]
    pub ca: CaArgs,
    /// Node mode or in-pod mode.
    #[command(flatten)]
    pub inpod: crate::inpod::InpodArgs,
    /// Lifetime of workload certificates.
    #[arg(long, default_value = "24h", value_parser = humantime::parse_duration)]
    pub cert_validity: Duration,
    /// Cluster id.
    #[arg(long, env = "CLUSTER_ID", default_value = "Kubernetes")]
    pub cluster_id: String,
    /// Outbound capture listener (iptables REDIRECT target).
    #[arg(long, default_value = "0.0.0.0:15001", value_parser = parse_listen)]
    pub outbound: Listen,
    /// SOCKS5 listener.
    #[arg(long, default_value = "127.0.0.1:15080", value_parser = parse_listen)]
    pub socks5: Listen,
    /// Inbound plaintext capture listener.
    #[arg(long, default_value = "0.0.0.0:15006", value_parser = parse_listen)]
    pub inbound_plaintext: Listen,
    /// Inbound HBONE: an address, `workloads` (one listener per local workload IP on --hbone-port), or `off`.
    #[arg(long, default_value = "0.0.0.0:15008", value_parser = parse_hbone)]
    pub hbone: HboneListen,
    /// Port dialled on peers for HBONE.
    #[arg(long, default_value_t = 15008)]
    pub hbone_port: u16,
    /// DNS proxy, UDP and TCP (`ip:port` or `off`): answers A/AAAA for mesh service names (and their short forms
    /// through the pod's search domains) to the HBONE workloads of this node, by source address, and forwards
    /// everything else to the node's resolvers; anyone else is refused. Point the pods' DNS capture here.
    /// In-pod mode: each pod gets its own DNS proxy at this port on its loopback (127.0.0.1 and [::1]), where
    /// istio-cni's pod rules redirect port 53; the address part is not used there.
    #[arg(long, env = "WEFT_DNS", default_value = "127.0.0.1:15053", value_parser = parse_listen)]
    pub dns: Listen,
    /// Resolvers the DNS proxy forwards to, comma-separated `ip` or `ip:port` (port 53 by default), tried in
    /// order. Default: the `nameserver`s of --dns-resolv-conf.
    #[arg(long, env = "WEFT_DNS_UPSTREAM", value_delimiter = ',', value_parser = parse_upstream)]
    pub dns_upstream: Vec<SocketAddr>,
    /// The resolv.conf the node's resolvers (and `options timeout:`/`attempts:`) are read from.
    #[arg(long, env = "WEFT_DNS_RESOLV_CONF", default_value = "/etc/resolv.conf")]
    pub dns_resolv_conf: PathBuf,
    /// The cluster's DNS domain: pods search `<ns>.svc.<domain>`, `svc.<domain>` and `<domain>`.
    #[arg(long, env = "CLUSTER_DOMAIN", default_value = "cluster.local")]
    pub cluster_domain: String,
    /// Admin server (loopback only).
    #[arg(long, default_value = "127.0.0.1:15000", value_parser = parse_listen)]
    pub admin: Listen,
    /// Metrics server.
    #[arg(long, default_value = "0.0.0.0:15020", value_parser = parse_listen)]
    pub metrics: Listen,
    /// Readiness server.
    #[arg(long, default_value = "0.0.0.0:15021", value_parser = parse_listen)]
    pub readiness: Listen,
    /// SO_MARK for weft's own sockets (capture rules skip them); e.g. 0x539.
    #[arg(long, value_parser = parse_mark)]
    pub mark: Option<u32>,
    /// Bind outbound connections to the source workload's IP.
    #[arg(long)]
    pub bind_source_ip: bool,
    /// Applications see the client's own address as the peer of an inbound connection (ztunnel's ENABLE_ORIG_SRC):
    /// the capture listeners are made transparent (IP_TRANSPARENT, so TPROXY capture rules work too) and inbound
    /// connections are dialled from the client's address. true: required (weft stops if a listener cannot be made
    /// transparent); false: off. Unset: best effort in in-pod mode (istio-cni's pod rules route the replies back to
    /// weft), off in node mode (a node's capture must route replies to a foreign source back to weft itself).
    #[arg(long, env = "ENABLE_ORIG_SRC", action = clap::ArgAction::Set)]
    pub original_source: Option<bool>,
    /// Answer an inbound CONNECT's 200 with `baggage` describing the destination workload (ztunnel's default).
    #[arg(long, env = "ENABLE_RESPONSE_BAGGAGE", default_value_t = true, action = clap::ArgAction::Set)]
    pub response_baggage: bool,
    /// Who seals and opens HBONE's TLS records after the handshake (rustls runs the handshake either way): `weft`,
    /// weft's own record layer (records sealed from and opened into the proxy's buffers), or `rustls`, rustls's
    /// record layer, as ztunnel runs it. Both are held to the same rules (see docs/performance.md).
    #[arg(long, env = "WEFT_TLS_RECORD_LAYER", default_value_t = weft_proxy::RecordLayer::Weft)]
    pub tls_record_layer: weft_proxy::RecordLayer,
    /// Close connections idle for this long.
    #[arg(long, default_value = "1h", value_parser = humantime::parse_duration)]
    pub idle_timeout: Duration,
    /// How long a drain waits for connections.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    pub drain_deadline: Duration,
    /// Open connections each listener (15001, 15006, 15008, 15080) holds at most; one over the cap is closed at
    /// once, logged and counted in weft_listener_connections_refused_total. 0: unlimited.
    #[arg(long, default_value_t = weft_proxy::config::DEFAULT_MAX_CONNECTIONS_PER_LISTENER)]
    pub max_connections_per_listener: usize,
    /// How often the config file is checked for edits.
    #[arg(long, default_value = "250ms", value_parser = humantime::parse_duration)]
    pub config_poll: Duration,
    /// Load the embedded default plugins (istio-authz, istio-telemetry); a config entry of the same name replaces
    /// one.
    #[arg(long, env = "WEFT_DEFAULT_PLUGINS", default_value_t = true, action = clap::ArgAction::Set)]
    pub default_plugins: bool,
    /// Let connections through to workloads that Istio authorization policies apply to when no serving policy
    /// plugin enforces Istio's AuthorizationPolicy (a replaced istio-authz, --default-plugins false). Off: they are
    /// denied, the policy logged once and counted (weft_plugin_unenforced_policy_denials_total), and /config_dump
    /// lists it (unenforcedPolicies); ztunnel always enforces them.
    #[arg(long, env = "WEFT_ALLOW_UNENFORCED_POLICIES")]
    pub allow_unenforced_policies: bool,
    /// Directory where compiled plugins are cached by content hash (none: compile on every start).
    #[arg(long, env = "WEFT_PLUGIN_CACHE")]
    pub plugin_cache: Option<PathBuf>,
    /// Where plugins are compiled. subprocess: in a short-lived child (this same executable), so the compiler's
    /// code and memory never stay resident in the node; in-process: in the node itself.
    #[arg(long, env = "WEFT_PLUGIN_COMPILER", value_enum, default_value_t = PluginCompiler::Subprocess)]
    pub plugin_compiler: PluginCompiler,
    /// How long telemetry events may gather before the telemetry thread hands them to the telemetry plugins (after
    /// a quiet spell an event goes at once). Longer: fewer wake-ups and larger batches under load; an event (a
    /// metric update, a plugin's access log line) waits at most this long.
    #[arg(long, env = "WEFT_PLUGIN_TELEMETRY_LINGER", default_value = "20ms", value_parser = humantime::parse_duration)]
    pub plugin_telemetry_linger: Duration,
    /// The plugin engine's epoch tick: how often a running guest call's deadline is checked (a call overrunning its
    /// deadline is interrupted within about a tick). The ticker runs only while calls do.
    #[arg(long, env = "WEFT_PLUGIN_EPOCH_TICK", default_value = "1ms", value_parser = parse_epoch_tick)]
    pub plugin_epoch_tick: Duration,
    /// A plugin compile still running after this is stopped and the plugin version rejected.
    #[arg(long, default_value = "120s", value_parser = humantime::parse_duration)]
    pub plugin_compile_timeout: Duration,
    /// The address space a plugin compile may use, in MiB (the compiler child's RLIMIT_AS; 0: no cap). A
    /// component that drives the compiler past it is rejected.
    #[arg(long, default_value_t = weft_plugin_host::DEFAULT_COMPILE_ADDRESS_SPACE >> 20)]
    pub plugin_compile_memory_mib: u64,
    /// Docker config.json with registry credentials for plugin code pulled from OCI registries (oci:// in a
    /// plugin resource); re-read on every pull. A resource's own pull secret (Istio's) is tried first.
    #[arg(long, env = "WEFT_PLUGIN_PULL_SECRET")]
    pub plugin_pull_secret: Option<PathBuf>,
    /// Directory where plugin code fetched over https:// or from OCI registries is cached by digest (created
    /// 0700; every entry re-hashed when read). None: fetched again after every restart.
    #[arg(long, env = "WEFT_PLUGIN_FETCH_CACHE")]
    pub plugin_fetch_cache: Option<PathBuf>,
    /// Probation of a new plugin version (plugins whose resource sets no rollout): how long after the swap its
    /// failures can roll it back (0 turns probation off).
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    pub plugin_rollout_window: std::time::Duration,
    /// Probation: the share of calls (0..1) that may fail (traps, deadline overruns) before the version is
    /// rolled back to the previous one.
    #[arg(long, default_value_t = 0.2, value_parser = parse_ratio)]
    pub plugin_rollout_max_failure_ratio: f64,
    /// Probation: calls needed before the failure share is judged.
    #[arg(long, default_value_t = 20)]
    pub plugin_rollout_min_calls: u32,
    /// Data-path worker threads: a number, or `auto` (the default): 1 when connections run on shards (the
    /// workers then carry only the data path's bookkeeping), otherwise a quarter of the CPUs this process may use
    /// (cores, affinity and cgroup CPU limit), at least 2, as ztunnel sizes its own.
    #[arg(long, env = "WEFT_WORKER_THREADS", default_value = "auto", value_parser = parse_worker_threads)]
    pub worker_threads: WorkerThreads,
    /// Connections run on this many single-threaded shards, each with its own HBONE pool, so one connection's
    /// tasks never hand off across threads; 0: off (connections run on the worker threads). `auto` (the
    /// default): as many as `--worker-threads auto` would start workers without shards.
    #[arg(long, env = "WEFT_SHARDS", default_value = "auto", value_parser = parse_shards)]
    pub shards: ShardCount,
    /// Log filter (tracing EnvFilter syntax); changeable at run time via POST /logging.
    #[arg(long, env = "WEFT_LOG", default_value = "info")]
    pub log: String,
    /// Log format.
    #[arg(long, value_enum, default_value = "text")]
    pub log_format: LogFormat,
    /// How long log lines may wait in memory before they go to stderr, so that the lines of a busy moment (an
    /// access log line per connection) are written together by a thread of their own, not one `write` each by
    /// the data path; a panic and the end of the process write what waits. 0: each line as it is logged.
    #[arg(long, default_value = "10ms", value_parser = humantime::parse_duration)]
    pub log_linger: Duration,
}

/// Which CA signs workload certificates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CaKind {
    /// The CA in `--ca-dir`, in process (standalone nodes, dev meshes).
    Local,
    /// An Istio-protocol CA (istiod, or `weft-ca`) over gRPC+TLS.
    Istio,
    /// Kubernetes' CertificateSigningRequest API.
    K8sCsr,
}

/// CA selection flags of `weft run`.
#[derive(Debug, Args)]
pub struct CaArgs {
    /// CA kind.
    #[arg(long, value_enum, env = "WEFT_CA_KIND", default_value = "local")]
    pub ca_kind: CaKind,
    /// Istio CA address, e.g. https://istiod.istio-system.svc:15012.
    #[arg(long, env = "CA_ADDRESS")]
    pub ca_address: Option<String>,
    /// Roots trusted for the CA's TLS certificate and as the initial trust bundle (k8s-csr: the signer's roots).
    /// Re-read on every call; the CA channel is rebuilt when it changes.
    #[arg(long, env = "WEFT_CA_ROOT_CERT")]
    pub ca_root_cert: Option<PathBuf>,
    /// Service-account token (audience istio-ca) sent to the CA, or to the API server with k8s-csr; re-read on
    /// every call.
    #[arg(long, env = "WEFT_CA_TOKEN_FILE")]
    pub ca_token_file: Option<PathBuf>,
    /// TLS name to verify on the CA's certificate when it differs from the address's host.
    #[arg(long)]
    pub ca_server_name: Option<String>,
    /// Deadline of one CA call (k8s-csr: of the wait for the signature).
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub ca_timeout: Duration,
    /// Kubernetes API server (k8s-csr).
    #[arg(long, env = "WEFT_KUBE_API")]
    pub kube_api: Option<String>,
    /// The API server's CA bundle (k8s-csr over https).
    #[arg(long)]
    pub kube_ca_file: Option<PathBuf>,
    /// `spec.signerName` of the CertificateSigningRequests (k8s-csr).
    #[arg(long, default_value = "weft.dev/workload-identity")]
    pub csr_signer_name: String,
}

impl CaArgs {
    /// The identity crate's settings from these flags.
    pub fn settings(
        &self,
        ca_dir: Option<PathBuf>,
        cluster_id: &str,
    ) -> weft_identity::select::CaSettings {
        use weft_identity::select::CaKind as K;
        weft_identity::select::CaSettings {
            kind: match self.ca_kind {
                CaKind::Local => K::Local,
                CaKind::Istio => K::Istio,
                CaKind::K8sCsr => K::K8sCsr,
            },
            ca_dir,
            address: self.ca_address.clone(),
            root_cert: self.ca_root_cert.clone(),
            token_file: self.ca_token_file.clone(),
            cluster_id: cluster_id.to_owned(),
            server_name: self.ca_server_name.clone(),
            kube_api: self.kube_api.clone(),
            kube_ca_file: self.kube_ca_file.clone(),
            signer_name: self.csr_signer_name.clone(),
            timeout: self.ca_timeout,
        }
    }
}

/// An epoch tick: at least 100 µs (finer ticks cost more wake-ups than they buy), at most the 10 ms call
/// deadline (a coarser tick could not enforce it).
fn parse_epoch_tick(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s).map_err(|e| format!("{s:?}: {e}"))?;
    let (min, max) = (
        Duration::from_micros(100),
        weft_plugin_host::HostConfig::default().call_deadline,
    );
    if d < min || d > max {
        return Err(format!(
            "{s} is not within {} and {}",
            humantime::format_duration(min),
            humantime::format_duration(max)
        ));
    }
    Ok(d)
}

fn parse_ratio(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|e| format!("{s:?}: {e}"))?;
    if (0.0..=1.0).contains(&v) {
        Ok(v)
    } else {
        Err(format!("{v} is not within 0..1"))
    }
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

fn parse_shards(s: &str) -> Result<ShardCount, String> {
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

fn parse_worker_threads(s: &str) -> Result<WorkerThreads, String> {
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PluginCompiler {
    /// A child process per compile.
    Subprocess,
    /// The node process.
    InProcess,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test code: a panic fails the test

    use clap::Parser;

    use super::*;

    fn run_args(extra: &[&str]) -> Result<RunArgs, clap::Error> {
        let argv = ["weft", "run", "--node", "n1", "--config", "/dev/null"];
        let cli = Cli::try_parse_from(argv.iter().chain(extra))?;
        match cli.command {
            Command::Run(args) => Ok(*args),
            _ => panic!("not `weft run`"),
        }
    }

    #[test]
    fn worker_threads_default_to_a_quarter_of_the_cpus_and_at_least_two() {
        let args = run_args(&[]).unwrap();
        assert_eq!(args.worker_threads, WorkerThreads::Auto);
        let auto = WorkerThreads::Auto;
        assert_eq!(
            [1, 2, 4, 8, 9, 16, 64].map(|c| auto.count(c, 0)),
            [2, 2, 2, 2, 3, 4, 16]
        );
        // With shards the workers only keep the books: one.
        assert_eq!([1, 2, 64].map(|c| auto.count(c, 2)), [1, 1, 1]);
        let args = run_args(&["--worker-threads", "1"]).unwrap();
        assert_eq!(args.worker_threads, WorkerThreads::Fixed(1));
        assert_eq!(args.worker_threads.count(64, 0), 1);
        assert_eq!(
            run_args(&["--worker-threads", "3"])
                .unwrap()
                .worker_threads
                .count(8, 2),
            3
        );
        for bad in ["0", "1.5", "1025", "all", ""] {
            let err = run_args(&["--worker-threads", bad]).unwrap_err();
            assert!(err.to_string().contains("--worker-threads"), "{bad}: {err}");
        }
    }

    #[test]
    fn shards_default_to_the_data_thread_count() {
        let args = run_args(&[]).unwrap();
        assert_eq!(args.shards, ShardCount::Auto);
        let auto = ShardCount::Auto;
        assert_eq!(
            [1, 2, 4, 8, 9, 16, 64].map(|c| auto.count(c)),
            [2, 2, 2, 2, 3, 4, 16]
        );
        for (flag, n) in [("0", 0), ("1", 1), ("3", 3)] {
            let args = run_args(&["--shards", flag]).unwrap();
            assert_eq!(args.shards, ShardCount::Fixed(n));
            assert_eq!(args.shards.count(64), n);
        }
        for bad in [
            "--shards=-1",
            "--shards=1.5",
            "--shards=1025",
            "--shards=all",
            "--shards=",
        ] {
            let err = run_args(&[bad]).unwrap_err();
            assert!(err.to_string().contains("--shards"), "{bad}: {err}");
        }
    }

    #[test]
    fn plugin_timing_flags_default_and_parse() {
        let args = run_args(&[]).unwrap();
        let defaults = weft_plugin_host::HostConfig::default();
        assert_eq!(args.plugin_telemetry_linger, defaults.telemetry_linger);
        assert_eq!(args.plugin_epoch_tick, defaults.epoch_tick);
        let args = run_args(&[
            "--plugin-telemetry-linger",
            "50ms",
            "--plugin-epoch-tick",
            "2ms",
        ])
        .unwrap();
        assert_eq!(args.plugin_telemetry_linger, Duration::from_millis(50));
        assert_eq!(args.plugin_epoch_tick, Duration::from_millis(2));
    }

    #[test]
    fn an_epoch_tick_outside_what_can_enforce_the_call_deadline_is_refused() {
        for bad in ["0s", "50us", "11ms", "1s", "soon"] {
            let err = run_args(&["--plugin-epoch-tick", bad]).unwrap_err();
            assert!(
                err.to_string().contains("--plugin-epoch-tick"),
                "{bad}: {err}"
            );
        }
        assert!(run_args(&["--plugin-epoch-tick", "100us"]).is_ok());
        assert!(run_args(&["--plugin-epoch-tick", "10ms"]).is_ok());
    }
}
