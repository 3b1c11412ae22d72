//! The JSON log line format (`--log-format json`): ztunnel's keys, each field written straight into the line as it
//! is visited.
//!
//! A line carries what ztunnel's JSON format (`LOG_FORMAT=json`, `src/telemetry.rs` `IstioJsonFormat`) writes, in
//! its order: `level` (lower case), `time` (RFC 3339, microseconds, UTC), `scope` (the event's target, as it is:
//! `access` for an access line, a module path such as `weft_proxy::conn` otherwise), the event's fields at top level
//! (`message` among them), then each enclosing span from the root as a key of its name holding an object of its
//! fields. weft adds `target` (the same value as `scope`), which lines read before `scope` existed. Unlike ztunnel,
//! events the `log` crate's records became (rustls logs that way) are written without tracing-log's `log.*`
//! bookkeeping fields.
//!
//! What differs from a serializer is the cost: a value is escaped as it is formatted, never rendered into a `String`
//! of its own first, and a span keeps its fields as a ready JSON fragment (`"k":v,"k2":v2`) that a line copies,
//! never parsed back. Every connection writes an access line on each node, so this is on the data path of every
//! connection (it was 5 % of a node's CPU at a high connection rate). A span field recorded again after the span
//! was created is appended: the span's object then has the key twice and JSON readers take the later value.

use std::fmt::{self, Write as _};

use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_log::NormalizeEvent;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields};
use tracing_subscriber::registry::LookupSpan;

/// Formats events as JSON lines (see the module documentation).
#[derive(Debug, Clone, Copy, Default)]
pub struct JsonLine;

/// Formats a span's fields as a JSON fragment without braces, the form [`JsonLine`] copies into each line.
#[derive(Debug, Clone, Copy, Default)]
pub struct JsonSpanFields;

impl<S, N> FormatEvent<S, N> for JsonLine
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'w> FormatFields<'w> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut w: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        with_line_buffer(&mut w, |line| {
            let normalized = event.normalized_metadata();
            let meta = normalized.as_ref().unwrap_or_else(|| event.metadata());
            let from_log = normalized.is_some();
            line.push_str("{\"level\":\"");
            line.push_str(lower_case(meta.level()));
            write!(
                line,
                "\",\"time\":\"{}\",\"scope\":",
                humantime::format_rfc3339_micros(std::time::SystemTime::now())
            )?;
            push_str_escaped(line, meta.target());
            let mut fields = FieldWriter {
                w: &mut *line,
                first: false,
                from_log,
                result: Ok(()),
            };
            event.record(&mut fields);
            fields.result?;
            if let Some(scope) = ctx.event_scope() {
                for span in scope.from_root() {
                    let ext = span.extensions();
                    if let Some(f) = ext.get::<FormattedFields<N>>() {
                        line.push(',');
                        push_str_escaped(line, span.name());
                        line.push_str(":{");
                        line.push_str(f);
                        line.push('}');
                    }
                }
            }
            line.push_str(",\"target\":");
            push_str_escaped(line, meta.target());
            line.push_str("}\n");
            Ok(())
        })
    }
}

impl<'w> FormatFields<'w> for JsonSpanFields {
    fn format_fields<R: tracing_subscriber::field::RecordFields>(
        &self,
        mut w: Writer<'w>,
        fields: R,
    ) -> fmt::Result {
        with_line_buffer(&mut w, |buf| {
            let mut v = FieldWriter {
                w: buf,
                first: true,
                from_log: false,
                result: Ok(()),
            };
            fields.record(&mut v);
            v.result
        })
    }

    fn add_fields(
        &self,
        current: &'w mut FormattedFields<Self>,
        fields: &tracing::span::Record<'_>,
    ) -> fmt::Result {
        let first = current.is_empty();
        let mut w = current.as_writer();
        with_line_buffer(&mut w, |buf| {
            let mut v = FieldWriter {
                w: buf,
                first,
                from_log: false,
                result: Ok(()),
            };
            fields.record(&mut v);
            v.result
        })
    }
}

/// A level as ztunnel writes it: lower case.
fn lower_case(level: &tracing::Level) -> &'static str {
    match *level {
        tracing::Level::TRACE => "trace",
        tracing::Level::DEBUG => "debug",
        tracing::Level::INFO => "info",
        tracing::Level::WARN => "warn",
        tracing::Level::ERROR => "error",
    }
}

thread_local! {
    /// The line being formatted: a `String` of the thread's own, kept between lines.
    static LINE: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
}

/// Formats into a cleared buffer of this thread's, then hands the result to `w` in one call. `w` writes through
/// a `dyn fmt::Write`, one indirect call per piece; a line is some 150 pieces. (A line formatted while another is,
/// a field's `Debug` that logs, gets a buffer of its own.)
fn with_line_buffer(w: &mut Writer<'_>, f: impl FnOnce(&mut String) -> fmt::Result) -> fmt::Result {
    LINE.with(|cell| match cell.try_borrow_mut() {
        Ok(mut line) => {
            line.clear();
            f(&mut line)?;
            let r = w.write_str(&line);
            // A rare huge line does not stay resident in every thread that wrote one.
            if line.capacity() > 64 * 1024 {
                *line = String::new();
            }
            r
        }
        Err(_) => {
            let mut line = String::new();
            f(&mut line)?;
            w.write_str(&line)
        }
    })
}

/// Writes visited fields as `"name":value` pairs, a comma before each but (when `first`) the first.
struct FieldWriter<'a> {
    w: &'a mut String,
    first: bool,
    /// The event came from the `log` crate: its `log.*` fields (target, module, file, line) are left out.
    from_log: bool,
    result: fmt::Result,
}

impl FieldWriter<'_> {
    /// Writes the separator and the key, unless an earlier write failed or the field is tracing-log's bookkeeping.
    fn key(&mut self, field: &Field) -> bool {
        if self.result.is_err() || (self.from_log && field.name().starts_with("log.")) {
            return false;
        }
        if !std::mem::take(&mut self.first) {
            self.w.push(',');
        }
        push_str_escaped(self.w, field.name());
        self.w.push(':');
        true
    }

    fn raw(&mut self, field: &Field, value: fmt::Arguments<'_>) {
        if self.key(field) {
            self.result = self.w.write_fmt(value);
        }
    }
}

impl Visit for FieldWriter<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        if self.key(field) {
            push_str_escaped(self.w, value);
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if self.key(field) {
            self.w.push('"');
            self.result = write!(Escaper(&mut *self.w), "{value:?}");
            self.w.push('"');
        }
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.raw(field, format_args!("{value}"));
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.raw(field, format_args!("{value}"));
    }

    // 128-bit integers take the default path (`record_debug`): a string, exact where a JSON reader's number is not.

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.raw(field, format_args!("{value}"));
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        if value.is_finite() {
            // Debug keeps a fractional part (`1.0`), so the value reads back as a float.
            self.raw(field, format_args!("{value:?}"));
        } else {
            self.raw(field, format_args!("null"));
        }
    }
}

/// `s` as a JSON string, quotes included.
fn push_str_escaped(out: &mut String, s: &str) {
    out.push('"');
    escape_into(out, s);
    out.push('"');
}

/// A writer that escapes what passes through it for the inside of a JSON string.
struct Escaper<'a>(&'a mut String);

impl fmt::Write for Escaper<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        escape_into(self.0, s);
        Ok(())
    }
}

/// For each byte: 0 when it stands for itself in a JSON string, else the letter of its escape (`u`: `\u00XX`).
const ESCAPE: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut b = 0;
    while b < 0x20 {
        t[b] = b'u';
        b += 1;
    }
    t[0x08] = b'b';
    t[0x09] = b't';
    t[0x0a] = b'n';
    t[0x0c] = b'f';
    t[0x0d] = b'r';
    t[b'"' as usize] = b'"';
    t[b'\\' as usize] = b'\\';
    t
};

/// Appends `s` escaped for the inside of a JSON string: runs that need nothing are copied whole, found eight
/// bytes at a time.
fn escape_into(out: &mut String, s: &str) {
    let bytes = s.as_bytes();
    let mut start = 0;
    let mut i = 0;
    while i < bytes.len() {
        if let Some(word) = bytes.get(i..i + 8)
            && let Ok(word) = <[u8; 8]>::try_from(word)
            && !any_needs_escape(u64::from_le_bytes(word))
        {
            i += 8;
            continue;
        }
        let b = bytes[i];
        let esc = ESCAPE[usize::from(b)];
        if esc != 0 {
            // Only ASCII bytes are escaped, so `start..i` and `i + 1..` are on character boundaries.
            out.push_str(&s[start..i]);
            out.push('\\');
            if esc == b'u' {
                const HEX: &[u8; 16] = b"0123456789abcdef";
                out.push_str("u00");
                out.push(char::from(HEX[usize::from(b >> 4)]));
                out.push(char::from(HEX[usize::from(b & 0xf)]));
            } else {
                out.push(char::from(esc));
            }
            start = i + 1;
        }
        i += 1;
    }
    out.push_str(&s[start..]);
}

/// Whether any of the eight bytes in `w` is one [`ESCAPE`] escapes: a control character, `"` or `\`. (For a byte
/// value n < 0x80, `(x - n) & !x & 0x80` in every lane is non-zero in some lane exactly when some byte of x is
/// below n; equality is "below 1" after an XOR.)
fn any_needs_escape(w: u64) -> bool {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let below = |x: u64, n: u8| x.wrapping_sub(ONES * u64::from(n)) & !x & HIGH;
    let control = below(w, 0x20);
    let quote = below(w ^ (ONES * u64::from(b'"')), 1);
    let backslash = below(w ^ (ONES * u64::from(b'\\')), 1);
    control | quote | backslash != 0
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // a test panics to fail

    use std::io;
    use std::sync::{Arc, Mutex};

    use serde_json::Value;
    use tracing_subscriber::layer::SubscriberExt;

    use super::*;

    /// A writer both formats write into.
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

    impl Sink {
        fn lines(&self) -> Vec<Value> {
            let bytes = self.0.lock().unwrap();
            std::str::from_utf8(&bytes)
                .unwrap()
                .lines()
                .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
                .collect()
        }
    }

    /// Runs `f` with this module's format as the subscriber; returns what it wrote.
    fn with_weft_json(f: impl FnOnce()) -> Sink {
        let sink = Sink::default();
        let w = sink.clone();
        let layer = tracing_subscriber::fmt::layer()
            .event_format(JsonLine)
            .fmt_fields(JsonSpanFields)
            .with_writer(move || w.clone());
        tracing::subscriber::with_default(tracing_subscriber::registry().with(layer), f);
        sink
    }

    /// Events of every field kind, in nested spans, one with a field recorded after it was created.
    fn emit() {
        struct Shown;
        impl fmt::Display for Shown {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a \"shown\" value\twith\u{1} control")
            }
        }
        tracing::info!(target: "plain", "no span");
        let outer = tracing::info_span!(
            "inbound",
            conn = 7u64,
            peer = "spiffe://td/ns/a/sa/b",
            late = tracing::field::Empty
        );
        let _o = outer.enter();
        outer.record("late", true);
        let inner = tracing::info_span!("relay");
        let _i = inner.enter();
        tracing::warn!(
            target: "access",
            conn = 7u64,
            neg = -3i64,
            big = u128::MAX,
            ratio = 0.5f64,
            whole = 2.0f64,
            nan = f64::NAN,
            ok = false,
            addr = %std::net::SocketAddr::from(([10, 0, 0, 1], 8080)),
            shown = %Shown,
            list = ?vec!["x", "y\\z"],
            text = "quote \" backslash \\ newline \n unicode é ✓",
            empty = "",
            "connection {} complete", "7"
        );
    }

    fn capture(json: bool) -> Vec<Value> {
        let sink = Sink::default();
        let w = sink.clone();
        let make = move || w.clone();
        if json {
            let layer = tracing_subscriber::fmt::layer()
                .json()
                .flatten_event(true)
                .with_current_span(false)
                .with_writer(make);
            tracing::subscriber::with_default(tracing_subscriber::registry().with(layer), emit);
        } else {
            let layer = tracing_subscriber::fmt::layer()
                .event_format(JsonLine)
                .fmt_fields(JsonSpanFields)
                .with_writer(make);
            tracing::subscriber::with_default(tracing_subscriber::registry().with(layer), emit);
        }
        sink.lines()
    }

    /// The keys only this format writes (tracing-subscriber's has `timestamp` and `spans` instead), or writes
    /// otherwise (`level` in lower case).
    const OURS_ONLY: [&str; 4] = ["level", "time", "scope", "target"];

    #[test]
    fn event_fields_read_back_as_tracing_subscribers_json_format_writes_them() {
        let ours = capture(false);
        let theirs = capture(true);
        assert_eq!(ours.len(), 2);
        for (o, t) in ours.iter().zip(theirs.iter()) {
            let (o, t) = (o.as_object().unwrap(), t.as_object().unwrap());
            // Every event field, with the value and JSON type tracing-subscriber gives it.
            for (k, v) in t {
                if !["timestamp", "level", "target", "spans"].contains(&k.as_str()) {
                    assert_eq!(o.get(k), Some(v), "{k}");
                }
            }
            let spans = o
                .keys()
                .filter(|k| !t.contains_key(*k) && !OURS_ONLY.contains(&k.as_str()));
            assert_eq!(
                spans.count(),
                t.get("spans").map_or(0, |s| s.as_array().unwrap().len())
            );
        }
        let access = &ours[1];
        assert_eq!(access["scope"], "access");
        assert_eq!(access["level"], "warn");
        assert_eq!(access["message"], "connection 7 complete");
        assert_eq!(access["whole"], 2.0);
        assert_eq!(access["nan"], Value::Null);
        assert_eq!(
            access["text"],
            "quote \" backslash \\ newline \n unicode é ✓"
        );
        assert_eq!(
            access["inbound"],
            serde_json::json!({"conn": 7, "peer": "spiffe://td/ns/a/sa/b", "late": true})
        );
        assert_eq!(access["relay"], serde_json::json!({}));
    }

    #[test]
    fn control_characters_are_escaped_and_the_line_is_one_line() {
        let mut out = String::new();
        escape_into(&mut out, "a\u{0}b\u{1f}c\u{8}\u{c}\u{7f}");
        assert_eq!(out, "a\\u0000b\\u001fc\\b\\f\u{7f}");
        let sink = with_weft_json(|| {
            let s = tracing::info_span!("s", f = "x\ny");
            let _e = s.enter();
            tracing::error!(detail = ?"multi\nline", log.kept = 1u64, "bad\r\nthing");
        });
        let bytes = sink.0.lock().unwrap().clone();
        let text = String::from_utf8(bytes).unwrap();
        assert_eq!(text.matches('\n').count(), 1, "{text}");
        let v: Value = serde_json::from_str(text.trim_end()).unwrap();
        assert_eq!(v["level"], "error");
        assert_eq!(v["message"], "bad\r\nthing");
        assert_eq!(v["detail"], "\"multi\\nline\"");
        assert_eq!(v["s"]["f"], "x\ny");
        // Only a `log` record's bookkeeping fields are left out, not a tracing event's own field of that name.
        assert_eq!(v["log.kept"], 1);
    }

    #[test]
    fn a_log_crate_record_has_its_own_target_and_level_and_no_bookkeeping_fields() {
        let sink = with_weft_json(|| {
            let args = format_args!("peer sent {} alert", "close_notify");
            let record = log::Record::builder()
                .args(args)
                .level(log::Level::Warn)
                .target("rustls::conn")
                .file(Some("conn.rs"))
                .line(Some(12))
                .build();
            tracing_log::format_trace(&record).unwrap();
        });
        let lines = sink.lines();
        assert_eq!(lines.len(), 1);
        let v = lines[0].as_object().unwrap();
        assert_eq!(v["scope"], "rustls::conn");
        assert_eq!(v["target"], "rustls::conn");
        assert_eq!(v["level"], "warn");
        assert_eq!(v["message"], "peer sent close_notify alert");
        assert!(!v.keys().any(|k| k.starts_with("log.")), "{v:?}");
    }

    #[test]
    fn every_byte_and_position_escapes_as_serde_json_does() {
        // Each ASCII byte at each offset of a 20-byte string (so the eight-byte scan and the tail both see it).
        for b in 0u8..0x80 {
            for at in 0..20 {
                let mut s = vec![b'a'; 20];
                s[at] = b;
                let s = String::from_utf8(s).unwrap();
                let mut ours = String::new();
                push_str_escaped(&mut ours, &s);
                assert_eq!(
                    ours,
                    serde_json::to_string(&s).unwrap(),
                    "byte {b:#x} at {at}"
                );
            }
        }
        let mixed = "é✓ \u{1}\"\\ plain ascii run \n 🦀";
        let mut ours = String::new();
        push_str_escaped(&mut ours, mixed);
        assert_eq!(ours, serde_json::to_string(mixed).unwrap());
    }
}
