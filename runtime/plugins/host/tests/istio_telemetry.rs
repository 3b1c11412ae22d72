//! `plugins/istio-telemetry` in the real host: a scrape checked against ztunnel's metric names, types and label
//! list (in order), Istio's byte directions, denied and failed connections, outbound plaintext, the label subset and
//! the cardinality cap, the open-sockets gauge, the access log (scope `access`, ztunnel's fields) and config errors.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use weft_hooks::{
    CloseRecord, ConnectionHooks, ConnectionRecord, Direction, Verdict, WorkloadMeta,
};
use weft_plugin_host::testing::{Harness, build_plugin, conn, workload};

mod istio_labels;
use istio_labels::ZTUNNEL_LABELS;

fn wasm() -> PathBuf {
    build_plugin("plugins/istio-telemetry").expect("build istio-telemetry")
}

const COUNTERS: [&str; 5] = [
    "istio_tcp_connections_opened_total",
    "istio_tcp_connections_closed_total",
    "istio_tcp_sent_bytes_total",
    "istio_tcp_received_bytes_total",
    "istio_tcp_connections_failed_total",
];

/// One sample of a scrape: label pairs in order, and the value.
#[derive(Debug, Clone)]
struct Sample {
    labels: Vec<(String, String)>,
    value: f64,
}

impl Sample {
    fn get(&self, k: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.as_str())
    }
}

fn parse_labels(s: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut chars = s.chars().peekable();
    loop {
        let key: String = chars.by_ref().take_while(|c| *c != '=').collect();
        if key.is_empty() {
            break;
        }
        assert_eq!(chars.next(), Some('"'), "label {key} in {s}");
        let mut value = String::new();
        while let Some(c) = chars.next() {
            match c {
                '\\' => value.push(chars.next().unwrap()),
                '"' => break,
                c => value.push(c),
            }
        }
        out.push((key.trim_start_matches(',').to_string(), value));
        if chars.peek() == Some(&',') {
            chars.next();
        }
    }
    out
}

/// The samples of `name` in a Prometheus text scrape.
fn samples(text: &str, name: &str) -> Vec<Sample> {
    text.lines()
        .filter_map(|l| l.strip_prefix(name))
        .filter_map(|rest| {
            let (labels, value) = match rest.strip_prefix('{') {
                Some(r) => {
                    let end = r.rfind('}')?;
                    (parse_labels(&r[..end]), r[end + 1..].trim())
                }
                None if rest.starts_with(' ') => (Vec::new(), rest.trim()),
                None => return None,
            };
            Some(Sample {
                labels,
                value: value.parse().ok()?,
            })
        })
        .collect()
}

fn metric_type(text: &str, name: &str) -> Option<String> {
    let base = name.strip_suffix("_total").unwrap_or(name);
    text.lines().find_map(|l| {
        let rest = l.strip_prefix("# TYPE ")?;
        let (n, t) = rest.split_once(' ')?;
        (n == name || n == base).then(|| t.trim().to_string())
    })
}

fn close(sent: u64, received: u64) -> CloseRecord {
    CloseRecord {
        bytes_sent: sent,
        bytes_received: received,
        duration: Duration::from_millis(1500),
        verdict: Verdict::Allow,
        error: None,
        response_flags: "-",
    }
}

fn rich_conn() -> ConnectionRecord {
    let mut src: WorkloadMeta = (*workload("client-7d9", "shop", "frontend")).clone();
    src.workload_name = "client".into();
    src.canonical_name = "client".into();
    src.canonical_revision = "v2".into();
    src.region = "eu-west".into();
    src.zone = "eu-west-1a".into();
    let mut c = conn(8080, Some("spiffe://cluster.local/ns/shop/sa/frontend"));
    c.src_workload = Some(Arc::new(src));
    c
}

#[test]
fn scrape_has_ztunnel_names_types_and_labels() {
    let h = Harness::telemetry(&wasm(), "").unwrap();
    h.open_close(&rich_conn(), &close(100, 2000));
    let text = h.metrics_text();
    for name in COUNTERS {
        let s = samples(&text, name);
        if name == "istio_tcp_connections_failed_total" {
            assert!(s.is_empty(), "a clean close is no failure: {s:?}");
            continue;
        }
        assert_eq!(
            metric_type(&text, name).as_deref(),
            Some("counter"),
            "{name}\n{text}"
        );
        assert_eq!(s.len(), 1, "{name}: {s:?}");
        let all: Vec<&str> = s[0].labels.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(all, ZTUNNEL_LABELS, "{name}: labels or their order differ");
    }
    assert_eq!(
        metric_type(&text, "istio_tcp_sockets_open").as_deref(),
        Some("gauge")
    );
    let s = &samples(&text, "istio_tcp_connections_opened_total")[0];
    let expected: BTreeMap<&str, &str> = [
        ("reporter", "destination"),
        ("source_workload", "client"),
        ("source_canonical_service", "client"),
        ("source_canonical_revision", "v2"),
        ("source_workload_namespace", "shop"),
        (
            "source_principal",
            "spiffe://cluster.local/ns/shop/sa/frontend",
        ),
        ("source_app", "client"),
        ("source_version", "v2"),
        ("source_cluster", "Kubernetes"),
        ("destination_service", "server.shop.svc.cluster.local"),
        ("destination_service_namespace", "shop"),
        ("destination_service_name", "server"),
        ("destination_workload", "server"),
        ("destination_canonical_service", "server"),
        ("destination_canonical_revision", "v1"),
        ("destination_workload_namespace", "shop"),
        (
            "destination_principal",
            "spiffe://cluster.local/ns/shop/sa/backend",
        ),
        ("destination_app", "server"),
        ("destination_version", "v1"),
        ("destination_cluster", "Kubernetes"),
        ("request_protocol", "tcp"),
        ("response_flags", "-"),
        ("connection_security_policy", "mutual_tls"),
        ("source_region", "eu-west"),
        ("source_zone", "eu-west-1a"),
        ("destination_region", "unknown"),
        ("destination_zone", "unknown"),
    ]
    .into();
    for (k, v) in &expected {
        assert_eq!(s.get(k), Some(*v), "label {k}");
    }
    assert_eq!(s.value, 1.0);
}

#[test]
fn bytes_follow_istio_directions() {
    let h = Harness::telemetry(&wasm(), "").unwrap();
    h.open_close(&rich_conn(), &close(100, 2000));
    let text = h.metrics_text();
    // received: from the source (request), sent: back to the source (response).
    assert_eq!(
        samples(&text, "istio_tcp_received_bytes_total")[0].value,
        100.0
    );
    assert_eq!(
        samples(&text, "istio_tcp_sent_bytes_total")[0].value,
        2000.0
    );
    assert_eq!(
        samples(&text, "istio_tcp_connections_closed_total")[0].value,
        1.0
    );
    let open = samples(&text, "istio_tcp_sockets_open");
    assert_eq!(open.len(), 1);
    assert_eq!(
        (open[0].get("reporter"), open[0].value),
        (Some("destination"), 0.0)
    );
}

/// The plugin sums a batch's events per series and hands the host one update per series at the batch's end: many
/// connections queued at once (into one batch or several) still add up exactly, and the gauge nets out.
#[test]
fn many_connections_at_once_add_up_in_every_series() {
    let h = Harness::telemetry(&wasm(), r#"{"accessLog": "off"}"#).unwrap();
    let conns: Vec<Arc<ConnectionRecord>> = (0..50).map(|_| Arc::new(rich_conn())).collect();
    for c in &conns {
        h.host().on_open(c);
    }
    for c in &conns[..20] {
        h.host().on_close(c, &close(10, 100));
    }
    h.host().flush_telemetry();
    let text = h.metrics_text();
    let total = |name: &str| samples(&text, name).iter().map(|s| s.value).sum::<f64>();
    assert_eq!(total("istio_tcp_connections_opened_total"), 50.0, "{text}");
    assert_eq!(total("istio_tcp_connections_closed_total"), 20.0);
    assert_eq!(total("istio_tcp_received_bytes_total"), 200.0);
    assert_eq!(total("istio_tcp_sent_bytes_total"), 2000.0);
    let open = samples(&text, "istio_tcp_sockets_open");
    assert_eq!(open.len(), 1, "{text}");
    assert_eq!(open[0].value, 30.0);
    // The rest close later, in another batch: the open gauge comes back to zero.
    for c in &conns[20..] {
        h.host().on_close(c, &close(0, 0));
    }
    h.host().flush_telemetry();
    let text = h.metrics_text();
    assert_eq!(samples(&text, "istio_tcp_sockets_open")[0].value, 0.0);
    assert_eq!(
        samples(&text, "istio_tcp_connections_closed_total")
            .iter()
            .map(|s| s.value)
            .sum::<f64>(),
        50.0
    );
}

#[test]
fn denied_connection_is_opened_closed_and_failed() {
    let h = Harness::telemetry(&wasm(), "").unwrap();
    let c = Arc::new(rich_conn());
    let denied = CloseRecord {
        verdict: Verdict::Deny {
            by: "istio-authz".into(),
            reason: "explicitly denied by: shop/deny-9999".into(),
        },
        error: Some("denied".into()),
        response_flags: "DENY",
        ..close(0, 0)
    };
    // Denied connections are never reported open by the data path.
    h.host().on_close(&c, &denied);
    h.host().flush_telemetry();
    let text = h.metrics_text();
    let opened = samples(&text, "istio_tcp_connections_opened_total");
    assert_eq!(opened.len(), 1);
    assert_eq!(opened[0].get("response_flags"), Some("-"));
    for name in [
        "istio_tcp_connections_closed_total",
        "istio_tcp_connections_failed_total",
    ] {
        assert_eq!(
            metric_type(&text, name).as_deref(),
            Some("counter"),
            "{name}"
        );
        let s = samples(&text, name);
        let all: Vec<&str> = s[0].labels.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(all, ZTUNNEL_LABELS, "{name}: labels or their order differ");
        assert_eq!(s.len(), 1, "{name}");
        assert_eq!(
            (s[0].get("response_flags"), s[0].value),
            (Some("DENY"), 1.0),
            "{name}"
        );
    }
    assert_eq!(
        samples(&text, "istio_tcp_sent_bytes_total")[0].get("response_flags"),
        Some("-"),
        "byte counters keep the labels of the open"
    );
}

#[test]
fn outbound_plaintext_to_unknown_destination() {
    let h = Harness::telemetry(&wasm(), "").unwrap();
    let mut c = conn(5432, None);
    c.direction = Direction::Outbound;
    c.hbone = false;
    c.dst_workload = None;
    c.dst_service = None;
    h.open_close(&c, &close(10, 20));
    let text = h.metrics_text();
    let s = &samples(&text, "istio_tcp_connections_opened_total")[0];
    assert_eq!(s.get("reporter"), Some("source"));
    assert_eq!(s.get("connection_security_policy"), Some("unknown"));
    assert_eq!(s.get("source_principal"), Some("unknown"));
    assert_eq!(s.get("source_workload"), Some("client"));
    for k in [
        "destination_workload",
        "destination_principal",
        "destination_service",
        "destination_service_name",
        "destination_cluster",
        "destination_region",
    ] {
        assert_eq!(s.get(k), Some("unknown"), "{k}");
    }
}

#[test]
fn label_subset_and_cardinality_cap() {
    let h = Harness::telemetry(
        &wasm(),
        r#"{"labels": ["destination_workload", "reporter", "response_flags"], "maxSeries": 2, "accessLog": "off"}"#,
    )
    .unwrap();
    for name in ["a", "b", "c", "d", "a"] {
        let mut c = conn(8080, None);
        c.dst_workload = Some(workload(name, "shop", "sa"));
        h.open_close(&c, &close(1, 1));
    }
    let text = h.metrics_text();
    let s = samples(&text, "istio_tcp_connections_opened_total");
    let names: Vec<&str> = s[0].labels.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        names,
        ["reporter", "destination_workload", "response_flags"],
        "ztunnel's order"
    );
    let by: BTreeMap<&str, f64> = s
        .iter()
        .map(|x| (x.get("destination_workload").unwrap(), x.value))
        .collect();
    assert_eq!(by, [("a", 2.0), ("b", 1.0), ("overflow", 2.0)].into());
    let overflow = samples(&text, "istio_telemetry_series_overflow_total");
    assert!(overflow[0].value >= 2.0, "{overflow:?}");
}

/// Opens are matched to their label set by what determines the labels, remembered across batches: a workload
/// whose metadata changes (same uid, new revision) gets its new labels at once, the same metadata again finds its
/// series, and so does a connection of another kind (other peer, other service) between them.
#[test]
fn opens_of_a_kind_seen_before_find_their_series_and_changed_metadata_new_ones() {
    let h = Harness::telemetry(&wasm(), r#"{"accessLog": "off"}"#).unwrap();
    let with_revision = |rev: &str| {
        let mut c = rich_conn();
        let mut src = (**c.src_workload.as_ref().unwrap()).clone();
        src.canonical_revision = rev.into();
        c.src_workload = Some(Arc::new(src));
        c
    };
    h.open_close(&with_revision("v2"), &close(1, 1));
    h.open_close(&with_revision("v3"), &close(1, 1));
    let mut other = with_revision("v2");
    other.peer_identity = Some(Arc::from("spiffe://cluster.local/ns/shop/sa/other"));
    other.dst_service = None;
    h.open_close(&other, &close(1, 1));
    h.open_close(&with_revision("v2"), &close(1, 1));
    let text = h.metrics_text();
    let by: BTreeMap<(String, String, String), f64> =
        samples(&text, "istio_tcp_connections_opened_total")
            .iter()
            .map(|x| {
                (
                    (
                        x.get("source_canonical_revision").unwrap().to_owned(),
                        x.get("source_principal").unwrap().to_owned(),
                        x.get("destination_service").unwrap().to_owned(),
                    ),
                    x.value,
                )
            })
            .collect();
    let frontend = "spiffe://cluster.local/ns/shop/sa/frontend".to_owned();
    let svc = "server.shop.svc.cluster.local".to_owned();
    assert_eq!(
        by,
        [
            (("v2".into(), frontend.clone(), svc.clone()), 2.0),
            (("v3".into(), frontend, svc), 1.0),
            (
                (
                    "v2".into(),
                    "spiffe://cluster.local/ns/shop/sa/other".into(),
                    "unknown".into()
                ),
                1.0
            ),
        ]
        .into()
    );
}

/// Every connection recorded under `overflow` is counted, also one of a kind already recorded so.
#[test]
fn each_overflowing_connection_is_counted() {
    let h = Harness::telemetry(
        &wasm(),
        r#"{"labels": ["destination_workload"], "maxSeries": 1, "accessLog": "off"}"#,
    )
    .unwrap();
    for name in ["a", "b", "b", "c"] {
        let mut c = conn(8080, None);
        c.dst_workload = Some(workload(name, "shop", "sa"));
        h.open_close(&c, &close(1, 1));
    }
    let text = h.metrics_text();
    assert_eq!(
        samples(&text, "istio_telemetry_series_overflow_total")[0].value,
        3.0
    );
    let opened = samples(&text, "istio_tcp_connections_opened_total");
    let by: BTreeMap<&str, f64> = opened
        .iter()
        .map(|x| (x.get("destination_workload").unwrap(), x.value))
        .collect();
    assert_eq!(by, [("a", 1.0), ("overflow", 3.0)].into());
}

/// ztunnel's access fields, from the shared test kit (which cites ztunnel's source).
use weft_testkit::ztunnel::ACCESS_FIELDS as ZTUNNEL_ACCESS_FIELDS;

/// A field as it was recorded: a string (`&str`, a JSON string, quoted in text), a number, or a value shown with
/// `Display`/`Debug` (a JSON string, bare in text, as ztunnel records addresses).
#[derive(Debug, Clone, PartialEq)]
enum Logged {
    Str(String),
    U64(u64),
    Shown(String),
}

/// An event the host logged with target `access`.
#[derive(Debug, Clone)]
struct AccessLine {
    level: tracing::Level,
    /// Logged with `parent: None`, as ztunnel's access lines are.
    explicit_root: bool,
    fields: BTreeMap<String, Logged>,
}

impl AccessLine {
    fn str(&self, k: &str) -> Option<&str> {
        match self.fields.get(k) {
            Some(Logged::Str(s)) => Some(s),
            _ => None,
        }
    }
    fn shown(&self, k: &str) -> Option<&str> {
        match self.fields.get(k) {
            Some(Logged::Shown(s)) => Some(s),
            _ => None,
        }
    }
    fn u64(&self, k: &str) -> Option<u64> {
        match self.fields.get(k) {
            Some(Logged::U64(n)) => Some(*n),
            _ => None,
        }
    }
}

/// The access lines logged so far, captured from `tracing`.
fn captured() -> &'static Mutex<Vec<AccessLine>> {
    static LINES: OnceLock<Mutex<Vec<AccessLine>>> = OnceLock::new();
    LINES.get_or_init(Default::default)
}

struct Capture;

struct Fields(BTreeMap<String, Logged>);

impl tracing::field::Visit for Fields {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.0
            .insert(field.name().into(), Logged::Str(value.into()));
    }
    fn record_u64(&mut self, field: &tracing::field::Field, value: u64) {
        self.0.insert(field.name().into(), Logged::U64(value));
    }
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0
            .insert(field.name().into(), Logged::Shown(format!("{value:?}")));
    }
}

impl tracing::Subscriber for Capture {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        if event.metadata().target() == "access" {
            let mut f = Fields(BTreeMap::new());
            event.record(&mut f);
            captured().lock().unwrap().push(AccessLine {
                level: *event.metadata().level(),
                explicit_root: event.parent().is_none() && !event.is_contextual(),
                fields: f.0,
            });
        }
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

fn capture_logs() {
    static SET: OnceLock<()> = OnceLock::new();
    SET.get_or_init(|| {
        let _ = tracing::subscriber::set_global_default(Capture);
    });
}

/// The access line whose `src.addr` is `src`.
fn find_access(src: &str) -> Option<AccessLine> {
    captured()
        .lock()
        .unwrap()
        .iter()
        .find(|l| l.shown("src.addr") == Some(src))
        .cloned()
}

/// What every access line has: ztunnel's target, parent, message, field names only, and the types it records.
fn assert_ztunnel_access_line(line: &AccessLine) {
    assert!(line.explicit_root, "{line:?}");
    assert_eq!(
        line.fields.get("message"),
        Some(&Logged::Shown("connection complete".into()))
    );
    for k in line.fields.keys().filter(|k| *k != "message") {
        assert!(
            ZTUNNEL_ACCESS_FIELDS.contains(&k.as_str()),
            "{k} is not one of ztunnel's access fields: {line:?}"
        );
    }
    for k in ["src.addr", "dst.addr", "dst.hbone_addr"] {
        if let Some(v) = line.fields.get(k) {
            assert!(matches!(v, Logged::Shown(_)), "{k}: {v:?}");
        }
    }
    for k in ["bytes_sent", "bytes_recv"] {
        assert!(line.u64(k).is_some(), "{k}: {line:?}");
    }
    for k in ZTUNNEL_ACCESS_FIELDS
        .iter()
        .filter(|k| !k.ends_with("addr") && !k.starts_with("bytes"))
    {
        if let Some(v) = line.fields.get(*k) {
            assert!(matches!(v, Logged::Str(_)), "{k}: {v:?}");
        }
    }
    let want = if line.fields.contains_key("error") {
        tracing::Level::ERROR
    } else {
        tracing::Level::INFO
    };
    assert_eq!(line.level, want, "{line:?}");
}

#[test]
fn access_log_has_ztunnels_scope_and_fields() {
    capture_logs();
    let h = Harness::telemetry(&wasm(), r#"{"accessLog": "on"}"#).unwrap();
    let mut c = rich_conn();
    c.src = "10.0.0.1:41111".parse().unwrap();
    h.open_close(&c, &close(100, 2000));
    let line = find_access("10.0.0.1:41111").expect("access log line");
    assert_ztunnel_access_line(&line);
    // A known source and destination over HBONE: every field of ztunnel's but `error`.
    let keys: Vec<&str> = line.fields.keys().map(String::as_str).collect();
    let mut want: Vec<&str> = ZTUNNEL_ACCESS_FIELDS
        .into_iter()
        .filter(|k| *k != "error")
        .chain(["message"])
        .collect();
    want.sort_unstable();
    assert_eq!(keys, want, "{line:?}");
    assert_eq!(line.str("src.cluster"), Some("Kubernetes"));
    assert_eq!(line.str("dst.cluster"), Some("Kubernetes"));
    assert_eq!(line.str("src.workload"), Some("client-7d9"));
    assert_eq!(line.str("src.namespace"), Some("shop"));
    assert_eq!(
        line.str("src.identity"),
        Some("spiffe://cluster.local/ns/shop/sa/frontend")
    );
    assert_eq!(line.shown("dst.addr"), Some("10.0.0.2:15008"));
    assert_eq!(line.shown("dst.hbone_addr"), Some("10.0.0.2:8080"));
    assert_eq!(
        line.str("dst.service"),
        Some("server.shop.svc.cluster.local")
    );
    assert_eq!(line.str("dst.workload"), Some("server"));
    assert_eq!(line.str("dst.namespace"), Some("shop"));
    assert_eq!(
        line.str("dst.identity"),
        Some("spiffe://cluster.local/ns/shop/sa/backend")
    );
    assert_eq!(line.str("direction"), Some("inbound"));
    // Inbound: sent is what the local workload sent back (ztunnel unflips Istio's metric directions for logs).
    assert_eq!(line.u64("bytes_sent"), Some(2000));
    assert_eq!(line.u64("bytes_recv"), Some(100));
    assert_eq!(line.str("duration"), Some("1500ms"));
}

#[test]
fn access_log_of_a_denial_is_an_error_line_with_the_reason() {
    capture_logs();
    // `json`, the value of earlier versions, still turns the log on.
    let h = Harness::telemetry(&wasm(), r#"{"accessLog": "json"}"#).unwrap();
    let mut c = conn(9999, None);
    c.src = "10.0.0.1:42222".parse().unwrap();
    c.hbone = false;
    let denied = CloseRecord {
        verdict: Verdict::Deny {
            by: "istio-authz".into(),
            reason: "allow policies exist, but none allowed".into(),
        },
        error: None,
        response_flags: "DENY",
        ..close(0, 0)
    };
    h.host().on_close(&Arc::new(c), &denied);
    h.host().flush_telemetry();
    let line = find_access("10.0.0.1:42222").expect("access log line");
    assert_ztunnel_access_line(&line);
    assert_eq!(line.level, tracing::Level::ERROR);
    assert_eq!(line.shown("dst.addr"), Some("10.0.0.2:9999"));
    assert_eq!(line.str("dst.workload"), Some("server"));
    assert_eq!(line.str("src.namespace"), Some("shop"));
    assert_eq!(line.str("direction"), Some("inbound"));
    assert_eq!(line.u64("bytes_sent"), Some(0));
    assert_eq!(line.u64("bytes_recv"), Some(0));
    assert_eq!(line.str("duration"), Some("1500ms"));
    for k in ["src.identity", "dst.identity", "dst.hbone_addr"] {
        assert!(
            !line.fields.contains_key(k),
            "no {k} on plaintext: {line:?}"
        );
    }
    assert_eq!(
        line.str("error"),
        Some("denied by istio-authz: allow policies exist, but none allowed")
    );
}

#[test]
fn access_log_off_writes_no_line() {
    capture_logs();
    let h = Harness::telemetry(&wasm(), r#"{"accessLog": "off"}"#).unwrap();
    let mut c = rich_conn();
    c.src = "10.0.0.1:43333".parse().unwrap();
    h.open_close(&c, &close(1, 1));
    assert!(find_access("10.0.0.1:43333").is_none());
}

#[test]
fn principal_without_spiffe_prefix_when_configured() {
    let h = Harness::telemetry(&wasm(), r#"{"spiffePrefix": false, "accessLog": "off"}"#).unwrap();
    h.open_close(&rich_conn(), &close(1, 1));
    let text = h.metrics_text();
    let s = &samples(&text, "istio_tcp_connections_opened_total")[0];
    assert_eq!(
        s.get("source_principal"),
        Some("cluster.local/ns/shop/sa/frontend")
    );
    assert_eq!(
        s.get("destination_principal"),
        Some("cluster.local/ns/shop/sa/backend")
    );
}

#[test]
fn bad_config_is_rejected() {
    let err = Harness::telemetry(&wasm(), r#"{"labels": ["reporter", "pod"]}"#).unwrap_err();
    assert!(err.contains("unknown label `pod`"), "{err}");
    let err = Harness::telemetry(&wasm(), r#"{"accessLog": "xml"}"#).unwrap_err();
    assert!(err.contains("accessLog"), "{err}");
    let err = Harness::telemetry(&wasm(), r#"{"maxSeries": 0}"#).unwrap_err();
    assert!(err.contains("maxSeries"), "{err}");
    let err = Harness::telemetry(&wasm(), r#"{"max_series": 5}"#).unwrap_err();
    assert!(err.contains("unknown key"), "{err}");
}
