//! Shadow reports from the nodes: what each node's shadow version of a plugin decided beside the serving one
//! (`weft.plugin.v1.ShadowReport`, sent unsolicited on the plugin stream), kept per node for `/status` and for the
//! WeftPlugin controller's status.

use prost::Message as _;
use serde::{Deserialize, Serialize};
use weft_proto::type_url;
use weft_proto::weft::plugin::v1::ShadowReport;

/// How many divergence samples a record keeps (the newest).
pub const SAMPLES: usize = 5;

/// Decisions of one (direction, serving verdict, shadow verdict).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Decisions {
    /// `inbound` or `outbound`.
    pub direction: String,
    /// `allow` or `deny`.
    pub serving: String,
    /// `allow`, `deny` or `error`.
    pub shadow: String,
    /// How many.
    pub count: u64,
}

/// One divergence, as the node sampled it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Sample {
    /// `inbound` or `outbound`.
    pub direction: String,
    /// `ip:port`.
    pub source: String,
    /// `ip:port`.
    pub destination: String,
    /// The verified peer identity, when there was one.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub source_identity: String,
    /// `namespace/name`, when known.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub source_workload: String,
    /// `namespace/name`, when known.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub destination_workload: String,
    /// The serving verdict and its reason.
    pub serving: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub serving_reason: String,
    /// The shadow verdict and its reason.
    pub shadow: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub shadow_reason: String,
}

/// A node's latest report of one plugin's shadow.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ShadowRecord {
    /// The serving code's sha256.
    pub serving_sha256: String,
    /// The shadow code's sha256.
    pub shadow_sha256: String,
    /// Why the shadow did not load, if it did not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_error: Option<String>,
    /// Every decision, by verdicts.
    pub decisions: Vec<Decisions>,
    /// Decisions where the shadow's verdict differs from the serving one (an `error` included).
    pub divergences: u64,
    /// Decisions skipped for a full queue.
    pub skipped: u64,
    /// The newest divergence samples, oldest first.
    pub samples: Vec<Sample>,
    /// When it was received (RFC 3339).
    pub at: String,
}

impl ShadowRecord {
    /// The record of a report received now.
    pub fn from_report(r: &ShadowReport) -> Self {
        let decisions: Vec<Decisions> = r
            .decisions
            .iter()
            .map(|d| Decisions {
                direction: d.direction.clone(),
                serving: d.serving.clone(),
                shadow: d.shadow.clone(),
                count: d.count,
            })
            .collect();
        let divergences = decisions
            .iter()
            .filter(|d| d.serving != d.shadow)
            .map(|d| d.count)
            .sum();
        let skip = r.samples.len().saturating_sub(SAMPLES);
        Self {
            serving_sha256: r.serving_sha256.clone(),
            shadow_sha256: r.shadow_sha256.clone(),
            load_error: Some(r.load_error.clone()).filter(|e| !e.is_empty()),
            decisions,
            divergences,
            skipped: r.skipped,
            samples: r
                .samples
                .iter()
                .skip(skip)
                .map(|s| Sample {
                    direction: s.direction.clone(),
                    source: s.source.clone(),
                    destination: s.destination.clone(),
                    source_identity: s.source_identity.clone(),
                    source_workload: s.source_workload.clone(),
                    destination_workload: s.destination_workload.clone(),
                    serving: s.serving.clone(),
                    serving_reason: s.serving_reason.clone(),
                    shadow: s.shadow.clone(),
                    shadow_reason: s.shadow_reason.clone(),
                })
                .collect(),
            at: humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string(),
        }
    }

    /// Every decision counted.
    pub fn total(&self) -> u64 {
        self.decisions.iter().map(|d| d.count).sum()
    }
}

/// The shadow reports in a report's details (others are ignored).
pub fn reports(details: &[prost_types::Any]) -> Vec<ShadowReport> {
    details
        .iter()
        .filter(|a| a.type_url == type_url::SHADOW_REPORT)
        .filter_map(|a| ShadowReport::decode(a.value.as_slice()).ok())
        .collect()
}
