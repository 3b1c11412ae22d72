//! weft's mesh state: the model (workloads, services, authorization policies, plugin specs), immutable snapshots
//! with lookup indexes, a store that swaps snapshots atomically and tells subscribers, and the local config file
//! (ztunnel's local-config format plus weft's `plugins`), watched for edits; several sources at once (the file, xDS),
//! each with its own contribution, checked by the same functions (`validate`), and Istio's xDS resources converted
//! into the model (`xds`).

mod balance;
mod dump;
pub mod local;
pub mod mesh;
pub mod model;
pub mod sources;
pub mod store;
pub mod topology;
pub mod validate;
pub mod watch;
pub mod xds;

pub use local::{ConfigError, LocalConfig};
pub use mesh::{DEFAULT_WAYPOINT_PORT, MeshState, ResolveError, Resolved, WaypointHop};
pub use model::*;
pub use sources::{
    Change, Collection, FILE_PRECEDENCE, LOCAL_FILE, Resource, SourceCounts, XDS_PRECEDENCE,
};
pub use store::StateStore;
pub use topology::*;
pub use watch::{DEFAULT_POLL_INTERVAL, load_into, watch_file};
