//! What `apply` reports: per plugin, what became of it, and the outcome of a state version for the config source
//! that waits for it.

use serde::Serialize;

/// What `apply` did with one plugin.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum Outcome {
    /// A new version (code or config) loaded and now serves.
    Loaded {
        /// sha256 of the code.
        sha256: String,
    },
    /// Same spec as before: nothing done.
    Unchanged,
    /// Same code and config, new control-plane state handed over; the re-configured version now serves.
    StateUpdated,
    /// The plugin is no longer in the config and stopped serving.
    Removed,
    /// The new spec (or state) was refused. `still_serving` is the sha256 of the version that keeps serving, if any.
    Rejected {
        /// Why.
        reason: String,
        /// The version still serving for this name.
        still_serving: Option<String>,
    },
}

/// One plugin's outcome.
#[derive(Debug, Clone, Serialize)]
pub struct PluginOutcome {
    /// Plugin name.
    pub name: String,
    /// What happened.
    #[serde(flatten)]
    pub outcome: Outcome,
}

/// What `apply` did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ApplyReport {
    /// Per plugin, in name order.
    pub plugins: Vec<PluginOutcome>,
    /// Whether live connections were asked to be re-checked (the `policy_changes` watch was bumped).
    pub recheck: bool,
}

impl ApplyReport {
    /// The outcome for a plugin name.
    pub fn get(&self, name: &str) -> Option<&Outcome> {
        self.plugins
            .iter()
            .find(|p| p.name == name)
            .map(|p| &p.outcome)
    }

    /// The rejections: (name, reason).
    pub fn rejected(&self) -> Vec<(&str, &str)> {
        self.plugins
            .iter()
            .filter_map(|p| match &p.outcome {
                Outcome::Rejected { reason, .. } => Some((p.name.as_str(), reason.as_str())),
                _ => None,
            })
            .collect()
    }
}

/// The outcome of the `apply` for one state version (what an xDS source waits for before it ACKs).
#[derive(Debug, Clone, Default)]
pub struct AppliedVersion {
    /// The state version applied (0 for an `apply` without one).
    pub state_version: u64,
    /// What happened to each plugin.
    pub report: ApplyReport,
}
