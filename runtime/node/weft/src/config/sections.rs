//! The sections of [`super::NodeConfig`] that group a part's flags: the CA, the mesh over xDS (and the node id),
//! plugins over xDS, and the mode (node or in-pod).

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use serde::{Deserialize, Serialize};

use super::serde_text::duration;
use super::values::{CaKind, Mode, parse_nonzero_duration};

/// CA selection flags of `weft run`.
#[derive(Debug, Clone, Args, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CaConfig {
    /// CA kind.
    #[arg(long, value_enum, env = "WEFT_CA_KIND", default_value = "local")]
    pub ca_kind: CaKind,
    /// Istio CA address, e.g. https://istiod.istio-system.svc:15012.
    #[arg(long, env = "CA_ADDRESS")]
    pub ca_address: Option<String>,
    /// Roots trusted for the CA's TLS certificate and as the initial trust bundle (k8s-csr: the signer's roots).
    /// Re-read on every call; the CA channel is rebuilt when it changes.
    #[arg(long, env = "WEFT_CA_ROOT_CERT")]
    pub ca_root_cert: Option<PathBuf>,
    /// Service-account token (audience istio-ca) sent to the CA, or to the API server with k8s-csr; re-read on
    /// every call.
    #[arg(long, env = "WEFT_CA_TOKEN_FILE")]
    pub ca_token_file: Option<PathBuf>,
    /// TLS name to verify on the CA's certificate when it differs from the address's host.
    #[arg(long, env = "WEFT_CA_SERVER_NAME")]
    pub ca_server_name: Option<String>,
    /// Deadline of one CA call (k8s-csr: of the wait for the signature).
    #[arg(long, env = "WEFT_CA_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    #[serde(with = "duration")]
    pub ca_timeout: Duration,
    /// Kubernetes API server (k8s-csr).
    #[arg(long, env = "WEFT_KUBE_API")]
    pub kube_api: Option<String>,
    /// The API server's CA bundle (k8s-csr over https).
    #[arg(long, env = "WEFT_KUBE_CA_FILE")]
    pub kube_ca_file: Option<PathBuf>,
    /// `spec.signerName` of the CertificateSigningRequests (k8s-csr).
    #[arg(
        long,
        env = "WEFT_CSR_SIGNER_NAME",
        default_value = "weft.dev/workload-identity"
    )]
    pub csr_signer_name: String,
}

/// `weft run` flags of the mesh source and the node id (ztunnel's variable names where it has them).
#[derive(Debug, Clone, Args, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct XdsConfig {
    /// The control plane serving workloads, services and policies over Delta ADS (istiod:
    /// https://istiod.istio-system.svc:15012, or `weft-control`); a bare host:port means https. Unset: no xDS
    /// (the mesh comes from --config only). With --config as well, both feed the state (xDS wins a conflict).
    #[arg(long, env = "XDS_ADDRESS")]
    pub xds_address: Option<String>,
    /// PEM roots trusted for the control plane's certificate (istiod: the mesh root, e.g.
    /// /var/run/secrets/istio/root-cert.pem); re-read on every connect.
    #[arg(long, env = "XDS_ROOT_CA")]
    pub xds_root_cert: Option<PathBuf>,
    /// The node's token sent as `authorization: Bearer` (Kubernetes: the projected service-account token, audience
    /// istio-ca, e.g. /var/run/secrets/tokens/istio-token); re-read on every connect. The `clusterid` header goes
    /// with it.
    #[arg(long, env = "XDS_TOKEN_FILE")]
    pub xds_token_file: Option<PathBuf>,
    /// TLS name to verify on the control plane's certificate when it differs from the address's host.
    #[arg(long, env = "WEFT_XDS_SERVER_NAME")]
    pub xds_server_name: Option<String>,
    /// This proxy's pod name (node id `ztunnel~IP~POD.NS~NS.svc.cluster.local`, metadata NAME).
    #[arg(long, env = "POD_NAME", default_value = "")]
    pub pod_name: String,
    /// This proxy's pod namespace (node id, metadata NAMESPACE).
    #[arg(long, env = "POD_NAMESPACE", default_value = "")]
    pub pod_namespace: String,
    /// This proxy's pod IP (node id, metadata INSTANCE_IPS; ztunnel reports 1.1.1.1 when unset).
    #[arg(long, env = "INSTANCE_IP")]
    pub instance_ip: Option<String>,
}

/// `weft run` flags of the plugin source (the chart sets them).
#[derive(Debug, Clone, Args, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PluginXdsConfig {
    /// The control plane serving plugins as extension configs over Delta ADS (`weft-control`); a bare host:port
    /// means https. Unset: plugins come from --config only.
    #[arg(long, env = "WEFT_PLUGIN_XDS_ADDRESS")]
    pub plugin_xds_address: Option<String>,
    /// PEM roots trusted for the plugin control plane's certificate; re-read on every connect.
    #[arg(long, env = "WEFT_PLUGIN_XDS_ROOT_CA")]
    pub plugin_xds_root_cert: Option<PathBuf>,
    /// The node's token for the plugin control plane (`authorization: Bearer`); re-read on every connect.
    #[arg(long, env = "WEFT_PLUGIN_XDS_TOKEN_FILE")]
    pub plugin_xds_token_file: Option<PathBuf>,
    /// TLS name to verify on the plugin control plane's certificate when it differs from the address's host.
    #[arg(long, env = "WEFT_PLUGIN_XDS_SERVER_NAME")]
    pub plugin_xds_server_name: Option<String>,
    /// PEM roots trusted for plugin code fetched over https:// and from OCI registries (default: the system's).
    #[arg(long, env = "WEFT_PLUGIN_FETCH_ROOTS")]
    pub plugin_fetch_roots: Option<PathBuf>,
    /// How often the shadow figures of plugins with a shadow version, and every plugin's call and failure counts,
    /// are reported to the plugin control plane (only what changed since it was last sent; nothing when nothing
    /// changed). Not zero.
    #[arg(long, env = "WEFT_PLUGIN_SHADOW_REPORT_INTERVAL", default_value = "10s", value_parser = parse_nonzero_duration)]
    #[serde(with = "duration")]
    pub plugin_shadow_report_interval: Duration,
}

/// In-pod flags of `weft run`.
#[derive(Debug, Clone, Args, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct InpodConfig {
    /// Node mode (shared listeners in weft's namespace) or in-pod mode (listeners inside each pod's namespace,
    /// pods handed over by the CNI node agent).
    #[arg(long, value_enum, env = "WEFT_MODE", default_value = "node")]
    pub mode: Mode,
    /// In-pod mode: the CNI node agent's ZDS socket (SOCK_SEQPACKET).
    #[arg(long, env = "INPOD_UDS", default_value = weft_inpod::DEFAULT_UDS)]
    pub inpod_uds: PathBuf,
    /// In-pod mode: open pod listeners with SO_REUSEPORT, so a new weft can take over a pod while the old one
    /// drains (upgrades without refused connections).
    #[arg(long, env = "INPOD_PORT_REUSE", default_value_t = true, action = clap::ArgAction::Set)]
    pub inpod_port_reuse: bool,
}
