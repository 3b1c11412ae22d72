//! Both TLS record layers (`--tls-record-layer weft|rustls`) carry the mesh, and each speaks to the other: two real
//! weft nodes in network namespaces, node A on one layer and node B on the other, a captured connection echoed
//! through HBONE in every pairing.

use std::net::Ipv4Addr;

use weft_conformance::netmesh::{Layout, NetMesh, echo_through_capture, yaml};

/// The record layer a node says it runs, from its "weft starting" line.
fn layer_of(node: &weft_devmesh::node::NodeProcess) -> String {
    node.log_lines()
        .iter()
        .find(|l| l["message"] == "weft starting")
        .and_then(|l| l["tls_record_layer"].as_str().map(str::to_owned))
        .unwrap_or_else(|| panic!("no record layer in the start line: {}", node.log_tail(20)))
}

async fn echo_between(subnet: u8, a: &str, b: &str) {
    let (c, s) = (
        Ipv4Addr::new(10, 248, subnet, 1),
        Ipv4Addr::new(10, 248, subnet, 2),
    );
    let mut layout = Layout::new(c, s, 24);
    layout.flags_a = vec![format!("--tls-record-layer={a}")];
    layout.flags_b = vec![format!("--tls-record-layer={b}")];
    let mesh = NetMesh::start_with(&format!("rl{subnet}"), &layout, &yaml(c, s), "info")
        .await
        .expect("mesh (needs root)");
    assert_eq!(
        (layer_of(&mesh.a).as_str(), layer_of(&mesh.b).as_str()),
        (a, b)
    );
    let _echo = mesh.spawn_echo();
    // 4 MiB that is not one repeated byte: many full records each way, a lost or reordered one shows.
    let payload: Vec<u8> = (0..4u32 << 20).map(|i| (i % 251) as u8).collect();
    let back = echo_through_capture(&mesh.ns_a, mesh.server(), &payload).await;
    assert!(
        back == payload,
        "{a} -> {b}: {} bytes back of {}",
        back.len(),
        payload.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weft_client_rustls_server() {
    echo_between(41, "weft", "rustls").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rustls_client_weft_server() {
    echo_between(42, "rustls", "weft").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rustls_both_ends() {
    echo_between(43, "rustls", "rustls").await;
}
