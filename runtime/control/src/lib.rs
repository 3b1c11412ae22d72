//! weft's control plane, one crate with two binaries: the Delta ADS server that serves the mesh and plugins to
//! nodes ([`ads`], binary `weft-control`), the reference Istio-protocol CA ([`ca`], binary `weft-ca`), and what
//! both gRPC servers share, bearer-token authentication and TLS serving ([`auth`]).

pub mod ads;
pub mod auth;
pub mod ca;
pub mod kube;
pub mod rollout;
