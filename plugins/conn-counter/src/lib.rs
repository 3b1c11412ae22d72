//! `conn-counter`: a weft telemetry plugin that counts connections opened and closed, bytes each way and open
//! connections, per direction and destination workload, plus a histogram of connection durations.
//!
//! Config (JSON, optional): `{"prefix": "conn_counter"}` — the prefix of the metric names (default
//! `conn_counter`).

use weft_plugin_sdk::json::Value;
use weft_plugin_sdk::metrics::{Counter, Gauge, Histogram};
use weft_plugin_sdk::{CloseInfo, ConnectionInfo, Direction, Telemetry, Verdict};

/// The plugin's metric handles.
pub struct ConnCounter {
    live: std::collections::HashSet<u64>,
    opened: Counter,
    closed: Counter,
    bytes: Counter,
    open: Gauge,
    duration: Histogram,
}

fn direction(info: &ConnectionInfo<'_>) -> &'static str {
    match info.conn.direction {
        Direction::Inbound => "inbound",
        Direction::Outbound => "outbound",
    }
}

fn destination<'a>(info: &ConnectionInfo<'a>) -> &'a str {
    info.destination_workload
        .map(|w| w.name.as_str())
        .unwrap_or("unknown")
}

impl Telemetry for ConnCounter {
    fn configure(config: &str) -> Result<Self, String> {
        let prefix = if config.trim().is_empty() {
            "conn_counter".to_string()
        } else {
            let v: Value = config.parse().map_err(|e| format!("config: {e}"))?;
            v.get("prefix")
                .map(|p| {
                    p.as_str()
                        .map(str::to_string)
                        .ok_or("prefix must be a string")
                })
                .transpose()?
                .unwrap_or_else(|| "conn_counter".to_string())
        };
        let labels = ["direction", "destination_workload"];
        Ok(ConnCounter {
            live: std::collections::HashSet::new(),
            opened: Counter::define(
                &format!("{prefix}_opened_total"),
                "Connections opened.",
                &labels,
            )?,
            closed: Counter::define(
                &format!("{prefix}_closed_total"),
                "Connections closed.",
                &["direction", "destination_workload", "verdict"],
            )?,
            bytes: Counter::define(
                &format!("{prefix}_bytes_total"),
                "Bytes relayed, by way (sent: source to destination).",
                &["direction", "way"],
            )?,
            open: Gauge::define(
                &format!("{prefix}_open"),
                "Connections open now.",
                &["direction"],
            )?,
            duration: Histogram::define(
                &format!("{prefix}_duration_seconds"),
                "Connection durations.",
                &["direction"],
                &[0.001, 0.01, 0.1, 1.0, 10.0, 60.0],
            )?,
        })
    }

    fn on_open(&mut self, conn: &ConnectionInfo<'_>) {
        let dir = direction(conn);
        self.opened.inc(&[dir, destination(conn)]);
        if self.live.insert(conn.conn.id) {
            self.open.add(&[dir], 1);
        }
    }

    fn on_close(&mut self, conn: &ConnectionInfo<'_>, close: &CloseInfo) {
        let dir = direction(conn);
        let verdict = match close.verdict {
            Verdict::Allow => "allow",
            Verdict::Deny(_) => "deny",
        };
        self.closed.inc(&[dir, destination(conn), verdict]);
        self.bytes.add(&[dir, "sent"], close.bytes_sent);
        self.bytes.add(&[dir, "received"], close.bytes_received);
        if self.live.remove(&conn.conn.id) {
            self.open.add(&[dir], -1);
        }
        self.duration
            .observe(&[dir], close.duration_ns as f64 / 1e9);
    }
}

weft_plugin_sdk::export_telemetry!(ConnCounter);
