//! `weft run`'s configuration: one typed [`NodeConfig`], read once from the flags, their env vars and optionally
//! a YAML file (`--config-file`; [`load`]), checked at start ([`NodeConfig::validate`]), shown in `/config_dump`
//! under `nodeConfig`, and turned into each part's own config in one place ([`derive`]).
//!
//! Precedence, per setting: a flag on the command line, else its env var, else the config file, else the
//! built-in default. The file's keys are the flags' names in camelCase, grouped as `/config_dump` shows them
//! (`ca`, `xds`, `pluginXds`, `inpod`, `tuning`).
// The fields' doc comments are clap's `--help` text, written for a terminal: addresses such as `[::1]` and URLs
// stay plain there, not rustdoc links.
#![allow(rustdoc::broken_intra_doc_links, rustdoc::bare_urls)]

pub mod derive;
mod error;
mod load;
mod sections;
mod serde_text;
mod tuning;
mod validate;
mod values;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use serde::{Deserialize, Serialize};
use weft_logging::LogFormat;

pub use error::ConfigError;
pub use load::{RunArgs, load};
pub use sections::{CaConfig, InpodConfig, PluginXdsConfig, XdsConfig};
pub use tuning::Tuning;
pub use values::{CaKind, HboneListen, Listen, Mode, PluginCompiler, ShardCount, WorkerThreads};

use serde_text::{duration, text};
use values::{
    parse_hbone, parse_listen, parse_mark, parse_shards, parse_upstream, parse_worker_threads,
};

/// `weft run`'s settings (a flag given twice: the last one wins).
#[derive(Debug, Clone, Args, Serialize, Deserialize)]
#[command(args_override_self = true)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeConfig {
    /// Mesh config file (ztunnel's local-config format plus `plugins`); watched for edits. Optional with
    /// --xds-address (both may be combined: the file is one more source, xDS wins a conflict).
    #[arg(long, env = "WEFT_CONFIG", required_unless_present_any = ["xds_address", "config_file"])]
    pub config: Option<PathBuf>,
    /// The mesh over xDS, and the node id sent.
    #[command(flatten)]
    pub xds: XdsConfig,
    /// Plugins over xDS (`weft-control`).
    #[command(flatten)]
    pub plugin_xds: PluginXdsConfig,
    /// This node's name (workloads with this `node` are local).
    #[arg(
        long,
        env = "NODE_NAME",
        required_unless_present = "config_file",
        default_value = "",
        hide_default_value = true
    )]
    pub node: String,
    /// Directory with the local CA: root-cert.pem + root-key.pem (or ca-cert.pem + ca-key.pem + root-cert.pem).
    /// Required with `--ca-kind local` (the default).
    #[arg(long, env = "WEFT_CA_DIR")]
    pub ca_dir: Option<PathBuf>,
    /// Which CA signs workload certificates, and how to reach it.
    #[command(flatten)]
    pub ca: CaConfig,
    /// Node mode or in-pod mode.
    #[command(flatten)]
    pub inpod: InpodConfig,
    /// Lifetime of workload certificates.
    #[arg(long, env = "SECRET_TTL", default_value = "24h", value_parser = humantime::parse_duration)]
    #[serde(with = "duration")]
    pub cert_validity: Duration,
    /// Cluster id.
    #[arg(long, env = "CLUSTER_ID", default_value = "Kubernetes")]
    pub cluster_id: String,
    /// This node's network (ztunnel's NETWORK). An inbound tunnel whose x-forwarded-network names another network
    /// came through that network's gateway (its source workload is not looked up); an outbound tunnel through a
    /// network gateway says it comes from this network; sent to istiod as node metadata NETWORK unless
    /// ISTIO_META_NETWORK is set. Empty: each local workload's own network.
    #[arg(long, env = "NETWORK", default_value = "", hide_default_value = true)]
    pub network: String,
    /// Outbound capture listener (iptables REDIRECT target).
    #[arg(long, env = "WEFT_OUTBOUND", default_value = "0.0.0.0:15001", value_parser = parse_listen)]
    #[serde(with = "text")]
    pub outbound: Listen,
    /// SOCKS5 listener.
    #[arg(long, env = "WEFT_SOCKS5", default_value = "127.0.0.1:15080", value_parser = parse_listen)]
    #[serde(with = "text")]
    pub socks5: Listen,
    /// Inbound plaintext capture listener.
    #[arg(long, env = "WEFT_INBOUND_PLAINTEXT", default_value = "0.0.0.0:15006", value_parser = parse_listen)]
    #[serde(with = "text")]
    pub inbound_plaintext: Listen,
    /// Inbound HBONE: an address, `workloads` (one listener per local workload IP on --hbone-port), or `off`.
    #[arg(long, env = "WEFT_HBONE", default_value = "0.0.0.0:15008", value_parser = parse_hbone)]
    #[serde(with = "text")]
    pub hbone: HboneListen,
    /// Port dialled on peers for HBONE.
    #[arg(long, env = "WEFT_HBONE_PORT", default_value_t = 15008)]
    pub hbone_port: u16,
    /// DNS proxy, UDP and TCP (`ip:port` or `off`): answers A/AAAA for mesh service names (and their short forms
    /// through the pod's search domains) to the HBONE workloads of this node, by source address, and forwards
    /// everything else to the node's resolvers; anyone else is refused. Point the pods' DNS capture here.
    /// In-pod mode: each pod gets its own DNS proxy at this port on its loopback (127.0.0.1 and [::1]), where
    /// istio-cni's pod rules redirect port 53; the address part is not used there.
    #[arg(long, env = "WEFT_DNS", default_value = "127.0.0.1:15053", value_parser = parse_listen)]
    #[serde(with = "text")]
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
    #[arg(long, env = "WEFT_ADMIN", default_value = "127.0.0.1:15000", value_parser = parse_listen)]
    #[serde(with = "text")]
    pub admin: Listen,
    /// Metrics server.
    #[arg(long, env = "WEFT_METRICS", default_value = "0.0.0.0:15020", value_parser = parse_listen)]
    #[serde(with = "text")]
    pub metrics: Listen,
    /// Readiness server.
    #[arg(long, env = "WEFT_READINESS", default_value = "0.0.0.0:15021", value_parser = parse_listen)]
    #[serde(with = "text")]
    pub readiness: Listen,
    /// SO_MARK for weft's own sockets (capture rules skip them); e.g. 0x539.
    #[arg(long, env = "WEFT_MARK", value_parser = parse_mark)]
    pub mark: Option<u32>,
    /// Bind outbound connections to the source workload's IP.
    #[arg(long, env = "WEFT_BIND_SOURCE_IP")]
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
    /// record layer, as ztunnel runs it. Both are held to the same rules; README.md says why `weft` is the default.
    #[arg(long, env = "WEFT_TLS_RECORD_LAYER", default_value_t = weft_proxy::RecordLayer::Weft)]
    #[serde(with = "text")]
    pub tls_record_layer: weft_proxy::RecordLayer,
    /// Close connections idle for this long.
    #[arg(long, env = "WEFT_IDLE_TIMEOUT", default_value = "1h", value_parser = humantime::parse_duration)]
    #[serde(with = "duration")]
    pub idle_timeout: Duration,
    /// How long a drain waits for connections.
    #[arg(long, env = "CONNECTION_TERMINATION_DEADLINE", default_value = "5s", value_parser = humantime::parse_duration)]
    #[serde(with = "duration")]
    pub drain_deadline: Duration,
    /// Open connections each listener (15001, 15006, 15008, 15080) holds at most; one over the cap is closed at
    /// once, logged and counted in weft_listener_connections_refused_total. 0: unlimited.
    #[arg(long, env = "WEFT_MAX_CONNECTIONS_PER_LISTENER", default_value_t = weft_proxy::config::DEFAULT_MAX_CONNECTIONS_PER_LISTENER)]
    pub max_connections_per_listener: usize,
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
    /// Docker config.json with registry credentials for plugin code pulled from OCI registries (oci:// in a
    /// plugin resource); re-read on every pull. A resource's own pull secret (Istio's) is tried first.
    #[arg(long, env = "WEFT_PLUGIN_PULL_SECRET")]
    pub plugin_pull_secret: Option<PathBuf>,
    /// Directory where plugin code fetched over https:// or from OCI registries is cached by digest (created
    /// 0700; every entry re-hashed when read). None: fetched again after every restart.
    #[arg(long, env = "WEFT_PLUGIN_FETCH_CACHE")]
    pub plugin_fetch_cache: Option<PathBuf>,
    /// Data-path worker threads: a number, or `auto` (the default): 1 when connections run on shards (the
    /// workers then carry only the data path's bookkeeping), otherwise a quarter of the CPUs this process may use
    /// (cores, affinity and cgroup CPU limit), at least 2, as ztunnel sizes its own.
    #[arg(long, env = "WEFT_WORKER_THREADS", default_value = "auto", value_parser = parse_worker_threads)]
    #[serde(with = "text")]
    pub worker_threads: WorkerThreads,
    /// Connections run on this many single-threaded shards, each with its own HBONE pool, so one connection's
    /// tasks never hand off across threads; 0: off (connections run on the worker threads). `auto` (the
    /// default): as many as `--worker-threads auto` would start workers without shards.
    #[arg(long, env = "WEFT_SHARDS", default_value = "auto", value_parser = parse_shards)]
    #[serde(with = "text")]
    pub shards: ShardCount,
    /// Log filter (tracing EnvFilter syntax); changeable at run time via POST /logging.
    #[arg(long, env = "WEFT_LOG", default_value = "info")]
    pub log: String,
    /// Log format.
    #[arg(long, env = "WEFT_LOG_FORMAT", value_enum, default_value = "text")]
    pub log_format: LogFormat,
    /// Internals and benchmark switches: hidden from `--help`, documented in [`Tuning`].
    #[command(flatten)]
    pub tuning: Tuning,
}

#[cfg(test)]
pub(crate) mod tests;
