//! The plugins every node runs unless told otherwise: `istio-authz` (Istio's L4 AuthorizationPolicy, enforced on
//! the destination side, fail-closed) and `istio-telemetry` (Istio's standard TCP metrics and an access log). They
//! are compiled from `plugins/` at build time and embedded; a config entry with the same name replaces one (a new
//! version, another config), and `--default-plugins false` turns them off.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

use weft_state::{
    FailurePolicy, PluginDirections, PluginKind, PluginSource, PluginSpec, WorkloadSelector,
};

static ISTIO_AUTHZ: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/istio_authz.wasm"));
static ISTIO_TELEMETRY: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/istio_telemetry.wasm"));

/// Name of the default policy plugin.
pub const AUTHZ: &str = "istio-authz";
/// Name of the default telemetry plugin.
pub const TELEMETRY: &str = "istio-telemetry";

fn spec(
    name: &str,
    kind: PluginKind,
    code: &'static [u8],
    config: &str,
    failure_policy: FailurePolicy,
) -> Arc<PluginSpec> {
    Arc::new(PluginSpec {
        name: name.to_owned(),
        kind,
        source: PluginSource::Inline(Arc::new(code.to_vec())),
        sha256: None,
        config: config.to_owned(),
        failure_policy,
        priority: 0,
        selector: WorkloadSelector::default(),
        directions: PluginDirections {
            inbound: true,
            outbound: false,
        },
        recheck: true,
        rollout: None,
        shadow: None,
    })
}

/// The embedded default specs (built once).
pub fn defaults() -> &'static [Arc<PluginSpec>] {
    static SPECS: OnceLock<Vec<Arc<PluginSpec>>> = OnceLock::new();
    SPECS.get_or_init(|| {
        vec![
            spec(
                AUTHZ,
                PluginKind::Policy,
                ISTIO_AUTHZ,
                "{}",
                FailurePolicy::FailClosed,
            ),
            // weft's built-in access log (target `access`) is on already; configure this plugin with
            // `accessLog: on` to have it write Istio's access log instead.
            spec(
                TELEMETRY,
                PluginKind::Telemetry,
                ISTIO_TELEMETRY,
                r#"{"accessLog": "off"}"#,
                FailurePolicy::FailOpen,
            ),
        ]
    })
}

/// The defaults (when enabled) overlaid with the configured plugins: a configured plugin replaces a default of the
/// same name.
pub fn merge(
    enabled: bool,
    configured: impl Iterator<Item = Arc<PluginSpec>>,
) -> Vec<Arc<PluginSpec>> {
    let mut by_name: BTreeMap<String, Arc<PluginSpec>> = BTreeMap::new();
    if enabled {
        for s in defaults() {
            by_name.insert(s.name.clone(), s.clone());
        }
    }
    for s in configured {
        by_name.insert(s.name.clone(), s);
    }
    by_name.into_values().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_plugins_are_components_and_config_overrides_them() {
        for code in [ISTIO_AUTHZ, ISTIO_TELEMETRY] {
            // A component's preamble: magic, then version 0x0d and layer 1.
            assert_eq!(&code[..4], b"\0asm");
            assert_eq!(&code[6..8], &[1, 0]);
        }
        let mut mine = (*defaults()[0]).clone();
        mine.config = r#"{"x": 1}"#.into();
        let merged = merge(true, std::iter::once(Arc::new(mine)));
        assert_eq!(merged.len(), 2);
        assert_eq!(
            merged.iter().find(|s| s.name == AUTHZ).unwrap().config,
            r#"{"x": 1}"#
        );
        assert!(merge(false, std::iter::empty()).is_empty());
    }
}
