//! The lifecycle of the plugin set: apply a config, build the chain the data path reads, put a new version on
//! probation, roll it back, refuse what was rolled back, deny what no plugin enforces, report status.

pub(crate) mod apply;
pub(crate) mod chain;
pub(crate) mod enforce;
pub(crate) mod plugins;
pub(crate) mod report;
pub(crate) mod rollback;
pub(crate) mod rollout;
pub(crate) mod shadow;
pub(crate) mod status;
