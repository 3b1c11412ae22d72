//! Shared by weft control's tests: a dev CA and token file in a temp dir, mesh and plugin fixtures, an in-process
//! server (real TLS gRPC on a loopback port), the status endpoint over HTTP, and condition waits.

#![allow(dead_code, clippy::unwrap_used)]

pub mod client;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use weft_control::ads::{ControlConfig, Running};
use weft_control::auth::{Authenticator, StaticFile};
#[allow(unused_imports)] // not every test binary waits
pub use weft_testkit::until;

#[allow(unused_imports)]
pub use client::{AdsClient, WAIT, channel, names, node, versions};

/// Token of node-a, node-b, ... in the token file: `token-<node>`.
pub fn token(node: &str) -> String {
    format!("token-{node}")
}

/// A temp dir with a dev CA, a token file for `nodes`, a mesh file and a plugin directory.
pub struct Env {
    pub dir: tempfile::TempDir,
    pub root_pem: String,
}

impl Env {
    pub fn new(nodes: &[&str]) -> Env {
        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("ca");
        weft_identity::ca::write_root(&ca, "cluster.local", Duration::from_secs(86400)).unwrap();
        let root_pem = std::fs::read_to_string(ca.join("root-cert.pem")).unwrap();
        let mut tokens = String::from("tokens:\n");
        for n in nodes {
            tokens.push_str(&format!(
                "- {{token: {}, node: {n}, identity: spiffe://cluster.local/ns/weft-system/sa/weft}}\n",
                token(n)
            ));
        }
        std::fs::write(dir.path().join("tokens.yaml"), tokens).unwrap();
        std::fs::create_dir(dir.path().join("plugins")).unwrap();
        let env = Env { dir, root_pem };
        env.write("mesh.yaml", &mesh(&["echo-1"]));
        env
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// Replace a file atomically (as editors and kubelet's ConfigMap updates do).
    pub fn write(&self, rel: &str, text: &str) {
        write_atomic(&self.path(rel), text.as_bytes());
    }

    pub fn config(&self) -> ControlConfig {
        let ca = weft_identity::LocalCa::from_dir(&self.path("ca")).unwrap();
        let tls = weft_control::auth::server_tls_from_ca(
            &ca,
            &["localhost".into(), "127.0.0.1".into()],
            Duration::from_secs(3600),
        )
        .unwrap();
        ControlConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            tls,
            auth: Authenticator::Static(StaticFile::new(self.path("tokens.yaml"))),
            node_accounts: Vec::new(),
            mesh: Some(self.path("mesh.yaml")),
            plugins_dir: Some(self.path("plugins")),
            kube: None,
            rollout_state: Some(self.path("rollout-state.json")),
            poll: Duration::from_millis(20),
            status: Some("127.0.0.1:0".parse().unwrap()),
            metrics: Some("127.0.0.1:0".parse().unwrap()),
            log: None,
        }
    }

    pub async fn start(&self) -> Running {
        weft_control::ads::start(self.config()).await.unwrap()
    }

    pub async fn client(&self, addr: SocketAddr, name: &str) -> AdsClient {
        AdsClient::open(
            channel(addr, &self.root_pem),
            Some(&token(name)),
            node(name),
        )
        .await
        .unwrap()
    }
}

pub fn write_atomic(path: &Path, bytes: &[u8]) {
    let tmp = path.with_extension("tmp-write");
    std::fs::write(&tmp, bytes).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// A mesh file with one HBONE workload per name (uid `Kubernetes//Pod/default/<name>`) backing service `echo`,
/// and one policy.
pub fn mesh(workloads: &[&str]) -> String {
    let mut s = String::from("workloads:\n");
    for w in workloads {
        // The address follows the name (echo-2 → 127.0.2.2), so removing one workload changes no other.
        let ip: u8 = w
            .rsplit('-')
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or(100);
        s.push_str(&format!(
            "- uid: Kubernetes//Pod/default/{w}\n  name: {w}\n  namespace: default\n  serviceAccount: echo\n  \
             workloadIps: [127.0.2.{}]\n  protocol: HBONE\n  node: node-b\n  services:\n    \
             default/echo.default.svc.cluster.local: {{80: 8080}}\n",
            ip
        ));
    }
    s.push_str(
        "services:\n- name: echo\n  namespace: default\n  hostname: echo.default.svc.cluster.local\n  \
         vips: [\"/127.10.0.1\"]\n  ports: {80: 8080}\n\
         policies:\n- name: allow-sleep\n  namespace: default\n  scope: Namespace\n  action: Allow\n  \
         rules: [[[{principals: [!Exact cluster.local/ns/default/sa/sleep]}]]]\n",
    );
    s
}

/// A WeftPlugin file with inline (file://) code.
pub fn plugin_yaml(name: &str, code_file: &str, config: &str, extra: &str) -> String {
    format!(
        "apiVersion: weft.dev/v1alpha1\nkind: WeftPlugin\nmetadata:\n  name: {name}\nspec:\n  url: file://{code_file}\n  \
         pluginConfig: {config}\n  kind: policy\n{extra}"
    )
}

/// GET a path of a loopback HTTP server; returns (status, body).
pub async fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await.unwrap();
    let text = String::from_utf8_lossy(&buf).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

/// The status document.
pub async fn status(addr: SocketAddr) -> serde_json::Value {
    let (code, body) = http_get(addr, "/status").await;
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

/// Decode the WeftPlugin inside a TypedExtensionConfig resource.
pub fn weft_plugin(any: &prost_types::Any) -> weft_proto::weft::plugin::v1::WeftPlugin {
    let tec: weft_proto::envoy::config::core::v3::TypedExtensionConfig =
        weft_proto::from_any(weft_proto::type_url::EXTENSION_CONFIG, any).unwrap();
    weft_proto::from_any(
        weft_proto::type_url::WEFT_PLUGIN,
        tec.typed_config.as_ref().unwrap(),
    )
    .unwrap()
}

pub fn arc<T>(t: T) -> Arc<T> {
    Arc::new(t)
}
