//! Versions and pools: the compile cache, a plugin version (its linked code, config and state), the pool of
//! configured instances it serves from, its scope, and the probation counter its calls feed.

pub(crate) mod cache;
pub(crate) mod factory;
pub(crate) mod pool;
pub(crate) mod probation;
pub(crate) mod scope;
pub(crate) mod version;
