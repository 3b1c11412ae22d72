//! `weft run --mode inpod`: no shared listeners; the CNI node agent (istio-cni) hands each meshed pod's network
//! namespace to weft over ZDS and weft serves the pod from inside it (`weft-inpod`). This module holds the wiring;
//! `--mode node` (the default) is the shared-node data path of `node/data_path.rs`.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use weft_hooks::ConnectionHooks;
use weft_identity::SecretManager;
use weft_inpod::{Manager, ProxyPods, Status};
use weft_proxy::{ProxyConfig, ProxyMetrics};
use weft_state::{StateStore, Workload};

use crate::config::InpodConfig;

/// The running in-pod side.
pub struct InPod {
    /// Pods and their state.
    pub status: Arc<Status>,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl InPod {
    /// Whether `w` is one of the pods weft serves (or retries), on node `node`.
    pub fn serves(status: &Status, node: &str, w: &Workload) -> bool {
        status.local_pods().iter().any(|p| p.matches(node, w))
    }

    /// Start the ZDS client on the current (control) runtime; pods' data paths run on `data`. Fails at once if
    /// weft cannot enter namespaces or mark sockets.
    #[allow(clippy::too_many_arguments)]
    pub fn start(
        args: &InpodConfig,
        mut base: ProxyConfig,
        state: Arc<StateStore>,
        identity: Arc<SecretManager>,
        hooks: Arc<dyn ConnectionHooks>,
        metrics: Arc<ProxyMetrics>,
        status: Arc<Status>,
        data: tokio::runtime::Handle,
        dns: Option<weft_inpod::PodDns>,
    ) -> anyhow::Result<Self> {
        // istio-cni's pod rules skip packets marked 0x539/0xfff: weft's sockets in pods carry it.
        let mark = *base.mark.get_or_insert(weft_inpod::INPOD_MARK);
        weft_inpod::netns::check_capabilities(Some(mark))?;
        base.reuse_port = args.inpod_port_reuse;
        // Inside the pod the application may listen on loopback only (ztunnel's LOCALHOST_APP_TUNNEL default).
        base.app_tunnel_loopback = true;
        let sets = Arc::new(ProxyPods {
            base,
            ports: weft_inpod::PodPorts::default(),
            state,
            identity,
            hooks,
            metrics,
            data,
            dns,
        });
        let stop = CancellationToken::new();
        tracing::info!(uds = %args.inpod_uds.display(), port_reuse = args.inpod_port_reuse, mark = format!("{mark:#x}"), "in-pod mode: waiting for pods from the CNI node agent");
        let task = tokio::spawn(weft_inpod::run(
            args.inpod_uds.clone(),
            Manager::new(sets, status.clone()),
            status.clone(),
            stop.clone(),
        ));
        Ok(Self { status, stop, task })
    }

    /// Stop reading from the agent and drain every pod (each with the SIGTERM drain rules).
    pub async fn drain(self) {
        self.stop.cancel();
        if let Err(e) = self.task.await {
            tracing::error!(error = %e, "in-pod client task");
        }
    }
}
