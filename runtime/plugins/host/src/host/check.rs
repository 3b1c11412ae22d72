//! Checking code before it reaches the state: does it compile, which world does it export, does it link.

use weft_state::PluginKind;

use super::plugin_host::PluginHost;
use crate::base::error::LoadError;
use crate::guest::link::link;
use crate::versions::cache::sha256_hex;

impl PluginHost {
    /// Checks code before it is handed to the state (the xDS plugin handler NACKs what fails here, so a broken
    /// resource never takes effect, not even as a fail-closed plugin with nothing serving): it compiles (through
    /// the compile cache, so the load that follows reuses it), exports the world of `kind` (taken from the
    /// component when `None`) and links against the host's imports. Returns the kind. Blocking.
    pub fn check_component(
        &self,
        bytes: &[u8],
        kind: Option<PluginKind>,
    ) -> Result<PluginKind, LoadError> {
        let found = self.component_kind(bytes)?;
        if let Some(k) = kind
            && k != found
        {
            return Err(LoadError::WrongWorld {
                world: match k {
                    PluginKind::Policy => "transport-policy",
                    PluginKind::Telemetry => "telemetry-sink",
                },
                reason: format!(
                    "the resource says {k:?} but the component exports the {found:?} interface"
                ),
            });
        }
        let sha = sha256_hex(bytes);
        let component = self.loading().cache.get(&sha, bytes)?;
        link(&self.loading().instances.engine, &component, found)?;
        Ok(found)
    }

    /// The kind of plugin a component is, from the world it exports (`weft:plugin/policy` or
    /// `weft:plugin/telemetry`): for resources that do not say (Envoy's Wasm config has no such field). Compiles
    /// through the compile cache, so the load that follows reuses the result. Blocking.
    pub fn component_kind(&self, bytes: &[u8]) -> Result<PluginKind, LoadError> {
        let sha = sha256_hex(bytes);
        let component = self.loading().cache.get(&sha, bytes)?;
        let ty = component.component_type();
        let exports: Vec<String> = ty
            .exports(&self.loading().instances.engine)
            .map(|(name, _)| name.to_string())
            .collect();
        let exports_iface = |iface: &str| {
            exports.iter().any(|e| {
                e.split('@')
                    .next()
                    .is_some_and(|n| n == format!("weft:plugin/{iface}"))
            })
        };
        match (exports_iface("policy"), exports_iface("telemetry")) {
            (true, false) => Ok(PluginKind::Policy),
            (false, true) => Ok(PluginKind::Telemetry),
            (true, true) => Err(LoadError::WrongWorld {
                world: "transport-policy or telemetry-sink",
                reason: "the component exports both weft:plugin/policy and weft:plugin/telemetry; say which in \
                         the resource's kind"
                    .into(),
            }),
            (false, false) => Err(LoadError::WrongWorld {
                world: "transport-policy or telemetry-sink",
                reason: format!(
                    "the component exports neither weft:plugin/policy nor weft:plugin/telemetry (exports: {})",
                    if exports.is_empty() { "none".to_string() } else { exports.join(", ") }
                ),
            }),
        }
    }
}
