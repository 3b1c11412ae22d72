//! Inbound HBONE policy judges the TCP peer address, never the `forwarded: for=` address the peer writes: a raw
//! HBONE client with a valid mesh certificate connects to a real weft node from a chosen source IP and claims
//! another one in `forwarded`; `sourceIps` policies (DENY and ALLOW-only) must decide on the real address, as
//! ztunnel does, and the access log keeps the claim apart (`forwarded_for`).
#![allow(clippy::unwrap_used)] // a test panics to fail

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderMap, HeaderValue, StatusCode};
use weft_conformance::{Addrs, Mesh, eventually, mesh_yaml};
use weft_identity::{LocalCa, ManagerConfig, SecretManager, SpiffeId, WorkloadCert};

/// Generous bound for a node to apply its policies after it reports ready.
const POLICY_WAIT: Duration = Duration::from_secs(30);

/// The honest source the policies name, and the other one, both on node A's subnet (client side).
fn five(a: Addrs) -> Ipv4Addr {
    Ipv4Addr::new(127, 0, a.n, 5)
}
fn six(a: Addrs) -> Ipv4Addr {
    Ipv4Addr::new(127, 0, a.n, 6)
}
fn nine(a: Addrs) -> Ipv4Addr {
    Ipv4Addr::new(127, 0, a.n, 9)
}

fn policy(a: Addrs, action: &str) -> String {
    format!(
        r#"policies:
- name: source-five
  namespace: default
  scope: Namespace
  action: {action}
  rules:
  - - - sourceIps: [{five}/32]
"#,
        five = five(a)
    )
}

async fn client_cert(mesh: &Mesh) -> Arc<WorkloadCert> {
    let ca = LocalCa::from_dir(&mesh.ca_dir()).unwrap();
    let m = SecretManager::new(Arc::new(ca), ManagerConfig::default());
    m.fetch(
        &"spiffe://cluster.local/ns/default/sa/client"
            .parse::<SpiffeId>()
            .unwrap(),
    )
    .await
    .unwrap()
}

/// One HBONE connection from `src` (a TCP socket bound to that IP) to node B's echo workload, one CONNECT with
/// `forwarded: for="<claim>:4000"` (if any); the status the node answered.
async fn connect_from(
    mesh: &Mesh,
    cert: &WorkloadCert,
    src: Ipv4Addr,
    claim: Option<Ipv4Addr>,
) -> StatusCode {
    let a = mesh.addrs;
    let hbone = SocketAddr::from((a.echo(), 15008));
    let echo_id: SpiffeId = "spiffe://cluster.local/ns/default/sa/echo".parse().unwrap();
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.bind(SocketAddr::new(IpAddr::V4(src), 0)).unwrap();
    let tcp = sock.connect(hbone).await.unwrap();
    let tls = tokio_rustls::TlsConnector::from(cert.client_config(vec![echo_id]).unwrap())
        .connect(
            rustls::pki_types::ServerName::IpAddress(hbone.ip().into()),
            tcp,
        )
        .await
        .unwrap();
    let c = weft_hbone::handshake(tls, &weft_hbone::H2Config::default())
        .await
        .unwrap();
    let mut headers = HeaderMap::new();
    if let Some(ip) = claim {
        headers.insert(
            "forwarded",
            HeaderValue::from_str(&format!("for=\"{ip}:4000\"")).unwrap(),
        );
    }
    let req = weft_hbone::ConnectRequest {
        authority: format!("{}:8080", a.echo()),
        headers,
        early_data: Default::default(),
    };
    match c.connect(req).await {
        Ok(_) => StatusCode::OK,
        Err(weft_hbone::Error::Status(s)) => s,
        Err(e) => panic!("CONNECT from {src} failed without a status: {e}"),
    }
}

/// The access-log line of node B for a connection from `src` that claimed `claim`.
fn access_line(mesh: &Mesh, src: Ipv4Addr, claim: Ipv4Addr) -> Option<serde_json::Value> {
    let claim = format!("{claim}:4000");
    let src = format!("{src}:");
    mesh.b.access_logs().into_iter().find(|l| {
        l["forwarded_for"].as_str() == Some(claim.as_str())
            && l["src.addr"].as_str().is_some_and(|s| s.starts_with(&src))
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deny_policy_on_source_ip_ignores_forwarded_for() {
    let a = Addrs { n: 90 };
    let base = mesh_yaml(a, "echo");
    let yaml_b = format!("{base}{}", policy(a, "Deny"));
    let mesh = Mesh::start(a, &base, &yaml_b).await.unwrap();
    let cert = client_cert(&mesh).await;

    // Honest: 127.0.N.5 is denied (waiting until node B enforces the policy), 127.0.N.6 is allowed.
    eventually(POLICY_WAIT, "the DENY policy in force", || async {
        (connect_from(&mesh, &cert, five(a), None).await == StatusCode::UNAUTHORIZED).then_some(())
    })
    .await;
    assert_eq!(
        connect_from(&mesh, &cert, five(a), Some(five(a))).await,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        connect_from(&mesh, &cert, six(a), None).await,
        StatusCode::OK
    );
    assert_eq!(
        connect_from(&mesh, &cert, six(a), Some(six(a))).await,
        StatusCode::OK
    );

    // Spoof: a peer from the denied address claiming another one is still denied.
    assert_eq!(
        connect_from(&mesh, &cert, five(a), Some(nine(a))).await,
        StatusCode::UNAUTHORIZED,
        "a peer from {} claiming for={} must be denied",
        five(a),
        nine(a)
    );
    let line = eventually(
        Duration::from_secs(10),
        "the spoofed attempt's access log",
        || {
            let l = access_line(&mesh, five(a), nine(a));
            async move { l }
        },
    )
    .await;
    assert!(
        line["error"]
            .as_str()
            .unwrap()
            .contains("default/source-five"),
        "{line}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allow_policy_on_source_ip_ignores_forwarded_for() {
    let a = Addrs { n: 92 };
    let base = mesh_yaml(a, "echo");
    let yaml_b = format!("{base}{}", policy(a, "Allow"));
    let mesh = Mesh::start(a, &base, &yaml_b).await.unwrap();
    let cert = client_cert(&mesh).await;

    // Honest: 127.0.N.6 is not allowed (waiting until node B enforces the policy), 127.0.N.5 is.
    eventually(POLICY_WAIT, "the ALLOW policy in force", || async {
        (connect_from(&mesh, &cert, six(a), None).await == StatusCode::UNAUTHORIZED).then_some(())
    })
    .await;
    assert_eq!(
        connect_from(&mesh, &cert, five(a), None).await,
        StatusCode::OK
    );
    assert_eq!(
        connect_from(&mesh, &cert, five(a), Some(five(a))).await,
        StatusCode::OK
    );

    // Spoof: a peer from another address claiming the allowed one is denied.
    assert_eq!(
        connect_from(&mesh, &cert, six(a), Some(five(a))).await,
        StatusCode::UNAUTHORIZED,
        "a peer from {} claiming for={} must be denied",
        six(a),
        five(a)
    );
    let line = eventually(
        Duration::from_secs(10),
        "the spoofed attempt's access log",
        || {
            let l = access_line(&mesh, six(a), five(a));
            async move { l }
        },
    )
    .await;
    assert_eq!(line["dst.addr"], format!("{}:8080", a.echo()));
}
