//! The bench's yardstick relay pair ([`weft_conformance::relay`]) carries captured connections to the destination
//! the client dialled, both directions and the half-close, so the mesh bench's ceiling figure measures a working
//! path.

use std::net::{Ipv4Addr, SocketAddr};

use weft_conformance::netmesh::{Layout, Topology, echo_through_capture};
use weft_conformance::relay;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_pair_carries_a_captured_connection_to_its_original_destination() {
    let (c, s) = (Ipv4Addr::new(10, 248, 30, 1), Ipv4Addr::new(10, 248, 30, 2));
    let topo = Topology::create("rl", &Layout::new(c, s, 24)).expect("namespaces (needs root)");
    // Two servers on node B; the relay must reach the one the client dialled.
    let echo = SocketAddr::from((s, 8080));
    let other = SocketAddr::from((s, 9100));
    let _echo = topo.ns_b.run(move || async move {
        let (_, serving) = weft_devmesh::workload::echo_server(echo)
            .await
            .expect("echo server");
        let _ = serving.await;
    });
    let _other = topo.ns_b.run(move || async move {
        let lis = tokio::net::TcpListener::bind(other)
            .await
            .expect("second server");
        while let Ok((mut s, _)) = lis.accept().await {
            use tokio::io::AsyncWriteExt;
            let _ = s.write_all(b"other").await;
        }
    });
    let _b = topo.ns_b.run(relay::inbound);
    let _a = topo.ns_a.run(move || relay::outbound(s));
    // 1 MiB that is not one repeated byte, so a lost, doubled or reordered chunk shows.
    let payload: Vec<u8> = (0..1u32 << 20).map(|i| (i % 251) as u8).collect();
    let back = echo_through_capture(&topo.ns_a, echo, &payload).await;
    assert!(
        back == payload,
        "echo through the relays: {} bytes back of {}",
        back.len(),
        payload.len()
    );
    let back = echo_through_capture(&topo.ns_a, other, b"").await;
    assert_eq!(back, b"other", "the second server, by its port");
}
