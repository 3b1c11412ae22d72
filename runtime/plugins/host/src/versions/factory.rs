//! Making a configured instance of one plugin version: instantiate, `configure`, hand over the state it asked for.

use std::sync::Arc;

use wasmtime::Engine;

use crate::base::error::LoadError;
use crate::guest::instance::{Instance, Limits};
use crate::guest::link::Pre;
use crate::sandbox::store::PluginCtx;
use crate::wit::bindings::types as wit;

/// Everything needed to create a configured instance of one plugin version.
pub(crate) struct Factory {
    pub engine: Engine,
    pub pre: Pre,
    pub ctx: Arc<PluginCtx>,
    pub limits: Limits,
    pub config: String,
    /// The state handed to every new instance after `configure` (when the plugin asked for it).
    pub state: Option<Arc<Vec<wit::AuthorizationPolicy>>>,
}

impl Factory {
    /// Instantiates and configures, returning the state kinds the plugin asked for (no state handed yet).
    pub fn configured(&self) -> Result<(Instance, wit::StateKinds), LoadError> {
        let mut inst = Instance::new(
            &self.engine,
            &self.pre,
            self.ctx.clone(),
            self.limits.clone(),
        )
        .map_err(|e| LoadError::Instantiate(e.message))?;
        match inst.configure(&self.config) {
            Ok(Ok(kinds)) => Ok((inst, kinds)),
            Ok(Err(reason)) => Err(LoadError::Configure(reason)),
            Err(error) => Err(LoadError::Call {
                stage: "configure",
                error,
            }),
        }
    }

    /// Hands `state` to an instance.
    pub fn push_state(
        inst: &mut Instance,
        state: &[wit::AuthorizationPolicy],
    ) -> Result<(), LoadError> {
        let update = wit::StateUpdate::AuthorizationPolicies(state.to_vec());
        match inst.update_state(&update) {
            Ok(Ok(())) => Ok(()),
            Ok(Err(reason)) => Err(LoadError::State(reason)),
            Err(error) => Err(LoadError::Call {
                stage: "update-state",
                error,
            }),
        }
    }

    /// A new instance, configured and given this version's state.
    pub fn create(&self) -> Result<Instance, LoadError> {
        let (mut inst, _) = self.configured()?;
        if let Some(state) = &self.state {
            Self::push_state(&mut inst, state)?;
        }
        Ok(inst)
    }
}
