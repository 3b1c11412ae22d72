//! `port-allowlist`: a weft transport-policy plugin that allows a connection only when its destination port is
//! listed and, if configured, its peer identity or peer namespace is listed.
//!
//! Config (JSON; every key optional, an empty or missing list allows anything for that check):
//!
//! ```json
//! {
//!   "ports": [80, 443, "8000-8099"],
//!   "principals": ["spiffe://cluster.local/ns/shop/sa/frontend", "spiffe://cluster.local/ns/ops/*"],
//!   "namespaces": ["shop"],
//!   "deny_message": "blocked by the port allow-list"
//! }
//! ```
//!
//! A principal ending in `*` matches by prefix. A connection without a peer identity (inbound plaintext) fails any
//! non-empty `principals` or `namespaces` check.

use weft_plugin_sdk::json::Value;
use weft_plugin_sdk::metrics::Counter;
use weft_plugin_sdk::net::PortSet;
use weft_plugin_sdk::{Connection, Decision, TransportPolicy, Workloads};

/// The allow-list's rules, parsed from the config (kept apart from the plugin so the logic can be benchmarked
/// natively).
#[derive(Debug, Clone, Default)]
pub struct Rules {
    ports: PortSet,
    principals: Vec<String>,
    prefixes: Vec<String>,
    namespaces: Vec<String>,
    deny_message: String,
}

impl Rules {
    /// Parses the JSON config.
    pub fn parse(config: &str) -> Result<Self, String> {
        let config = config.trim();
        let v: Value = if config.is_empty() {
            Value::Object(Vec::new())
        } else {
            config.parse().map_err(|e| format!("config: {e}"))?
        };
        // A config handed over as a JSON string holding JSON.
        let v = match &v {
            Value::String(inner) => inner.parse().map_err(|e| format!("config: {e}"))?,
            _ => v,
        };
        if v.as_object().is_none() {
            return Err("config must be a JSON object".into());
        }
        let mut rules = Rules {
            deny_message: "not in the port allow-list".into(),
            ..Rules::default()
        };
        for (key, value) in v.as_object().unwrap_or_default() {
            match key.as_str() {
                "ports" => {
                    for p in list(value, key)? {
                        match p {
                            Value::Number(_) => {
                                let port = p
                                    .as_u64()
                                    .and_then(|n| u16::try_from(n).ok())
                                    .ok_or_else(|| format!("ports: bad port {p:?}"))?;
                                rules.ports.insert(port);
                            }
                            Value::String(s) => {
                                let set: PortSet = s.parse().map_err(|e| format!("ports: {e}"))?;
                                rules.ports.extend(&set);
                            }
                            other => return Err(format!("ports: bad entry {other:?}")),
                        }
                    }
                }
                "principals" => {
                    for p in strings(value, key)? {
                        match p.strip_suffix('*') {
                            Some(prefix) => rules.prefixes.push(prefix.to_string()),
                            None => rules.principals.push(p),
                        }
                    }
                }
                "namespaces" => rules.namespaces = strings(value, key)?,
                "deny_message" => {
                    rules.deny_message = value
                        .as_str()
                        .ok_or("deny_message must be a string")?
                        .to_string()
                }
                other => return Err(format!("unknown config key `{other}`")),
            }
        }
        Ok(rules)
    }

    /// The decision for a destination port and an optional peer identity.
    pub fn decide(&self, port: u16, peer: Option<&str>) -> Result<(), String> {
        if !self.ports.is_empty() && !self.ports.contains(port) {
            return Err(format!("{}: port {port}", self.deny_message));
        }
        if !self.principals.is_empty() || !self.prefixes.is_empty() {
            let ok = peer.is_some_and(|p| {
                self.principals.iter().any(|x| x == p)
                    || self.prefixes.iter().any(|x| p.starts_with(x.as_str()))
            });
            if !ok {
                return Err(format!(
                    "{}: peer {}",
                    self.deny_message,
                    peer.unwrap_or("(none)")
                ));
            }
        }
        if !self.namespaces.is_empty() {
            let ns = peer
                .and_then(|p| p.split("/ns/").nth(1))
                .and_then(|r| r.split('/').next());
            if !ns.is_some_and(|ns| self.namespaces.iter().any(|x| x == ns)) {
                return Err(format!(
                    "{}: namespace {}",
                    self.deny_message,
                    ns.unwrap_or("(none)")
                ));
            }
        }
        Ok(())
    }
}

fn list<'a>(value: &'a Value, key: &str) -> Result<&'a [Value], String> {
    value
        .as_array()
        .ok_or_else(|| format!("{key} must be a list"))
}

fn strings(value: &Value, key: &str) -> Result<Vec<String>, String> {
    list(value, key)?
        .iter()
        .map(|v| {
            v.as_str()
                .map(str::to_string)
                .ok_or_else(|| format!("{key}: entries must be strings"))
        })
        .collect()
}

/// The plugin: the rules plus a deny counter.
pub struct PortAllowlist {
    rules: Rules,
    denied: Counter,
}

impl TransportPolicy for PortAllowlist {
    fn configure(config: &str) -> Result<Self, String> {
        let rules = Rules::parse(config)?;
        let denied = Counter::define(
            "port_allowlist_denied_total",
            "Connections the port allow-list denied.",
            &["direction"],
        )?;
        Ok(PortAllowlist { rules, denied })
    }

    fn authorize(&mut self, conn: &Connection, _workloads: &Workloads<'_>) -> Decision {
        match self
            .rules
            .decide(conn.destination.port, conn.peer_identity.as_deref())
        {
            Ok(()) => Decision::Allow,
            Err(reason) => {
                let direction = match conn.direction {
                    weft_plugin_sdk::Direction::Inbound => "inbound",
                    weft_plugin_sdk::Direction::Outbound => "outbound",
                };
                self.denied.inc(&[direction]);
                Decision::Deny(reason)
            }
        }
    }
}

weft_plugin_sdk::export_policy!(PortAllowlist);
