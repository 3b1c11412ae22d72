//! `istio-authz`: a weft transport-policy plugin that enforces Istio's L4 authorization policies
//! (`istio.security.Authorization`) exactly as ztunnel does, on the destination side.
//!
//! The policies come through the platform's state-update path (whatever their source: the local config file or
//! xDS); the plugin indexes them once per update (by namespace, global, and by `namespace/name` for the policies
//! workloads select), so a decision only evaluates the policies that apply to the destination workload. The
//! matching and the decision order live in [`engine`] (plain `std` Rust, also benchmarked natively).
//!
//! A denial's reason is ztunnel's: `explicitly denied by: <namespace>/<name>` or `allow policies exist, but none
//! allowed`; the platform turns it into a 401 for HBONE and a closed connection for plaintext, and re-checks live
//! connections when the policies change.
//!
//! Config (JSON, optional; every key optional):
//!
//! ```json
//! {"logDenials": true, "logDryRun": true}
//! ```
//!
//! - `logDenials`: log each denial with the connection and the policy (default true; the host rate-limits logs).
//! - `logDryRun`: log what dry-run policies would have done (default true).
//!
//! Metrics: `istio_authz_denials_total{policy}` (`policy` is `namespace/name`, or `-` when no ALLOW matched)
//! and `istio_authz_dry_run_matches_total{policy,action}`.

pub mod engine;

use engine::{
    Action, Conn, Denial, DryRun, Index, Match, Net, Policy, Reach, SaMatch, Scope, StrMatch,
    Target,
};
use weft_plugin_sdk::hash;
use weft_plugin_sdk::json::Value;
use weft_plugin_sdk::metrics::Counter;
use weft_plugin_sdk::{
    AuthorizationPolicy, Connection, ConnectionScope, Decision, DestinationScope, Direction,
    PolicyAction, PolicyMatch, PolicyScope, StateKinds, StringMatch, TransportPolicy,
    WorkloadCache, Workloads,
};

/// The plugin's options.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Options {
    /// Log each denial.
    pub log_denials: bool,
    /// Log dry-run results.
    pub log_dry_run: bool,
}

impl Options {
    /// Parses the JSON config (empty: defaults).
    pub fn parse(config: &str) -> Result<Self, String> {
        let mut opts = Options {
            log_denials: true,
            log_dry_run: true,
        };
        let config = config.trim();
        if config.is_empty() {
            return Ok(opts);
        }
        let v: Value = config.parse().map_err(|e| format!("config: {e}"))?;
        let fields = v.as_object().ok_or("config must be a JSON object")?;
        for (key, value) in fields {
            let flag = || {
                value
                    .as_bool()
                    .ok_or_else(|| format!("config: `{key}` must be a boolean"))
            };
            match key.as_str() {
                "logDenials" => opts.log_denials = flag()?,
                "logDryRun" => opts.log_dry_run = flag()?,
                other => return Err(format!("config: unknown key `{other}`")),
            }
        }
        Ok(opts)
    }
}

fn string_match(m: StringMatch) -> StrMatch {
    match m {
        StringMatch::Exact(s) => StrMatch::Exact(s),
        StringMatch::Prefix(s) => StrMatch::Prefix(s),
        StringMatch::Suffix(s) => StrMatch::Suffix(s),
        StringMatch::Presence => StrMatch::Presence,
    }
}

fn nets(list: Vec<weft_plugin_sdk::bindings::weft::plugin::types::Cidr>) -> Vec<Net> {
    list.iter()
        .map(|c| Net::new((&c.address).into(), c.prefix_len))
        .collect()
}

fn sas(list: Vec<weft_plugin_sdk::ServiceAccountMatch>) -> Vec<SaMatch> {
    list.into_iter()
        .map(|m| SaMatch {
            namespace: m.namespace,
            service_account: m.service_account,
        })
        .collect()
}

fn strings(list: Vec<StringMatch>) -> Vec<StrMatch> {
    list.into_iter().map(string_match).collect()
}

fn policy_match(m: PolicyMatch) -> Match {
    Match {
        namespaces: strings(m.namespaces),
        not_namespaces: strings(m.not_namespaces),
        principals: strings(m.principals),
        not_principals: strings(m.not_principals),
        service_accounts: sas(m.service_accounts),
        not_service_accounts: sas(m.not_service_accounts),
        source_ips: nets(m.source_ips),
        not_source_ips: nets(m.not_source_ips),
        destination_ips: nets(m.destination_ips),
        not_destination_ips: nets(m.not_destination_ips),
        destination_ports: m.destination_ports,
        not_destination_ports: m.not_destination_ports,
    }
}

/// Converts the platform's policy (WIT form) into the engine's, consuming it (no copies of the strings).
pub fn convert(p: AuthorizationPolicy) -> Policy {
    Policy {
        name: p.name,
        namespace: p.namespace,
        scope: match p.scope {
            PolicyScope::Global => Scope::Global,
            PolicyScope::Namespace => Scope::Namespace,
            PolicyScope::WorkloadSelector => Scope::WorkloadSelector,
        },
        action: match p.action {
            PolicyAction::Allow => Action::Allow,
            PolicyAction::Deny => Action::Deny,
        },
        dry_run: p.dry_run,
        rules: p
            .rules
            .into_iter()
            .map(|rule| {
                rule.clauses
                    .into_iter()
                    .map(|clause| clause.matches.into_iter().map(policy_match).collect())
                    .collect()
            })
            .collect(),
    }
}

/// Reports dry-run results to the log and a counter.
struct DryRunReport<'a> {
    log: bool,
    counter: &'a Counter,
    conn: &'a Connection,
}

impl DryRun for DryRunReport<'_> {
    fn matched(&mut self, key: &str, action: Action) {
        self.counter.inc(&[key, action.as_str()]);
        if self.log {
            weft_plugin_sdk::info!(
                "dry-run: {} policy match: {key} ({})",
                action.as_str(),
                describe(self.conn)
            );
        }
    }

    fn no_allow_matched(&mut self) {
        if self.log {
            weft_plugin_sdk::info!("dry-run: no allow policies match ({})", describe(self.conn));
        }
    }
}

fn describe(conn: &Connection) -> String {
    format!(
        "{}({})->{}",
        conn.source_addr(),
        conn.peer_identity.as_deref().unwrap_or("None"),
        conn.destination_addr()
    )
}

/// The policy index with what was resolved against it: the two are replaced together, so a target never outlives
/// the index it points into.
#[derive(Default)]
struct Policies {
    index: Index,
    /// Each destination workload resolved against `index` (its namespace's policies and the ones that select it),
    /// under its key: two host calls, their strings and the lookups saved on every decision but a workload's
    /// first.
    targets: WorkloadCache<Target>,
}

/// The plugin: options, the policy index and its counters.
pub struct IstioAuthz {
    options: Options,
    policies: Policies,
    denials: Counter,
    dry_runs: Counter,
}

impl TransportPolicy for IstioAuthz {
    fn configure(config: &str) -> Result<Self, String> {
        Ok(IstioAuthz {
            options: Options::parse(config)?,
            policies: Policies::default(),
            denials: Counter::define(
                "istio_authz_denials_total",
                "Connections istio-authz denied, by the policy that denied (`-`: no ALLOW policy matched).",
                &["policy"],
            )?,
            dry_runs: Counter::define(
                "istio_authz_dry_run_matches_total",
                "Dry-run authorization policies that matched a connection.",
                &["policy", "action"],
            )?,
        })
    }

    fn state_kinds(&self) -> StateKinds {
        StateKinds::AUTHORIZATION_POLICIES
    }

    fn update_policies(&mut self, policies: Vec<AuthorizationPolicy>) -> Result<(), String> {
        self.policies = Policies {
            index: Index::build(policies.into_iter().map(convert).collect()),
            targets: WorkloadCache::default(),
        };
        Ok(())
    }

    /// Outside what its policies reach, `authorize` allows with nothing matched, counted or logged: the host need
    /// not ask.
    fn scope(&self) -> ConnectionScope {
        match self.policies.index.reach() {
            Reach::Everything => ConnectionScope::All,
            Reach::Destinations {
                namespaces,
                policies,
            } => ConnectionScope::Destinations(DestinationScope {
                namespaces,
                policies,
                // With no destination workload only global policies apply, and there are none.
                unknown_destination: false,
            }),
        }
    }

    fn authorize(&mut self, conn: &Connection, workloads: &Workloads<'_>) -> Decision {
        // Enforced on the destination side only (HBONE inbound with the verified peer identity, plaintext inbound
        // without one).
        let Policies { index, targets } = &mut self.policies;
        if conn.direction == Direction::Outbound || index.is_empty() {
            return Decision::Allow;
        }
        let unknown;
        let target = match workloads.destination {
            Some(w) => targets.get_or_derive(w, |w| {
                index.target(Some(&w.namespace()), &w.authorization_policies())
            }),
            None => {
                // Only the global policies apply: nothing to resolve.
                unknown = Target::default();
                &unknown
            }
        };
        let c = Conn::new(
            conn.source_addr(),
            conn.destination_addr(),
            conn.peer_identity.as_deref(),
        );
        let mut dry = DryRunReport {
            log: self.options.log_dry_run,
            counter: &self.dry_runs,
            conn,
        };
        match index.decide_for(&c, target, &mut dry) {
            Ok(()) => Decision::Allow,
            Err(denial) => {
                let policy = match &denial {
                    Denial::Explicit(key) => key.as_str(),
                    Denial::NotAllowed => "-",
                };
                self.denials.inc(&[policy]);
                let reason = denial.to_string();
                if self.options.log_denials {
                    weft_plugin_sdk::info!("denied {}: {reason}", describe(conn));
                }
                Decision::Deny(reason)
            }
        }
    }
}

weft_plugin_sdk::export_policy!(IstioAuthz);
