//! Linking a component for its world: the host's imports and the locked-down WASI defined, the world's exports
//! (and the optional ones) checked; a component that does not fit is rejected here with what it imports.

use wasmtime::Engine;
use wasmtime::component::Linker;

use crate::base::error::LoadError;
use crate::sandbox::store::StoreData;
use crate::wit::bindings::{batches, policy, scope, telemetry};

/// A component linked against the host and ready to instantiate (an `InstancePre` per world).
#[derive(Clone)]
pub(crate) enum Pre {
    Policy {
        pre: wasmtime::component::InstancePre<StoreData>,
        core: policy::TransportPolicyCoreIndices,
        /// The optional `authorize-scope` export, when the component has it.
        scope: Option<scope::AuthorizeScopeExportIndices>,
    },
    Telemetry {
        pre: wasmtime::component::InstancePre<StoreData>,
        core: telemetry::TelemetrySinkCoreIndices,
        /// The optional `telemetry-batches` export, when the component has it.
        batches: Option<batches::TelemetryBatchesExportIndices>,
    },
}

impl Pre {
    /// Whether a telemetry plugin takes merged batches (`telemetry-batches`).
    pub fn takes_batches(&self) -> bool {
        matches!(
            self,
            Pre::Telemetry {
                batches: Some(_),
                ..
            }
        )
    }
}

/// Whether `component` exports the interface `weft:plugin/<name>` (any version).
fn exports_interface(
    engine: &Engine,
    component: &wasmtime::component::Component,
    name: &str,
) -> bool {
    let wanted = format!("weft:plugin/{name}");
    component
        .component_type()
        .exports(engine)
        .any(|(n, _)| n.split('@').next() == Some(wanted.as_str()))
}

/// Links `component` for its world; a component that does not fit (wrong world, WASI or other imports) fails here.
pub(crate) fn link(
    engine: &Engine,
    component: &wasmtime::component::Component,
    kind: weft_state::PluginKind,
) -> Result<Pre, LoadError> {
    let mut linker: Linker<StoreData> = Linker::new(engine);
    let world = match kind {
        weft_state::PluginKind::Policy => "weft:plugin/transport-policy",
        weft_state::PluginKind::Telemetry => "weft:plugin/telemetry-sink",
    };
    let wrong = |e: wasmtime::Error| LoadError::WrongWorld {
        world,
        reason: describe_imports(engine, component, &format!("{e:#}")),
    };
    crate::sandbox::wasi::define(engine, component, &mut linker)
        .map_err(|reason| LoadError::WrongWorld { world, reason })?;
    match kind {
        weft_state::PluginKind::Policy => {
            policy::TransportPolicyCore::add_to_linker::<_, wasmtime::component::HasSelf<_>>(
                &mut linker,
                |d| d,
            )
            .map_err(|e| LoadError::Internal(format!("{e:#}")))?;
            let pre = linker.instantiate_pre(component).map_err(wrong)?;
            let core = policy::TransportPolicyCoreIndices::new(&pre).map_err(wrong)?;
            // Optional, but a component that exports it must export it right (an interface of another version
            // or shape is refused, not ignored: the plugin would be asked about connections it declared out of
            // scope, or the other way round).
            let scope = if exports_interface(engine, component, "authorize-scope") {
                Some(scope::AuthorizeScopeExportIndices::new(&pre).map_err(wrong)?)
            } else {
                None
            };
            Ok(Pre::Policy { pre, core, scope })
        }
        weft_state::PluginKind::Telemetry => {
            telemetry::TelemetrySinkCore::add_to_linker::<_, wasmtime::component::HasSelf<_>>(
                &mut linker,
                |d| d,
            )
            .map_err(|e| LoadError::Internal(format!("{e:#}")))?;
            let pre = linker.instantiate_pre(component).map_err(wrong)?;
            let core = telemetry::TelemetrySinkCoreIndices::new(&pre).map_err(wrong)?;
            // Optional; one of another version or shape is refused (see `authorize-scope`).
            let batches = if exports_interface(engine, component, "telemetry-batches") {
                Some(batches::TelemetryBatchesExportIndices::new(&pre).map_err(wrong)?)
            } else {
                None
            };
            Ok(Pre::Telemetry { pre, core, batches })
        }
    }
}

fn describe_imports(
    engine: &Engine,
    component: &wasmtime::component::Component,
    error: &str,
) -> String {
    let ty = component.component_type();
    let foreign: Vec<String> = ty
        .imports(engine)
        .map(|(name, _)| name.to_string())
        .filter(|n| !n.starts_with("weft:plugin/") && !n.starts_with("wasi:"))
        .collect();
    if foreign.is_empty() {
        error.to_string()
    } else {
        format!(
            "{error} (the component imports {}; weft offers only weft:plugin/* and a locked-down WASI)",
            foreign.join(", ")
        )
    }
}
