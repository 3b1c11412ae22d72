//! Call counts from the nodes (`weft.plugin.v1.PluginCounts`, sent unsolicited on the plugin stream beside shadow
//! reports): per node and plugin, the serving code's sha256 and the calls and failures so far, which staged rollouts
//! judge a version's failure ratio from.

use prost::Message as _;
use serde::{Deserialize, Serialize};
use weft_proto::type_url;
use weft_proto::weft::plugin::v1::PluginCounts;

/// A node's latest counts of one plugin.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CountsRecord {
    /// sha256 of the code serving when counted.
    pub sha256: String,
    /// Calls since the node started (every version).
    pub calls: u64,
    /// Failed calls since the node started (every version).
    pub failures: u64,
}

/// The counts in a report's details, by plugin (others are ignored).
pub fn counts(details: &[prost_types::Any]) -> Vec<(String, CountsRecord)> {
    details
        .iter()
        .filter(|a| a.type_url == type_url::PLUGIN_COUNTS)
        .filter_map(|a| PluginCounts::decode(a.value.as_slice()).ok())
        .map(|c| {
            (
                c.plugin,
                CountsRecord {
                    sha256: c.sha256,
                    calls: c.calls,
                    failures: c.failures,
                },
            )
        })
        .collect()
}
