//! A JSON log line has ztunnel's keys and types: `level` in lower case, `time` in RFC 3339 with microseconds, `scope`
//! the event's target, `message` and the event's fields at top level, each enclosing span an object under its name.
//!
//! The expected keys come from ztunnel's `src/telemetry.rs` (`IstioJsonFormat::format_event`) at commit
//! 62d826530e5ce85764e309170205b293efcbc80b of github.com/istio/ztunnel: `level`
//! (`meta.level().as_str().to_ascii_lowercase()`), `time` (tracing-subscriber's `SystemTime`, UTC with six
//! fractional digits), `scope` (`meta.target()`, unchanged), the event's fields, then each span from the root
//! under its name. weft adds `target` only.

#![allow(clippy::unwrap_used, clippy::panic)]

use std::collections::BTreeSet;
use std::io;
use std::sync::{Arc, Mutex};

use serde_json::{Map, Value};
use tracing_subscriber::layer::SubscriberExt;
use weft_logging::json::{JsonLine, JsonSpanFields};

#[derive(Clone, Default)]
struct Sink(Arc<Mutex<Vec<u8>>>);

impl io::Write for Sink {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The lines `f` logs through weft's JSON format, each an object.
fn lines(f: impl FnOnce()) -> Vec<Map<String, Value>> {
    raw_lines(f)
        .iter()
        .map(|l| match serde_json::from_str(l) {
            Ok(Value::Object(m)) => m,
            other => panic!("{l}: {other:?}"),
        })
        .collect()
}

/// The lines `f` logs through weft's JSON format, as written.
fn raw_lines(f: impl FnOnce()) -> Vec<String> {
    let sink = Sink::default();
    let w = sink.clone();
    let layer = tracing_subscriber::fmt::layer()
        .event_format(JsonLine)
        .fmt_fields(JsonSpanFields)
        .with_writer(move || w.clone());
    tracing::subscriber::with_default(tracing_subscriber::registry().with(layer), f);
    let bytes = sink.0.lock().unwrap().clone();
    String::from_utf8(bytes)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

fn keys(m: &Map<String, Value>) -> BTreeSet<&str> {
    m.keys().map(String::as_str).collect()
}

/// `time` as ztunnel writes it: `YYYY-MM-DDTHH:MM:SS.ffffffZ`, and a valid RFC 3339 instant.
fn assert_ztunnel_time(v: &Value) {
    let t = v
        .as_str()
        .unwrap_or_else(|| panic!("time not a string: {v}"));
    assert_eq!(t.len(), "2026-12-04T18:15:17.123456Z".len(), "{t}");
    assert!(t.ends_with('Z') && t.as_bytes()[19] == b'.', "{t}");
    humantime::parse_rfc3339(t).unwrap_or_else(|e| panic!("{t}: {e}"));
}

#[test]
fn an_event_in_spans_has_ztunnels_keys_and_types() {
    let got = lines(|| {
        let src = std::net::SocketAddr::from(([10, 0, 0, 1], 4000));
        let outer = tracing::info_span!("inbound", conn = 7u64, peer = "10.0.0.1:4000");
        let _o = outer.enter();
        let inner = tracing::info_span!("relay");
        let _i = inner.enter();
        tracing::warn!(
            target: "weft_proxy::conn",
            bytes_sent = 12u64,
            src.addr = %src,
            delta = -3i64,
            ok = true,
            ratio = 0.5f64,
            "upstream {} closed",
            "early"
        );
    });
    assert_eq!(got.len(), 1);
    let v = &got[0];
    assert_eq!(
        keys(v),
        BTreeSet::from([
            "level",
            "time",
            "scope",
            "message",
            "bytes_sent",
            "src.addr",
            "delta",
            "ok",
            "ratio",
            "inbound",
            "relay",
            "target",
        ])
    );
    assert_eq!(v["level"], "warn");
    assert_ztunnel_time(&v["time"]);
    assert_eq!(v["scope"], "weft_proxy::conn");
    assert_eq!(v["target"], v["scope"]);
    assert_eq!(v["message"], "upstream early closed");
    assert_eq!(v["src.addr"], "10.0.0.1:4000");
    assert_eq!(v["bytes_sent"], 12);
    assert!(v["bytes_sent"].is_u64());
    assert_eq!(v["delta"], -3);
    assert_eq!(v["ok"], true);
    assert_eq!(v["ratio"], 0.5);
    assert_eq!(
        v["inbound"],
        serde_json::json!({"conn": 7, "peer": "10.0.0.1:4000"})
    );
    assert_eq!(v["relay"], serde_json::json!({}));
}

#[test]
fn keys_come_in_ztunnels_order() {
    let raw = raw_lines(|| {
        let s = tracing::info_span!("inbound", conn = 7u64);
        let _e = s.enter();
        tracing::info!(target: "access", bytes_sent = 1u64, "connection complete");
    });
    assert_eq!(raw.len(), 1);
    let line = &raw[0];
    // level, time, scope, the event's fields (message first), the spans; then weft's `target`.
    let at = |k: &str| {
        line.find(&format!("\"{k}\":"))
            .unwrap_or_else(|| panic!("{k} in {line}"))
    };
    assert!(
        line.starts_with("{\"level\":\"info\",\"time\":\""),
        "{line}"
    );
    let order = [
        "level",
        "time",
        "scope",
        "message",
        "bytes_sent",
        "inbound",
        "target",
    ]
    .map(at);
    assert!(order.is_sorted(), "{order:?} in {line}");
}

#[test]
fn every_level_is_lower_case_and_an_access_line_has_scope_access() {
    let got = lines(|| {
        tracing::error!(target: "access", error = "refused", "connection complete");
        tracing::warn!("w");
        tracing::info!("i");
        tracing::debug!("d");
        tracing::trace!("t");
    });
    let levels: Vec<&str> = got.iter().map(|v| v["level"].as_str().unwrap()).collect();
    assert_eq!(levels, ["error", "warn", "info", "debug", "trace"]);
    let access = &got[0];
    assert_eq!(
        keys(access),
        BTreeSet::from(["level", "time", "scope", "message", "error", "target"])
    );
    assert_eq!(access["scope"], "access");
    assert_eq!(access["message"], "connection complete");
    // Outside any span, with the default target: the scope is the module path.
    assert_eq!(got[1]["scope"], module_path!());
    for v in &got {
        assert_ztunnel_time(&v["time"]);
    }
}
