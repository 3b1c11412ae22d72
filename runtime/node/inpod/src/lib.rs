//! In-pod mode: weft serves each meshed pod from inside the pod's own network namespace, as Istio ambient's
//! ztunnel does. The CNI node agent (istio-cni) installs the capture rules in the pod and hands the namespace to
//! weft over ZDS ([`client`]); weft opens the pod's listeners inside it ([`pods`]) on a dedicated thread per pod
//! ([`netns`]); deletes and snapshot reconciliation drain pods ([`manager`]). This is the only crate that calls
//! `setns`, and never on a tokio worker.

pub mod admin;
pub mod client;
pub mod dns;
pub mod manager;
pub mod netns;
pub mod packet;
pub mod pods;
pub mod protocol;
pub mod status;
#[cfg(test)]
mod testutil;

pub use client::run;
pub use dns::PodDns;
pub use manager::{ListenerSets, Manager};
pub use pods::{PodListeners, PodPorts, ProxyPods};
pub use protocol::PodInfo;
pub use status::{PodState, Status};

/// The agent's socket istio-cni listens on.
pub const DEFAULT_UDS: &str = "/var/run/ztunnel/ztunnel.sock";
/// The mark on weft's sockets in pods: istio-cni's pod rules skip packets with it (`0x539/0xfff`).
pub const INPOD_MARK: u32 = 0x539;
