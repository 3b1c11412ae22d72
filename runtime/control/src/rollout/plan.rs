//! A staged rollout as a resource asks for it (`spec.rollout.stages` and `spec.rollout.abortWhen`), checked.

use std::time::Duration;

/// How many nodes a stage puts the new version on.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub enum StageSize {
    /// This many nodes (fewer when fewer run the plugin's workloads).
    Nodes(u32),
    /// This share of the nodes, rounded up (at least one).
    Percent(u32),
}

impl StageSize {
    /// How many of `total` candidate nodes the stage covers.
    pub fn of(self, total: usize) -> usize {
        match self {
            StageSize::Nodes(n) => (n as usize).min(total),
            StageSize::Percent(p) => {
                let n = (total * p as usize).div_ceil(100);
                n.max(1).min(total)
            }
        }
    }
}

impl std::fmt::Display for StageSize {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StageSize::Nodes(1) => f.write_str("1 node"),
            StageSize::Nodes(n) => write!(f, "{n} nodes"),
            StageSize::Percent(p) => write!(f, "{p}% of nodes"),
        }
    }
}

/// One stage.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Stage {
    /// Its nodes.
    pub size: StageSize,
    /// How long it must run clean on all of them before the next stage.
    #[serde(serialize_with = "duration_text")]
    pub bake: Duration,
    /// The version first runs as a shadow of the serving one on the stage's nodes (for `bake`), then serves.
    pub shadow_first: bool,
}

fn duration_text<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(&humantime::format_duration(*d))
}

/// When a rollout aborts: any figure past its limit, over the nodes of the stages so far.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Thresholds {
    /// Nodes that refused the version (NACK), at most.
    pub nacks: u32,
    /// Nodes that rolled it back on their own (probation), at most.
    pub rollbacks: u32,
    /// Failed calls of the version over its calls, at most (`None`: not checked).
    pub failure_ratio: Option<f64>,
    /// Shadow decisions that differ from the serving ones over all shadow decisions, at most (`None`: not
    /// checked).
    pub divergence_ratio: Option<f64>,
    /// The ratios are judged only from this many calls (or shadow decisions) on.
    pub min_calls: u64,
}

impl Default for Thresholds {
    fn default() -> Self {
        Self {
            nacks: 0,
            rollbacks: 0,
            failure_ratio: None,
            divergence_ratio: None,
            min_calls: 20,
        }
    }
}

/// A plugin's staged rollout.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Plan {
    /// In order; after the last one bakes clean the version serves every node.
    pub stages: Vec<Stage>,
    /// When to abort.
    pub abort_when: Thresholds,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stage_sizes_round_up_and_never_exceed_the_fleet() {
        assert_eq!(StageSize::Percent(10).of(12), 2);
        assert_eq!(StageSize::Percent(10).of(3), 1);
        assert_eq!(StageSize::Percent(50).of(10), 5);
        assert_eq!(StageSize::Percent(100).of(10), 10);
        assert_eq!(StageSize::Nodes(1).of(10), 1);
        assert_eq!(StageSize::Nodes(5).of(3), 3);
        assert_eq!(StageSize::Percent(10).of(0), 0);
    }
}
