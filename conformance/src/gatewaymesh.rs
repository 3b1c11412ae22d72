//! Two networks as three network namespaces: node A on network net1 (`10.<net>.1.0/24`), node B on net2
//! (`10.<net>.2.0/24`), and between them a gateway namespace with one veth link on each network that does not
//! forward IP. A has no route to net2 and B none to net1, so A's only way to B is HBONE to the gateway, which
//! relays it from its own net2 address (the test runs the gateway there: `WaypointStandIn::start_in`). Node A's
//! outbound TCP is captured to weft's 15001 as in [`crate::netmesh`]; an echo server listens on B's `:8080`; service
//! VIPs (`10.96.0.0/16`) are routed out of A's link, so the capture sees them. Needs root.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;

use tokio_util::sync::CancellationToken;
use weft_devmesh::NodeProcess;
use weft_devmesh::netns::{Netns, link};
use weft_devmesh::workload;

use crate::netmesh::{capture_outbound, start_nodes};

/// The addresses of a [`GatewayMesh`] on `10.<net>.1.0/24` (net1) and `10.<net>.2.0/24` (net2).
#[derive(Debug, Clone, Copy)]
pub struct TwoNetworks {
    /// Second byte of every link address.
    pub net: u8,
}

impl TwoNetworks {
    /// Node A's address on net1 (the client workload's IP).
    pub fn client(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, self.net, 1, 1)
    }
    /// The gateway's address on net1 (where net1 reaches it: its `networkGateway` address).
    pub fn gateway_net1(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, self.net, 1, 254)
    }
    /// The gateway's address on net2 (where it dials net2's nodes from).
    pub fn gateway_net2(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, self.net, 2, 254)
    }
    /// Node B's address on net2 (the echo workload's IP).
    pub fn server(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, self.net, 2, 1)
    }
    /// A service VIP (in the VIP range routed out of A's link).
    pub fn vip(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, 96, self.net, 1)
    }
}

/// A running two-network mesh; the echo server stops, nodes are killed and namespaces deleted on drop.
#[derive(Debug)]
pub struct GatewayMesh {
    /// The addresses.
    pub nets: TwoNetworks,
    /// Node A's namespace (net1; capture on).
    pub ns_a: Netns,
    /// The gateway's namespace (on net1 and net2; no IP forwarding).
    pub ns_gw: Netns,
    /// Node B's namespace (net2; the echo server).
    pub ns_b: Netns,
    /// Node A.
    pub a: NodeProcess,
    /// Node B.
    pub b: NodeProcess,
    /// Scratch directory (mesh file, CA, logs).
    pub dir: tempfile::TempDir,
    echo: CancellationToken,
}

impl GatewayMesh {
    /// Build the namespaces, links, routes and capture, the echo server on B, and both nodes reading `mesh_yaml`
    /// ([`GatewayMesh::config_path`]); `tag` keeps namespace and link names unique.
    pub async fn start(
        tag: &str,
        nets: TwoNetworks,
        mesh_yaml: &str,
        log: &str,
    ) -> Result<Self, String> {
        let id = std::process::id() % 100_000;
        let ns_a = Netns::create(&format!("weft-{tag}a-{id}"))?;
        let ns_gw = Netns::create(&format!("weft-{tag}g-{id}"))?;
        let ns_b = Netns::create(&format!("weft-{tag}b-{id}"))?;
        let (ia, ig1, ig2, ib) = (
            format!("wg{tag}a1"),
            format!("wg{tag}g1"),
            format!("wg{tag}g2"),
            format!("wg{tag}b2"),
        );
        link(
            &ns_a,
            &ia,
            &format!("{}/24", nets.client()),
            &ns_gw,
            &ig1,
            &format!("{}/24", nets.gateway_net1()),
        )?;
        link(
            &ns_gw,
            &ig2,
            &format!("{}/24", nets.gateway_net2()),
            &ns_b,
            &ib,
            &format!("{}/24", nets.server()),
        )?;
        // The gateway is a host on both networks, not a router between them.
        ns_gw.exec("sysctl", &["-qw", "net.ipv4.ip_forward=0"])?;
        ns_a.exec("ip", &["route", "add", "10.96.0.0/16", "dev", &ia])?;
        capture_outbound(&ns_a, &ia, false)?;
        let stop = CancellationToken::new();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let echo_addr = SocketAddr::from((nets.server(), 8080));
        let stop_echo = stop.clone();
        let echo_thread = ns_b.run(move || async move {
            match workload::echo_server(echo_addr).await {
                Ok((_, task)) => {
                    let _ = tx.send(Ok(()));
                    stop_echo.cancelled().await;
                    task.abort();
                }
                Err(e) => {
                    let _ = tx.send(Err(format!("echo server on {echo_addr}: {e}")));
                }
            }
        });
        match rx.await {
            Ok(r) => r?,
            Err(_) => {
                return Err(
                    match tokio::task::spawn_blocking(move || echo_thread.join()).await {
                        Ok(Ok(Err(e))) => e,
                        _ => "echo server thread ended".to_owned(),
                    },
                );
            }
        }
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let none: &[String] = &[];
        let (a, b) = start_nodes(
            (&ns_a, &ns_b),
            dir.path(),
            mesh_yaml,
            (none, none),
            log,
            None,
            true,
        )
        .await?;
        Ok(Self {
            nets,
            ns_a,
            ns_gw,
            ns_b,
            a,
            b,
            dir,
            echo: stop,
        })
    }

    /// The mesh file both nodes watch (rewrite it to change the mesh).
    pub fn config_path(&self) -> PathBuf {
        self.dir.path().join("mesh.yaml")
    }

    /// The CA directory (for the gateway's certificate).
    pub fn ca_dir(&self) -> PathBuf {
        self.dir.path().join("ca")
    }
}

impl Drop for GatewayMesh {
    fn drop(&mut self) {
        self.echo.cancel();
    }
}
