//! `istio-telemetry`: a weft telemetry plugin that serves Istio's standard TCP metrics with ztunnel's names, types
//! and labels (so Istio's Grafana dashboards work unchanged), and writes one access log line per connection.
//!
//! Metrics (counters unless noted; ztunnel's `src/proxy/metrics.rs`):
//! `istio_tcp_connections_opened_total`, `istio_tcp_connections_closed_total`, `istio_tcp_sent_bytes_total`
//! (destination → source), `istio_tcp_received_bytes_total` (source → destination),
//! `istio_tcp_connections_failed_total` (closed with a failure response flag), and the gauge
//! `istio_tcp_sockets_open{reporter}`. Labels, in ztunnel's order: see [`LABELS`]; unset values are `unknown`.
//! As in ztunnel, the byte counters carry `response_flags="-"` (they are bound when the connection opens) and a
//! connection that closes without having been reported open (a denial, a failed connect) counts as opened too.
//!
//! Config (JSON, optional; every key optional):
//!
//! ```json
//! {"labels": ["reporter", "source_workload", "destination_workload"], "maxSeries": 1900,
//!  "accessLog": "on", "spiffePrefix": true}
//! ```
//!
//! - `labels`: the labels to keep (a subset of [`LABELS`], kept in ztunnel's order; default: all). Series that
//!   differ only in dropped labels are summed.
//! - `maxSeries`: the most distinct label sets (default 1,900). Each label set is at most one series in each of
//!   the five counters, so the default stays under the host's default cap of 10,000 series per plugin
//!   (5 × 1,900 = 9,500, plus the gauge and the overflow series). Past the cap, new label sets are recorded with
//!   every unbounded label set to `overflow` (totals stay right) and counted in
//!   `istio_telemetry_series_overflow_total`.
//! - `accessLog`: `on` (default) or `off`: one line per connection at its end, written by the host as ztunnel writes
//!   its own (scope `access`, "connection complete", ztunnel's field names), in the node's log format. `text` and
//!   `json`, the values of earlier versions, mean `on`.
//! - `spiffePrefix`: principal labels as ztunnel writes them, `spiffe://td/ns/x/sa/y` (default true); false drops
//!   the `spiffe://`.

use std::borrow::Cow;
use std::hash::{DefaultHasher, Hash, Hasher};

mod open_cache;

use open_cache::OpenCache;
use weft_plugin_sdk::hash::FastMap;
use weft_plugin_sdk::json::Value;
use weft_plugin_sdk::log::AccessEntry;
use weft_plugin_sdk::metrics::{Counter, CounterSeries, Gauge, GaugeSeries};
use weft_plugin_sdk::{CloseInfo, ConnectionInfo, Direction, Telemetry, Verdict, WorkloadMeta};

/// ztunnel's traffic labels, in its order.
pub const LABELS: [&str; 27] = [
    "reporter",
    "source_workload",
    "source_canonical_service",
    "source_canonical_revision",
    "source_workload_namespace",
    "source_principal",
    "source_app",
    "source_version",
    "source_cluster",
    "destination_service",
    "destination_service_namespace",
    "destination_service_name",
    "destination_workload",
    "destination_canonical_service",
    "destination_canonical_revision",
    "destination_workload_namespace",
    "destination_principal",
    "destination_app",
    "destination_version",
    "destination_cluster",
    "request_protocol",
    "response_flags",
    "connection_security_policy",
    "source_region",
    "source_zone",
    "destination_region",
    "destination_zone",
];

const RESPONSE_FLAGS: usize = 21;
/// Labels with a handful of values, kept as they are past the series cap.
const BOUNDED: [usize; 4] = [0, 20, 21, 22];
const UNKNOWN: &str = "unknown";
const OVERFLOW: &str = "overflow";
/// Connections remembered as open (for the open gauge and to count opens of never-opened closes).
const MAX_LIVE: usize = 100_000;

/// Whether access logs are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccessLog {
    /// None.
    Off,
    /// One line per connection, in the node's log format (see [`access_entry`]).
    On,
}

/// The plugin's options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// Indices into [`LABELS`] of the labels kept, ascending.
    pub keep: Vec<usize>,
    /// Most distinct label sets.
    pub max_series: usize,
    /// Whether to write access logs.
    pub access_log: AccessLog,
    /// Keep `spiffe://` in principal labels.
    pub spiffe_prefix: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            keep: (0..LABELS.len()).collect(),
            max_series: 1_900,
            access_log: AccessLog::On,
            spiffe_prefix: true,
        }
    }
}

impl Options {
    /// Parses the JSON config (empty: defaults).
    pub fn parse(config: &str) -> Result<Self, String> {
        let mut opts = Options::default();
        let config = config.trim();
        if config.is_empty() {
            return Ok(opts);
        }
        let v: Value = config.parse().map_err(|e| format!("config: {e}"))?;
        let fields = v.as_object().ok_or("config must be a JSON object")?;
        for (key, value) in fields {
            match key.as_str() {
                "labels" => {
                    let list = value.as_array().ok_or("config: `labels` must be a list")?;
                    let mut keep = Vec::with_capacity(list.len());
                    for item in list {
                        let name = item
                            .as_str()
                            .ok_or("config: `labels` entries must be strings")?;
                        let i = LABELS.iter().position(|l| *l == name).ok_or_else(|| {
                            format!(
                                "config: unknown label `{name}` (known: {})",
                                LABELS.join(", ")
                            )
                        })?;
                        keep.push(i);
                    }
                    keep.sort_unstable();
                    keep.dedup();
                    opts.keep = keep;
                }
                "maxSeries" => {
                    opts.max_series = value
                        .as_u64()
                        .filter(|n| *n >= 1)
                        .and_then(|n| usize::try_from(n).ok())
                        .ok_or("config: `maxSeries` must be a positive integer")?;
                }
                "accessLog" => {
                    opts.access_log = match value.as_str() {
                        Some("off") => AccessLog::Off,
                        Some("on" | "text" | "json") => AccessLog::On,
                        _ => {
                            return Err("config: `accessLog` must be \"on\" or \"off\"".into());
                        }
                    }
                }
                "spiffePrefix" => {
                    opts.spiffe_prefix = value
                        .as_bool()
                        .ok_or("config: `spiffePrefix` must be a boolean")?;
                }
                other => return Err(format!("config: unknown key `{other}`")),
            }
        }
        Ok(opts)
    }
}

fn or_unknown(s: &str) -> &str {
    if s.is_empty() { UNKNOWN } else { s }
}

fn identity(w: &WorkloadMeta) -> Option<String> {
    (!w.namespace.is_empty() && !w.service_account.is_empty()).then(|| {
        let td = if w.trust_domain.is_empty() {
            "cluster.local"
        } else {
            &w.trust_domain
        };
        format!("spiffe://{td}/ns/{}/sa/{}", w.namespace, w.service_account)
    })
}

fn identity_namespace(id: &str) -> Option<&str> {
    let rest = id.strip_prefix("spiffe://")?;
    let mut parts = rest.split('/').skip(1);
    match (parts.next(), parts.next()) {
        (Some("ns"), Some(ns)) if !ns.is_empty() => Some(ns),
        _ => None,
    }
}

/// What one connection reports: its label values (all of [`LABELS`]) and the access log's fields. Values borrow
/// from the connection and its workloads wherever they can: a report costs an allocation only for what has to be
/// built (a principal from a workload's identity, a namespace parsed out of one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report<'a> {
    /// One value per entry of [`LABELS`].
    pub values: Vec<Cow<'a, str>>,
    /// The source principal, when the connection is mutual TLS (for the log).
    pub src_identity: Option<Cow<'a, str>>,
}

/// A principal label: the identity as given, without `spiffe://` unless `spiffe_prefix`, `unknown` for none.
fn principal(p: Option<Cow<'_, str>>, spiffe_prefix: bool) -> Cow<'_, str> {
    const PREFIX: &str = "spiffe://";
    match p {
        None => Cow::Borrowed(UNKNOWN),
        Some(p) if spiffe_prefix || !p.starts_with(PREFIX) => p,
        Some(Cow::Borrowed(s)) => Cow::Borrowed(&s[PREFIX.len()..]),
        Some(Cow::Owned(mut s)) => {
            s.replace_range(..PREFIX.len(), "");
            Cow::Owned(s)
        }
    }
}

impl<'a> Report<'a> {
    /// The labels of a connection, with `response_flags` as given.
    pub fn new(info: &ConnectionInfo<'a>, response_flags: &'a str, spiffe_prefix: bool) -> Self {
        let conn: &'a weft_plugin_sdk::Connection = info.conn;
        let inbound = conn.direction == Direction::Inbound;
        let mtls = conn.hbone;
        let src = info.source_workload;
        let dst = info.destination_workload;
        let src_principal: Option<Cow<'a, str>> = if mtls {
            match conn.peer_identity.as_deref() {
                Some(p) => Some(Cow::Borrowed(p)),
                None => src.and_then(identity).map(Cow::Owned),
            }
        } else {
            None
        };
        let dst_principal = dst.and_then(identity);
        let w = |w: Option<&'a WorkloadMeta>, f: fn(&WorkloadMeta) -> &str| -> Cow<'a, str> {
            Cow::Borrowed(or_unknown(w.map_or("", f)))
        };
        let src_ns: Cow<'a, str> = match src {
            Some(s) if !s.namespace.is_empty() => Cow::Borrowed(&s.namespace),
            _ => match src_principal.as_deref().and_then(identity_namespace) {
                Some(ns) => Cow::Owned(ns.to_string()),
                None => Cow::Borrowed(UNKNOWN),
            },
        };
        let (svc_ns, svc_host) = match conn.destination_service.as_deref() {
            Some(s) => s.split_once('/').unwrap_or(("", s)),
            None => ("", ""),
        };
        let svc_name = svc_host.split('.').next().unwrap_or("");
        let fixed = |s: &'a str| Cow::Borrowed(s);
        let values = vec![
            fixed(if inbound { "destination" } else { "source" }),
            w(src, |m| &m.workload_name),
            w(src, |m| &m.canonical_name),
            w(src, |m| &m.canonical_revision),
            src_ns,
            principal(src_principal.clone(), spiffe_prefix),
            w(src, |m| &m.canonical_name),
            w(src, |m| &m.canonical_revision),
            w(src, |m| &m.cluster_id),
            fixed(or_unknown(svc_host)),
            fixed(or_unknown(svc_ns)),
            fixed(or_unknown(svc_name)),
            w(dst, |m| &m.workload_name),
            w(dst, |m| &m.canonical_name),
            w(dst, |m| &m.canonical_revision),
            w(dst, |m| &m.namespace),
            principal(dst_principal.map(Cow::Owned), spiffe_prefix),
            w(dst, |m| &m.canonical_name),
            w(dst, |m| &m.canonical_revision),
            w(dst, |m| &m.cluster_id),
            fixed("tcp"),
            fixed(or_unknown(response_flags)),
            fixed(if mtls { "mutual_tls" } else { UNKNOWN }),
            w(src, |m| &m.region),
            w(src, |m| &m.zone),
            w(dst, |m| &m.region),
            w(dst, |m| &m.zone),
        ];
        Report {
            values,
            src_identity: src_principal,
        }
    }
}

/// One label set (the kept label values of a connection) and its series in each counter, registered with the host
/// the first time they are needed, so a connection's updates pass handles, not 27 strings each.
struct LabelSet {
    values: Vec<String>,
    series: [Option<CounterSeries>; 5],
    /// What the batch in progress added to each counter (none: untouched), handed to the host at its end. A set
    /// with any is in [`IstioTelemetry::dirty`].
    pending: [Option<u64>; 5],
}

/// Which counter of a label set (index into [`LabelSet::series`]).
#[derive(Clone, Copy)]
enum Which {
    Opened = 0,
    Closed = 1,
    Failed = 2,
    Sent = 3,
    Received = 4,
}

/// The plugin: options, metric handles, the label sets seen and the connections open.
pub struct IstioTelemetry {
    options: Options,
    label_names: Vec<&'static str>,
    /// opened, closed, failed, sent, received (the order of [`Which`]).
    counters: [Counter; 5],
    sockets: [Option<GaugeSeries>; 2],
    /// What the batch in progress moved each sockets gauge by (none: untouched).
    sockets_pending: [Option<i64>; 2],
    sockets_gauge: Gauge,
    overflow: Counter,
    /// Label sets by the hash of their values (probing on a collision), as indices into `sets`.
    index: FastMap<u64, usize>,
    sets: Vec<LabelSet>,
    /// Connections reported open, with the label set of their open.
    live: FastMap<u64, usize>,
    /// The label sets the batch in progress touched.
    dirty: Vec<usize>,
    open_cache: OpenCache,
}

fn hash_of(kept: &[&str], probe: u64) -> u64 {
    let mut h = DefaultHasher::new();
    kept.hash(&mut h);
    h.finish().wrapping_add(probe)
}

impl IstioTelemetry {
    /// The label set of a report's values (the kept ones), created if new; past `maxSeries` label sets a new one
    /// is recorded with every unbounded label set to `overflow`.
    fn label_set(&mut self, values: &[Cow<'_, str>]) -> usize {
        self.label_set_or_overflow(values).0
    }

    /// [`Self::label_set`], and whether the values were recorded under `overflow` (such a result must not be
    /// remembered: each connection recorded so is counted in the overflow counter).
    fn label_set_or_overflow(&mut self, values: &[Cow<'_, str>]) -> (usize, bool) {
        let mut kept: Vec<&str> = self
            .options
            .keep
            .iter()
            .map(|&i| values[i].as_ref())
            .collect();
        if let Some(i) = self.find(&kept) {
            return (i, false);
        }
        // The overflow sets themselves are few (one per combination of bounded labels) and not capped.
        let overflowing = self.sets.len() >= self.options.max_series;
        if overflowing {
            self.overflow.inc(&[]);
            for (slot, &i) in kept.iter_mut().zip(&self.options.keep) {
                if !BOUNDED.contains(&i) {
                    *slot = OVERFLOW;
                }
            }
            if let Some(i) = self.find(&kept) {
                return (i, true);
            }
        }
        let mut probe = 0;
        while self.index.contains_key(&hash_of(&kept, probe)) {
            probe += 1;
        }
        let i = self.sets.len();
        self.index.insert(hash_of(&kept, probe), i);
        self.sets.push(LabelSet {
            values: kept.iter().map(|v| v.to_string()).collect(),
            series: [None; 5],
            pending: [None; 5],
        });
        (i, overflowing)
    }

    /// The label set of a connection's open: remembered by what determines it (see [`OpenCache`]), built from a
    /// [`Report`] the first time.
    fn open_set(&mut self, info: &ConnectionInfo<'_>) -> usize {
        let key = self.open_cache.key(info);
        if let Some(&set) = self.open_cache.sets.get(&key) {
            return set;
        }
        let report = Report::new(info, "-", self.options.spiffe_prefix);
        let (set, overflowed) = self.label_set_or_overflow(&report.values);
        if !overflowed {
            self.open_cache.sets.insert(key, set);
        }
        set
    }

    fn find(&self, kept: &[&str]) -> Option<usize> {
        let mut probe = 0;
        while let Some(&i) = self.index.get(&hash_of(kept, probe)) {
            if self.sets[i]
                .values
                .iter()
                .map(String::as_str)
                .eq(kept.iter().copied())
            {
                return Some(i);
            }
            probe += 1;
        }
        None
    }

    /// Adds to one counter of a label set, for the end of the batch ([`Self::flush`]).
    fn add(&mut self, set: usize, which: Which, value: u64) {
        let pending = &mut self.sets[set].pending;
        if pending.iter().all(Option::is_none) {
            self.dirty.push(set);
        }
        let slot = &mut pending[which as usize];
        *slot = Some(slot.unwrap_or(0).saturating_add(value));
    }

    fn sockets_add(&mut self, info: &ConnectionInfo<'_>, delta: i64) {
        let i = match info.conn.direction {
            Direction::Inbound => 0,
            Direction::Outbound => 1,
        };
        let slot = &mut self.sockets_pending[i];
        *slot = Some(slot.unwrap_or(0) + delta);
    }

    /// Hands the batch's sums to the host: one update per series the batch touched, however many of its events
    /// did (each update is a call into the host). A series is registered on first use; one the host refuses, e.g.
    /// past its cap, is counted there as dropped and tried again next batch.
    fn flush(&mut self) {
        for set in std::mem::take(&mut self.dirty) {
            let entry = &mut self.sets[set];
            for (which, pending) in entry.pending.iter_mut().enumerate() {
                let Some(value) = pending.take() else {
                    continue;
                };
                let slot = &mut entry.series[which];
                if slot.is_none() {
                    let values: Vec<&str> = entry.values.iter().map(String::as_str).collect();
                    *slot = self.counters[which].series(&values).ok();
                }
                if let Some(s) = slot {
                    s.add(value);
                }
            }
        }
        for (i, reporter) in ["destination", "source"].into_iter().enumerate() {
            let Some(delta) = self.sockets_pending[i].take() else {
                continue;
            };
            if self.sockets[i].is_none() {
                self.sockets[i] = self.sockets_gauge.series(&[reporter]).ok();
            }
            if let Some(s) = &self.sockets[i] {
                s.add(delta);
            }
        }
    }
}

impl Telemetry for IstioTelemetry {
    fn configure(config: &str) -> Result<Self, String> {
        let options = Options::parse(config)?;
        let label_names: Vec<&'static str> = options.keep.iter().map(|&i| LABELS[i]).collect();
        let counter = |name: &str, help: &str| Counter::define(name, help, &label_names);
        Ok(IstioTelemetry {
            counters: [
                counter(
                    "istio_tcp_connections_opened_total",
                    "The total number of TCP connections opened",
                )?,
                counter(
                    "istio_tcp_connections_closed_total",
                    "The total number of TCP connections closed",
                )?,
                counter(
                    "istio_tcp_connections_failed_total",
                    "The total number of TCP connections that failed to establish (unstable)",
                )?,
                counter(
                    "istio_tcp_sent_bytes_total",
                    "The size of total bytes sent during response in case of a TCP connection",
                )?,
                counter(
                    "istio_tcp_received_bytes_total",
                    "The size of total bytes received during request in case of a TCP connection",
                )?,
            ],
            sockets_gauge: Gauge::define(
                "istio_tcp_sockets_open",
                "The current number of open TCP sockets (unstable)",
                &["reporter"],
            )?,
            sockets: [None; 2],
            sockets_pending: [None; 2],
            overflow: Counter::define(
                "istio_telemetry_series_overflow_total",
                "Connections recorded under `overflow` labels because maxSeries label sets exist.",
                &[],
            )?,
            index: FastMap::default(),
            sets: Vec::new(),
            live: FastMap::default(),
            dirty: Vec::new(),
            open_cache: OpenCache::default(),
            label_names,
            options,
        })
    }

    fn on_open(&mut self, info: &ConnectionInfo<'_>) {
        let set = self.open_set(info);
        self.add(set, Which::Opened, 1);
        if self.live.len() < MAX_LIVE && self.live.insert(info.conn.id, set).is_none() {
            self.sockets_add(info, 1);
        }
    }

    fn on_batch_end(&mut self) {
        // The batch's workloads go away with it (their addresses may be reused by the next one), and its strings'
        // positions name other strings in the next.
        self.open_cache.end_batch();
        self.flush();
    }

    fn on_close(&mut self, info: &ConnectionInfo<'_>, close: &CloseInfo) {
        let open = self.live.remove(&info.conn.id);
        if open.is_some() {
            self.sockets_add(info, -1);
        }
        self.closed(info, close, open);
    }

    /// Opened and closed within one batch: counted opened with the labels of its open, then closed as usual,
    /// without a trip through the live table; the sockets gauge moves by 0 (its series exists, as after an open
    /// and a close).
    fn on_open_close(&mut self, info: &ConnectionInfo<'_>, close: &CloseInfo) {
        let set = self.open_set(info);
        self.add(set, Which::Opened, 1);
        self.sockets_add(info, 0);
        self.closed(info, close, Some(set));
    }
}

impl IstioTelemetry {
    /// A close, given the label set of its open when it was reported open (`None`: never reported open).
    fn closed(&mut self, info: &ConnectionInfo<'_>, close: &CloseInfo, open: Option<usize>) {
        let flags = or_unknown(&close.response_flags);
        let flags = if flags == UNKNOWN { "-" } else { flags };
        let failed = flags != "-";
        let logging = self.options.access_log != AccessLog::Off;
        // The labels are rebuilt only when something needs them: a connection never reported open (denied, or the
        // connect failed: ztunnel counts it opened as well), a failure flag, or the access log.
        let mut report = None;
        let open_set = match open {
            Some(set) => set,
            None => {
                let r = Report::new(info, "-", self.options.spiffe_prefix);
                let set = self.label_set(&r.values);
                self.add(set, Which::Opened, 1);
                report = Some(r);
                set
            }
        };
        // Byte counters are bound with the labels of the open (`response_flags="-"`), as in ztunnel.
        self.add(open_set, Which::Received, close.bytes_sent);
        self.add(open_set, Which::Sent, close.bytes_received);
        let close_set = if failed {
            let r =
                report.get_or_insert_with(|| Report::new(info, "-", self.options.spiffe_prefix));
            r.values[RESPONSE_FLAGS] = Cow::Borrowed(flags);
            self.label_set(&r.values)
        } else {
            open_set
        };
        self.add(close_set, Which::Closed, 1);
        if failed {
            self.add(close_set, Which::Failed, 1);
        }
        if logging {
            let mut r =
                report.unwrap_or_else(|| Report::new(info, "-", self.options.spiffe_prefix));
            r.values[RESPONSE_FLAGS] = Cow::Borrowed(flags);
            weft_plugin_sdk::log::access(&access_entry(info, close, &r));
        }
    }

    /// The label names the metrics carry.
    pub fn label_names(&self) -> &[&'static str] {
        &self.label_names
    }
}

/// The access log entry of a closed connection: ztunnel's fields (`src/proxy/metrics.rs`
/// `ConnectionResult::record_internal`), which the host writes under scope `access`.
pub fn access_entry(
    info: &ConnectionInfo<'_>,
    close: &CloseInfo,
    report: &Report<'_>,
) -> AccessEntry {
    let conn = &info.conn;
    let inbound = conn.direction == Direction::Inbound;
    let dst_addr = conn.destination_addr();
    // A workload's name, else its canonical name (ztunnel: the pod name, else the canonical service).
    let name = |w: Option<&WorkloadMeta>| {
        w.map(|w| {
            if w.name.is_empty() {
                &w.canonical_name
            } else {
                &w.name
            }
        })
        .filter(|n| !n.is_empty())
        .cloned()
    };
    let v = |i: usize| {
        Some(report.values[i].as_ref())
            .filter(|s| *s != UNKNOWN)
            .map(str::to_owned)
    };
    // HBONE: the L4 address is the destination's HBONE port; the tunnel's target is the workload address.
    let (l4, hbone) = if conn.hbone {
        let l4 = std::net::SocketAddr::new(dst_addr.ip(), 15008);
        (l4, Some(dst_addr.to_string()))
    } else {
        (dst_addr, None)
    };
    // Bytes from the local workload's point of view (ztunnel "unflips" Istio's metric convention for logs).
    let (bytes_sent, bytes_recv) = if inbound {
        (close.bytes_received, close.bytes_sent)
    } else {
        (close.bytes_sent, close.bytes_received)
    };
    let error = close.error.clone().or_else(|| match &close.verdict {
        Verdict::Deny((by, reason)) => Some(format!("denied by {by}: {reason}")),
        Verdict::Allow => None,
    });
    AccessEntry {
        src_addr: conn.source_addr().to_string(),
        src_workload: name(info.source_workload),
        src_namespace: v(4),
        src_identity: report.src_identity.as_deref().map(str::to_owned),
        src_cluster: v(8),
        dst_addr: l4.to_string(),
        dst_hbone_addr: hbone,
        dst_service: v(9),
        dst_workload: name(info.destination_workload),
        dst_namespace: v(15),
        // The destination principal, when the connection is mutual TLS.
        dst_identity: info
            .destination_workload
            .and_then(identity)
            .filter(|_| conn.hbone),
        dst_cluster: v(19),
        direction: if inbound { "inbound" } else { "outbound" }.to_owned(),
        bytes_sent,
        bytes_recv,
        duration_ms: close.duration_ns / 1_000_000,
        error,
    }
}

weft_plugin_sdk::export_telemetry!(IstioTelemetry);
