//! What a staged rollout remembers, per plugin, in the form it is persisted in (so a restarted weft control resumes
//! where it was): the version every node serves when no rollout runs, and the rollout in progress or last ended,
//! with its stage, its nodes, its figures and its timeline.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::ads::resources::{PluginInfo, Resource};
use crate::ads::shadow::Sample;

/// Milliseconds since the Unix epoch.
pub fn ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The time of `ms`.
pub fn at_ms(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms)
}

/// RFC 3339, for people.
pub fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}

/// A served version, kept whole (the nodes may have to go back to it after weft control restarted).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StoredVersion {
    /// The resource version.
    pub version: String,
    /// Its description.
    pub info: PluginInfo,
    /// The resource's type URL.
    pub type_url: String,
    /// The resource's bytes, hex.
    pub value_hex: String,
}

impl StoredVersion {
    /// Keep `r`.
    pub fn of(r: &Resource, info: &PluginInfo) -> Self {
        Self {
            version: r.version.clone(),
            info: info.clone(),
            type_url: r.body.type_url.clone(),
            value_hex: hex::encode(&r.body.value),
        }
    }

    /// The resource again (`None` when the stored bytes are not hex).
    pub fn resource(&self, name: &str) -> Option<Arc<Resource>> {
        let value = hex::decode(&self.value_hex).ok()?;
        Some(Arc::new(Resource::with_version(
            name.to_owned(),
            self.version.clone(),
            prost_types::Any {
                type_url: self.type_url.clone(),
                value,
            },
        )))
    }
}

/// Where a rollout is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Progress {
    /// Stages running.
    Progressing,
    /// Every node serves the version.
    Complete,
    /// A threshold was crossed: every node is back on the previous version.
    Aborted,
}

/// What a stage's new nodes run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Phase {
    /// The version as a shadow of the serving one.
    Shadow,
    /// The version.
    Serving,
}

/// A rollout's figures over its nodes so far.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Figures {
    /// Nodes that refused the version, with why.
    pub nacked: BTreeMap<String, String>,
    /// Nodes that rolled it back, with the figures they gave.
    pub rolled_back: BTreeMap<String, String>,
    /// Calls of the version, over its nodes.
    pub calls: u64,
    /// Failed calls of the version.
    pub failures: u64,
    /// Shadow decisions of the version.
    pub decisions: u64,
    /// Shadow decisions that differed from the serving version's.
    pub divergences: u64,
    /// Per node: (calls, failures) when first seen serving the version.
    #[serde(default)]
    pub baselines: BTreeMap<String, (u64, u64)>,
    /// Per node: (calls, failures) of the version since.
    #[serde(default)]
    pub per_node: BTreeMap<String, (u64, u64)>,
    /// Per node: (decisions, divergences) of the version as a shadow.
    #[serde(default)]
    pub shadow_per_node: BTreeMap<String, (u64, u64)>,
    /// The newest divergence samples, with the node that took each.
    #[serde(default)]
    pub samples: Vec<(String, Sample)>,
}

/// How a rollout ended when it aborted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Abort {
    /// The stage (1-based).
    pub stage: usize,
    /// What its new nodes ran.
    pub phase: Phase,
    /// The nodes that had run the version.
    pub nodes: Vec<String>,
    /// The threshold crossed, with the figures.
    pub reason: String,
    /// When (RFC 3339).
    pub at: String,
}

/// One step of a rollout, for its timeline.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Event {
    /// When (RFC 3339).
    pub at: String,
    /// Seconds since the rollout started.
    pub after_seconds: f64,
    /// The stage (1-based; 0 before the first).
    pub stage: usize,
    /// What happened.
    pub event: String,
}

/// One plugin's rollout.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Rollout {
    /// The version rolled out.
    pub target_version: String,
    /// Its code's sha256, when known.
    pub target_sha256: Option<String>,
    /// The version it replaces (what every node ran before, and returns to on an abort).
    pub previous_version: Option<String>,
    /// Its code's sha256, when known.
    pub previous_sha256: Option<String>,
    /// Where it is.
    pub state: Progress,
    /// The current stage (0-based).
    pub stage: usize,
    /// How many stages there are.
    pub stages: usize,
    /// What the current stage's new nodes run.
    pub phase: Phase,
    /// The nodes picked so far, in the order they were picked.
    pub nodes: Vec<String>,
    /// Where the current stage's new nodes start in `nodes`.
    pub stage_from: usize,
    /// When every node of the current phase ran what it should (the bake started), ms since the epoch.
    pub ready_at_ms: Option<u64>,
    /// When the rollout started, ms since the epoch.
    pub started_at_ms: u64,
    /// The figures so far.
    pub figures: Figures,
    /// Why it aborted.
    pub abort: Option<Abort>,
    /// What happened, oldest first.
    pub timeline: Vec<Event>,
}

/// What weft control remembers of one plugin.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Record {
    /// The version every node serves when no rollout runs (the last one fully rolled out).
    pub stable: Option<StoredVersion>,
    /// The rollout in progress, or the last one (complete or aborted).
    pub rollout: Option<Rollout>,
}
