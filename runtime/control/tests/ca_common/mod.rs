//! Test fixtures: the reference CA in process on loopback, and a fake Kubernetes API server that speaks the
//! TokenReview and Pod JSON.
#![allow(dead_code, clippy::unwrap_used)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use weft_control::auth::StaticFile;
pub use weft_control::auth::testing::{FakeKubeApi, FakeToken};
use weft_control::ca::{Authenticator, CaService, Fault, TrustedNodeAccounts};
use weft_identity::{CertRequest, IstioCaClient, IstioCaConfig, LocalCa, SpiffeId};
use weft_state::StateStore;

/// A CA request for `id` with a fresh key.
pub fn request(id: &SpiffeId) -> CertRequest {
    CertRequest {
        identity: id.clone(),
        csr_pem: weft_identity::cert::new_csr(id).unwrap().csr_pem,
        validity: Duration::from_secs(3600),
    }
}

/// Wait until the CA's workload source has taken an edit: its version moves past `seen`, and `f` holds for the
/// new snapshot (60 s at most, a generous bound for a loaded machine; the watcher polls every 20 ms).
pub async fn applied(
    store: &StateStore,
    seen: u64,
    mut f: impl FnMut(&weft_state::MeshState) -> bool,
) {
    let mut changes = store.subscribe();
    let wait = async {
        loop {
            if store.version() > seen && f(&store.current()) {
                return;
            }
            changes.changed().await.unwrap();
        }
    };
    tokio::time::timeout(Duration::from_secs(60), wait)
        .await
        .expect("the CA's workload source did not apply the edit");
}

/// The reference CA in process.
pub struct TestCa {
    pub dir: tempfile::TempDir,
    pub addr: SocketAddr,
    pub service: Arc<CaService>,
    /// The client's copy of the root (tests may overwrite it).
    pub root_file: PathBuf,
    pub mesh_file: PathBuf,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Drop for TestCa {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

const TOKENS: &str = "tokens:
- token: token-a
  node: node-a
  identity: spiffe://cluster.local/ns/weft-system/sa/node-a
- token: token-b
  node: node-b
  identity: spiffe://cluster.local/ns/weft-system/sa/node-b
- token: token-client
  node: node-a
  identity: spiffe://cluster.local/ns/default/sa/client
";

/// The node agents' accounts (the static tokens' and the fake API server's node identities).
pub const NODE_AGENTS: &str = "weft-system/node-a,weft-system/node-b";

/// The CA's initial workload source: `client` and its neighbour `neighbour` on node-a, `echo` on node-b.
pub const PLACED: &[(&str, &str)] = &[
    ("client", "node-a"),
    ("neighbour", "node-a"),
    ("echo", "node-b"),
];

impl TestCa {
    /// Start with [`PLACED`]; static tokens unless `auth` is given; the node agents of [`NODE_AGENTS`] trusted.
    pub async fn start(fault: Option<Fault>, auth: Option<Authenticator>) -> Self {
        Self::start_trusting(
            fault,
            auth,
            TrustedNodeAccounts::parse_list(NODE_AGENTS).unwrap(),
        )
        .await
    }

    /// [`TestCa::start`] trusting `trusted` as node agents.
    pub async fn start_trusting(
        fault: Option<Fault>,
        auth: Option<Authenticator>,
        trusted: TrustedNodeAccounts,
    ) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let ca_dir = dir.path().join("ca");
        weft_identity::ca::write_root(&ca_dir, "cluster.local", Duration::from_secs(3600)).unwrap();
        let root_file = dir.path().join("client-root.pem");
        std::fs::copy(ca_dir.join("root-cert.pem"), &root_file).unwrap();
        let tokens = dir.path().join("tokens.yaml");
        std::fs::write(&tokens, TOKENS).unwrap();
        let mesh_file = dir.path().join("mesh.yaml");
        std::fs::write(&mesh_file, mesh_yaml(PLACED)).unwrap();
        let workloads = Arc::new(StateStore::new());
        weft_state::load_into(&mesh_file, &workloads).unwrap();
        drop(weft_state::watch_file(
            mesh_file.clone(),
            workloads.clone(),
            Duration::from_millis(20),
        ));
        let ca = Arc::new(LocalCa::from_dir(&ca_dir).unwrap());
        let rogue = fault.map(|_| {
            let (c, k) =
                weft_identity::ca::generate_root("cluster.local", Duration::from_secs(3600))
                    .unwrap();
            Arc::new(LocalCa::from_pem(&c, &k, vec![]).unwrap())
        });
        let tls = weft_control::ca::server_tls(&ca, &["127.0.0.1".to_owned()]).unwrap();
        let service = Arc::new(CaService {
            ca,
            trust_domain: "cluster.local".into(),
            auth: auth.unwrap_or(Authenticator::Static(StaticFile::new(tokens))),
            trusted_node_accounts: trusted,
            workloads,
            default_validity: Duration::from_secs(3600),
            max_validity: Duration::from_secs(24 * 3600),
            fault,
            rogue,
            counters: Arc::default(),
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(weft_control::ca::serve(
            listener,
            tls,
            service.clone(),
            async move {
                let _ = stopped.await;
            },
        ));
        Self {
            dir,
            addr,
            service,
            root_file,
            mesh_file,
            stop: Some(stop),
        }
    }

    /// Rewrite the CA's workload source: (service account, node) per workload, namespace `default`.
    pub fn write_mesh(&self, wls: &[(&str, &str)]) {
        std::fs::write(&self.mesh_file, mesh_yaml(wls)).unwrap();
    }

    /// A client config presenting `token`.
    pub fn client_config(&self, token: &str) -> IstioCaConfig {
        let token_file = self.dir.path().join(format!("token-{}", token.len()));
        let token_file = token_file.with_extension(format!("{:x}", fxhash(token)));
        std::fs::write(&token_file, format!("{token}\n")).unwrap();
        IstioCaConfig {
            address: format!("https://{}", self.addr),
            root_cert: Some(self.root_file.clone()),
            token_file: Some(token_file),
            cluster_id: "Kubernetes".into(),
            server_name: None,
            timeout: Duration::from_secs(5),
        }
    }

    /// A client presenting `token`.
    pub fn client(&self, token: &str) -> IstioCaClient {
        IstioCaClient::new(self.client_config(token)).unwrap()
    }
}

fn fxhash(s: &str) -> u64 {
    s.bytes().fold(0xcbf29ce484222325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100000001b3)
    })
}

/// A mesh config with one HBONE workload per (service account, node).
pub fn mesh_yaml(wls: &[(&str, &str)]) -> String {
    let mut out = String::from("workloads:\n");
    for (i, (sa, node)) in wls.iter().enumerate() {
        out.push_str(&format!(
            "- uid: Kubernetes//Pod/default/{sa}\n  name: {sa}\n  namespace: default\n  serviceAccount: {sa}\n  workloadIps: [10.9.0.{ip}]\n  protocol: HBONE\n  node: {node}\n  services: {{}}\n",
            ip = i + 1
        ));
    }
    out
}

pub const TOKEN_NODE_A: &str = "bound-to-node-a";
pub const TOKEN_POD_ON_B: &str = "bound-to-pod-on-b";
/// A workload's own token (`default/client`), bound to its pod on node-a.
pub const TOKEN_WORKLOAD_ON_A: &str = "workload-client-on-node-a";
pub const TOKEN_REJECTED: &str = "expired";
pub const TOKEN_OTHER_AUDIENCE: &str = "for-another-audience";

/// A fake Kubernetes API server (`weft_control::auth::testing`) that knows the tokens above: node-a's agent
/// (weft-system/node-a, bound to node-a), node-b's agent bound to its pod only (a cluster before 1.30: the node is
/// read from the pod), a workload's token (default/client on node-a), and one issued for another audience
/// (`vault`). `TOKEN_REJECTED` is unknown to it (expired).
pub async fn fake_kube_api() -> FakeKubeApi {
    FakeKubeApi::start(vec![
        FakeToken::new(
            TOKEN_NODE_A,
            "weft-system",
            "node-a",
            &["istio-ca"],
            "node-a",
        ),
        FakeToken::new(
            TOKEN_POD_ON_B,
            "weft-system",
            "node-b",
            &["istio-ca"],
            "node-b",
        )
        .pod_only(),
        FakeToken::new(
            TOKEN_WORKLOAD_ON_A,
            "default",
            "client",
            &["istio-ca"],
            "node-a",
        ),
        FakeToken::new(
            TOKEN_OTHER_AUDIENCE,
            "weft-system",
            "node-a",
            &["vault"],
            "node-a",
        ),
    ])
    .await
}
