//! The checks a [`NodeConfig`] passes before anything starts, whatever it was read from (a flag's parser checks
//! its own value; a value from the config file is checked here too).

use super::values::{check_epoch_tick, check_nonzero, check_ratio};
use super::{ConfigError, NodeConfig};

impl NodeConfig {
    /// Refuses a config that cannot run, naming the flag to fix.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.node.is_empty() {
            return Err(ConfigError::invalid(
                "--node",
                "required: this node's name (the flag, NODE_NAME or `node` in --config-file)",
            ));
        }
        if self.config.is_none() && self.xds.xds_address.is_none() {
            return Err(ConfigError::invalid(
                "--config",
                "required unless --xds-address is given (the mesh comes from one of them)",
            ));
        }
        check_epoch_tick(self.tuning.plugin_epoch_tick)
            .map_err(|e| ConfigError::invalid("--plugin-epoch-tick", e))?;
        check_nonzero(self.plugin_xds.plugin_shadow_report_interval)
            .map_err(|e| ConfigError::invalid("--plugin-shadow-report-interval", e))?;
        check_ratio(self.tuning.plugin_rollout_max_failure_ratio)
            .map_err(|e| ConfigError::invalid("--plugin-rollout-max-failure-ratio", e))?;
        if self.log.is_empty() {
            return Err(ConfigError::invalid("--log", "empty filter"));
        }
        Ok(())
    }
}
