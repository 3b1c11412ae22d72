//! weft and Istio's real ztunnel on one layout (see `weft_conformance::ztunnel::MixedMesh`), each way round: a
//! captured client on a weft node reaches a server behind a ztunnel node and the other way, and ztunnel's HBONE
//! server takes early data (the client's first bytes sent behind the CONNECT, before its 200), as weft sends it.
//! Needs root and `ZTUNNEL_BIN` (a ztunnel built from its public source); without it each test says why and
//! passes (CI has no ztunnel).
#![allow(clippy::unwrap_used)] // a test panics to fail

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use weft_conformance::eventually;
use weft_conformance::netmesh::{connect, echo_through_capture};
use weft_conformance::ztunnel::{MixedMesh, ztunnel_binary};
use weft_devmesh::workload;
use weft_identity::{LocalCa, ManagerConfig, SecretManager, SpiffeId};

fn ztunnel() -> Option<std::path::PathBuf> {
    match ztunnel_binary() {
        Ok(b) => Some(b),
        Err(why) => {
            eprintln!("skipped: {why}");
            None
        }
    }
}

fn payload(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i % 251) as u8 ^ seed).collect()
}

/// Start the echo server in node B's namespace and send `sizes` round trips through node A's capture; each must
/// come back whole.
async fn captured_round_trips(mesh: &MixedMesh, sizes: &[usize]) -> std::thread::JoinHandle<()> {
    let dst = mesh.server();
    let echo = mesh.topo.ns_b.run(move || async move {
        let (_, t) = workload::echo_server(dst).await.unwrap();
        let _ = t.await;
    });
    let echo = std::thread::spawn(move || {
        let _ = echo.join();
    });
    for (i, &len) in sizes.iter().enumerate() {
        let sent = payload(len, i as u8);
        let back = echo_through_capture(&mesh.topo.ns_a, dst, &sent).await;
        assert!(back == sent, "{len} bytes sent, {} came back", back.len());
    }
    echo
}

/// weft's access log line for the connection of `direction` that sent `len` bytes, once it is written.
async fn logged(mesh: &MixedMesh, len: usize, direction: &str) -> serde_json::Value {
    eventually(Duration::from_secs(10), "weft's access log", || async {
        mesh.weft
            .access_logs()
            .into_iter()
            .find(|l| l["bytes_sent"] == len && l["direction"] == direction)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weft_client_node_to_ztunnel_server_node() {
    let Some(bin) = ztunnel() else { return };
    let mut mesh = MixedMesh::start("xa", 40, &bin, "info", true)
        .await
        .expect("mixed pair (needs root, weft and weft-ca built)");
    let sizes = [5, 40_000, 1_000_000];
    let _echo = captured_round_trips(&mesh, &sizes).await;
    // weft counted every byte, the early ones included.
    for len in sizes {
        let log = logged(&mesh, len, "outbound").await;
        assert_eq!(
            log["dst.hbone_addr"],
            format!("{}:15008", mesh.topo.server_ip),
            "{log}"
        );
    }

    // A raw HBONE client (the weft-hbone crate, as weft's outbound uses it) with node A's client identity sends its
    // bytes as early data: ztunnel must deliver them to the server ahead of what follows.
    let ca = LocalCa::from_dir(&mesh.dir.path().join("ca")).unwrap();
    let ids = SecretManager::new(Arc::new(ca), ManagerConfig::default());
    let client_id: SpiffeId = "spiffe://cluster.local/ns/default/sa/client"
        .parse()
        .unwrap();
    let cert = ids.fetch(&client_id).await.unwrap();
    let hbone = SocketAddr::new(mesh.topo.server_ip.into(), 15008);
    let dst = mesh.server();
    let back = mesh
        .topo
        .ns_a
        .run(move || async move {
            let echo_id: SpiffeId = "spiffe://cluster.local/ns/default/sa/echo".parse().unwrap();
            // Marked: node A's capture must not take the tunnel itself.
            let tcp = connect(hbone, true).await.map_err(|e| e.to_string())?;
            let tls = tokio_rustls::TlsConnector::from(cert.client_config(vec![echo_id]).unwrap())
                .connect(
                    rustls::pki_types::ServerName::IpAddress(hbone.ip().into()),
                    tcp,
                )
                .await
                .map_err(|e| e.to_string())?;
            let c = weft_hbone::handshake(tls, &weft_hbone::H2Config::default())
                .await
                .map_err(|e| e.to_string())?;
            let early = bytes::Bytes::from(payload(3000, 9));
            let req = weft_hbone::ConnectRequest::to_addr(dst).with_early_data(early);
            let (stream, _) = c.connect(req).await.map_err(|e| e.to_string())?;
            let (mut r, mut w) = tokio::io::split(stream);
            let send = async {
                w.write_all(b"and then the rest").await?;
                w.shutdown().await
            };
            let mut back = Vec::new();
            let (sent, got) = tokio::join!(send, r.read_to_end(&mut back));
            sent.and(got).map_err(|e| e.to_string())?;
            Ok::<_, String>(back)
        })
        .join()
        .unwrap()
        .unwrap()
        .expect("early data through ztunnel");
    let mut want = payload(3000, 9);
    want.extend_from_slice(b"and then the rest");
    assert!(back == want, "ztunnel delivered {} bytes", back.len());
    mesh.ztunnel.terminate(Duration::from_secs(5)).await;
    assert!(mesh.weft.terminate(Duration::from_secs(10)).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ztunnel_client_node_to_weft_server_node() {
    let Some(bin) = ztunnel() else { return };
    let mut mesh = MixedMesh::start("xb", 41, &bin, "info", false)
        .await
        .expect("mixed pair (needs root, weft and weft-ca built)");
    let sizes = [5, 40_000, 1_000_000];
    let _echo = captured_round_trips(&mesh, &sizes).await;
    for len in sizes {
        let log = logged(&mesh, len, "inbound").await;
        assert_eq!(
            log["src.identity"], "spiffe://cluster.local/ns/default/sa/client",
            "{log}"
        );
    }
    mesh.ztunnel.terminate(Duration::from_secs(5)).await;
    assert!(mesh.weft.terminate(Duration::from_secs(10)).await);
}
