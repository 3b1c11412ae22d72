//! The admin glue: what `/config_dump`, `/healthz/ready`, `/logging` and `/stats/prometheus` show of this node,
//! and the metrics registry behind the last.

use std::collections::BTreeSet;
use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;
use serde_json::json;
use tokio_util::sync::CancellationToken;
use weft_admin::AdminHandler;
use weft_identity::SecretManager;
use weft_plugin_host::PluginHost;
use weft_proxy::{Proxy, ProxyMetrics};
use weft_state::{StateStore, TunnelProtocol};

use weft_logging::LogControl;

use crate::config::NodeConfig;

/// Everything the admin servers read.
pub struct Node {
    pub node: String,
    /// The node's settings (`NodeConfig`), as `/config_dump` shows them under `nodeConfig`.
    pub config: serde_json::Value,
    pub state: Arc<StateStore>,
    pub identity: Arc<SecretManager>,
    pub proxy: std::sync::OnceLock<Arc<Proxy>>,
    /// In-pod mode: the pods weft serves (`None` in node mode).
    pub inpod: Option<Arc<weft_inpod::Status>>,
    pub registry: Registry,
    /// The telemetry plugins' shadow versions' metrics (`/metrics/shadow`).
    pub shadow_registry: Registry,
    /// The log filter `/logging` shows and changes (none: the process's logging is not this node's).
    pub logs: Option<LogControl>,
    pub quit: CancellationToken,
    /// A local config file was given (readiness waits for it to load).
    pub needs_file: bool,
    /// The xDS sources (readiness waits for their first complete sync).
    pub xds: Vec<weft_xds::XdsHandle>,
    pub plugins: Box<dyn Fn() -> serde_json::Value + Send + Sync>,
    /// Istio authorization policies in force that no serving policy plugin enforces (their connections are
    /// denied), each with why.
    pub unenforced_policies: Box<dyn Fn() -> Vec<String> + Send + Sync>,
}

impl Node {
    /// What the admin servers of the node `config` describes read.
    pub(crate) fn new(
        config: &NodeConfig,
        sources: &crate::node::Sources,
        identity: &Arc<SecretManager>,
        inpod: Option<Arc<weft_inpod::Status>>,
        registry: Registry,
        logs: Option<LogControl>,
        quit: CancellationToken,
    ) -> Self {
        let (host, unenforced) = (sources.host.clone(), sources.host.clone());
        let mut shadow_registry = Registry::default();
        sources.host.register_shadow_metrics(&mut shadow_registry);
        Node {
            node: config.node.clone(),
            config: serde_json::to_value(config).unwrap_or_default(),
            state: sources.state.clone(),
            identity: identity.clone(),
            proxy: std::sync::OnceLock::new(),
            inpod,
            registry,
            shadow_registry,
            logs,
            quit,
            needs_file: config.config.is_some(),
            xds: sources.xds.clone(),
            plugins: Box::new(move || plugins_dump(&host)),
            unenforced_policies: Box::new(move || unenforced.unenforced_policies()),
        }
    }
}

/// The plugins section of `/config_dump`: each plugin's status, and a `shadow` object for a plugin with a shadow
/// version (what `PluginHost::shadow_report` says).
fn plugins_dump(host: &PluginHost) -> serde_json::Value {
    let mut v = serde_json::to_value(host.status()).unwrap_or_default();
    if let Some(list) = v.as_array_mut() {
        for entry in list {
            let report = entry
                .get("name")
                .and_then(|n| n.as_str())
                .and_then(|n| host.shadow_report(n));
            if let (Some(r), Some(obj)) = (report, entry.as_object_mut()) {
                obj.insert("shadow".into(), shadow_json(&r));
            }
        }
    }
    v
}

/// A shadow report as `/config_dump` shows it: the shadow's sha256 (or why it did not load), decisions per
/// (direction, serving verdict, shadow verdict), skipped decisions, and the divergence samples (oldest first).
fn shadow_json(r: &weft_plugin_host::ShadowReport) -> serde_json::Value {
    json!({
        "sha256": r.sha256,
        "loadError": r.load_error,
        "decisions": r.decisions.iter().map(|c| json!({
            "direction": c.direction,
            "serving": c.serving,
            "shadow": c.shadow,
            "count": c.count,
        })).collect::<Vec<_>>(),
        "divergences": r.decisions.iter().filter(|c| c.serving != c.shadow).map(|c| c.count).sum::<u64>(),
        "skipped": r.skipped,
        "samplesDropped": r.samples_dropped,
        "samples": r.samples.iter().map(|s| json!({
            "conn": s.conn,
            "direction": s.direction,
            "src": s.src.to_string(),
            "dst": s.dst.to_string(),
            "dstPort": s.dst.port(),
            "srcIdentity": s.src_identity,
            "srcWorkload": s.src_workload,
            "dstWorkload": s.dst_workload,
            "serving": s.serving,
            "servingReason": s.serving_reason,
            "shadow": s.shadow,
            "shadowReason": s.shadow_reason,
        })).collect::<Vec<_>>(),
    })
}

/// The node's metrics: the registry `/stats/prometheus` encodes and the metrics the data path updates.
pub(crate) struct Telemetry {
    pub registry: Registry,
    pub proxy: Arc<ProxyMetrics>,
    pub dns: Arc<weft_dns::DnsMetrics>,
}

impl Telemetry {
    /// Registers the data path's, the DNS proxy's, the plugin host's and in-pod metrics, and the counters that
    /// live in other crates (config reloads, CA calls, certificates, xDS).
    pub(crate) fn register(
        state: &Arc<StateStore>,
        identity: &Arc<SecretManager>,
        host: &PluginHost,
        xds: &[weft_xds::XdsHandle],
        inpod: Option<&Arc<weft_inpod::Status>>,
    ) -> Self {
        let proxy = Arc::new(ProxyMetrics::default());
        let dns = Arc::new(weft_dns::DnsMetrics::default());
        let mut registry = Registry::default();
        proxy.register(&mut registry);
        dns.register(&mut registry);
        host.register_metrics(&mut registry);
        if let Some(s) = inpod {
            s.register(&mut registry);
        }
        registry.register_collector(Box::new(NodeCollector {
            state: state.clone(),
            identity: identity.clone(),
        }));
        registry.register_collector(Box::new(weft_xds::XdsCollector(xds.to_vec())));
        registry.register_collector(Box::new(weft_admin::process::ProcessCollector {
            istio_version: std::env::var("ISTIO_META_ISTIO_VERSION")
                .ok()
                .filter(|v| !v.is_empty())
                .unwrap_or_else(|| crate::xds::ISTIO_VERSION.to_owned()),
        }));
        Telemetry {
            registry,
            proxy,
            dns,
        }
    }
}

impl AdminHandler for Node {
    fn config_dump(&self) -> serde_json::Value {
        let s = self.state.current();
        json!({
            "version": s.version,
            "node": self.node,
            "nodeConfig": self.config,
            "config": {
                "loaded": self.state.is_loaded(),
                "acceptedReloads": self.state.accepted_reloads(),
                "refusedReloads": self.state.refused_reloads(),
                "lastError": self.state.last_error(),
            },
            // ztunnel's shape for what `istioctl ztunnel-config` reads (workloads, services, policies, certificates,
            // workloadState); weft's own sections beside them.
            "workloads": s.dump_workloads(),
            "services": s.dump_services(),
            "policies": s.dump_policies(),
            "workloadState": match (&self.inpod, self.proxy.get()) {
                (Some(p), _) => weft_inpod::admin::workload_state(p, &s, &self.node),
                (None, p) => weft_inpod::admin::node_workload_state(
                    &s,
                    &self.node,
                    &p.map(|p| p.tracker().live()).unwrap_or_default(),
                    p.is_some_and(|p| p.is_ready()),
                ),
            },
            "sources": crate::xds::dump(&self.state, &self.xds),
            "certificates": self.identity.dump(),
            "plugins": (self.plugins)(),
            "unenforcedPolicies": (self.unenforced_policies)(),
            "inpod": self.inpod.as_ref().map(|p| p.dump()),
            "connections": {
                "live": self.proxy.get().map(|p| p.tracker().len()).unwrap_or(0),
                "pooledHbone": self.proxy.get().map(|p| p.pooled_connections()).unwrap_or(0),
                "hboneCreated": self.proxy.get().map(|p| p.hbone_connections_created()).unwrap_or(0),
            },
        })
    }

    fn readiness(&self) -> Result<(), Vec<String>> {
        let mut pending = Vec::new();
        if self.needs_file && !self.state.is_loaded() {
            pending.push("config not loaded".to_owned());
        }
        pending.extend(weft_xds::pending(&self.xds));
        match &self.inpod {
            Some(p) => pending.extend(p.not_ready()),
            None => {
                if !self.proxy.get().is_some_and(|p| p.is_ready()) {
                    pending.push("listeners not up".to_owned());
                }
            }
        }
        // Like ztunnel: not ready until every local HBONE workload has its certificate.
        let local: BTreeSet<String> = self
            .state
            .current()
            .local_workloads(&self.node)
            .filter(|w| w.protocol == TunnelProtocol::Hbone)
            .filter(|w| {
                self.inpod
                    .as_ref()
                    .is_none_or(|p| crate::inpod::InPod::serves(p, &self.node, w))
            })
            .map(|w| w.spiffe_id())
            .collect();
        let have: BTreeSet<String> = self
            .identity
            .dump()
            .into_iter()
            .filter(|c| c.state == "Available")
            .map(|c| c.identity)
            .collect();
        let missing: Vec<&String> = local.difference(&have).collect();
        if !missing.is_empty() {
            pending.push(format!(
                "certificates pending for {}",
                missing
                    .iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        if pending.is_empty() {
            Ok(())
        } else {
            Err(pending)
        }
    }

    fn log_level(&self) -> String {
        self.logs.as_ref().map_or_else(
            || "unknown (not set by this node)".to_owned(),
            LogControl::current,
        )
    }

    fn set_log_level(&self, level: &str) -> Result<String, String> {
        match &self.logs {
            Some(logs) => logs.set(level),
            None => Err("this node does not own the process's logging".to_owned()),
        }
    }

    fn metrics(&self) -> String {
        let mut out = String::new();
        if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &self.registry) {
            tracing::warn!(error = %e, "encoding metrics");
        }
        out
    }

    fn shadow_metrics(&self) -> Option<String> {
        let mut out = String::new();
        if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &self.shadow_registry) {
            tracing::warn!(error = %e, "encoding shadow metrics");
        }
        Some(out)
    }

    fn quit(&self) {
        self.quit.cancel();
    }
}

/// Exposes counters that live in other crates (config reloads, CA calls, certificate expiry).
#[derive(Debug)]
pub struct NodeCollector {
    pub state: Arc<StateStore>,
    pub identity: Arc<SecretManager>,
}

impl Collector for NodeCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        use std::sync::atomic::Ordering::Relaxed;
        let counters = [
            (
                "weft_config_reloads_accepted",
                "Config updates applied",
                self.state.accepted_reloads(),
            ),
            (
                "weft_config_reloads_refused",
                "Config updates refused (last good config kept)",
                self.state.refused_reloads(),
            ),
            (
                "weft_certificate_fetches",
                "Certificate requests sent to the CA",
                self.identity.counters().fetches.load(Relaxed),
            ),
            (
                "weft_certificate_fetch_failures",
                "Certificate requests that failed",
                self.identity.counters().failures.load(Relaxed),
            ),
            (
                "weft_certificate_fetches_refused",
                "Certificate requests the CA refused (e.g. PermissionDenied)",
                self.identity.counters().refused.load(Relaxed),
            ),
            (
                "weft_certificate_renewals",
                "Certificates renewed before expiry",
                self.identity.counters().renewals.load(Relaxed),
            ),
            (
                "weft_certificate_fetches_coalesced",
                "Certificate requests that joined a CA call already in flight",
                self.identity.counters().coalesced.load(Relaxed),
            ),
        ];
        for (name, help, v) in counters {
            let m = enc.encode_descriptor(name, help, None, MetricType::Counter)?;
            ConstCounter::new(v).encode(m)?;
        }
        let expiry = self
            .identity
            .soonest_expiry()
            .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
            .unwrap_or(-1);
        let m = enc.encode_descriptor(
            "weft_certificate_soonest_expiry_seconds",
            "Seconds until the soonest workload certificate expires (-1: none held)",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(expiry).encode(m)?;
        let (in_flight, queued) = self.identity.ca_calls();
        for (name, help, v) in [
            ("weft_ca_calls_in_flight", "CA calls in flight", in_flight),
            (
                "weft_ca_calls_queued",
                "CA calls waiting for a slot",
                queued,
            ),
        ] {
            let m = enc.encode_descriptor(name, help, None, MetricType::Gauge)?;
            ConstGauge::new(i64::try_from(v).unwrap_or(i64::MAX)).encode(m)?;
        }
        let m = enc.encode_descriptor(
            "weft_config_version",
            "Version of the mesh state in force",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(i64::try_from(self.state.version()).unwrap_or(i64::MAX)).encode(m)?;
        Ok(())
    }
}

#[cfg(test)]
mod shadow_dump_tests {
    #![allow(clippy::unwrap_used)] // test code: a panic fails the test

    use weft_plugin_host::{DivergenceSample, ShadowCount, ShadowReport};

    #[test]
    fn a_shadow_report_shows_counts_divergences_and_samples() {
        let r = ShadowReport {
            sha256: Some("ab".repeat(32)),
            load_error: None,
            decisions: vec![
                ShadowCount {
                    direction: "inbound",
                    serving: "allow",
                    shadow: "deny",
                    count: 3,
                },
                ShadowCount {
                    direction: "inbound",
                    serving: "allow",
                    shadow: "allow",
                    count: 5,
                },
            ],
            skipped: 1,
            samples_dropped: 0,
            samples: vec![DivergenceSample {
                conn: 7,
                direction: "inbound",
                src: "10.0.0.1:40000".parse().unwrap(),
                dst: "10.0.0.2:8080".parse().unwrap(),
                src_identity: Some("spiffe://cluster.local/ns/a/sa/b".into()),
                src_workload: Some("a/b".into()),
                dst_workload: None,
                serving: "allow",
                serving_reason: None,
                shadow: "deny",
                shadow_reason: Some("port 8080 not allowed".into()),
            }],
        };
        let v = super::shadow_json(&r);
        assert_eq!(v["divergences"], 3);
        assert_eq!(v["skipped"], 1);
        assert_eq!(v["decisions"][0]["shadow"], "deny");
        assert_eq!(v["samples"][0]["dstPort"], 8080);
        assert_eq!(v["samples"][0]["shadowReason"], "port 8080 not allowed");
        assert_eq!(v["sha256"], "ab".repeat(32));
    }
}
