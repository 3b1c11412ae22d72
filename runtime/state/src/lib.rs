//! weft's mesh state: the model (workloads, services, authorization policies, plugin specs), immutable snapshots
//! with lookup indexes, a store that swaps snapshots atomically and tells subscribers, and the local config file
//! (ztunnel's local-config format plus weft's `plugins`), watched for edits.

pub mod local;
pub mod mesh;
pub mod model;
pub mod store;
pub mod watch;

pub use local::{ConfigError, LocalConfig};
pub use mesh::{MeshState, ResolveError, Resolved};
pub use model::*;
pub use store::StateStore;
pub use watch::{DEFAULT_POLL_INTERVAL, load_into, watch_file};
