//! A plain TCP relay pair for the [`crate::netmesh::Topology`] layout: the least work per byte a userspace node
//! proxy can do on that path (no TLS, no HTTP/2, no policy), so the mesh bench can show how far any real proxy
//! could get on this machine.
//!
//! Node A's relay ([`outbound`]) accepts what the capture redirects to 15001, reads the original destination
//! (`SO_ORIGINAL_DST`), connects to node B's relay on [`PORT`] with a [`MARK`](crate::netmesh::MARK)ed socket (so the
//! capture skips it) and sends the destination as six bytes (IPv4 address, port, big-endian); node B's relay
//! ([`inbound`]) reads them, connects to the destination and both copy in both directions with [`BUF`]-sized buffers
//! until both directions have ended (a half-close is passed on). It is a yardstick, not a proxy: no identity, no
//! authorization, IPv4 only.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::netmesh::connect;

/// Node B's relay port (HBONE's, in plaintext).
pub const PORT: u16 = 15008;
/// Node A's capture port (the [`crate::netmesh::capture_outbound`] rule's target).
pub const CAPTURE: u16 = 15001;
/// What a relay prints on stdout once its listener is bound (then the port).
pub const LISTENING: &str = "relay listening on port";
/// Copy buffer per direction of a relayed connection: large, so a bulk flow takes few syscalls per byte.
pub const BUF: usize = 256 * 1024;

/// Node A's relay: serves connections redirected to [`CAPTURE`] by relaying each to `peer`'s [`inbound`] relay.
/// Returns only if the listener cannot be bound or accepting fails.
pub async fn outbound(peer: Ipv4Addr) -> std::io::Result<()> {
    let listener = TcpListener::bind((Ipv4Addr::UNSPECIFIED, CAPTURE)).await?;
    println!("{LISTENING} {CAPTURE}");
    loop {
        let (client, _) = listener.accept().await?;
        tokio::spawn(async move {
            if let Err(e) = relay_out(client, peer).await {
                eprintln!("relay (node A): {e}");
            }
        });
    }
}

async fn relay_out(mut client: TcpStream, peer: Ipv4Addr) -> std::io::Result<()> {
    client.set_nodelay(true)?;
    let dst = socket2::SockRef::from(&client)
        .original_dst_v4()?
        .as_socket_ipv4()
        .ok_or_else(|| std::io::Error::other("original destination is not IPv4"))?;
    let mut up = connect(SocketAddr::from((peer, PORT)), true).await?;
    let mut head = [0u8; 6];
    head[..4].copy_from_slice(&dst.ip().octets());
    head[4..].copy_from_slice(&dst.port().to_be_bytes());
    up.write_all(&head).await?;
    tokio::io::copy_bidirectional_with_sizes(&mut client, &mut up, BUF, BUF).await?;
    Ok(())
}

/// Node B's relay: serves [`PORT`], connecting each relayed connection to the destination its first six bytes name.
/// Returns only if the listener cannot be bound or accepting fails.
pub async fn inbound() -> std::io::Result<()> {
    let listener = TcpListener::bind((Ipv4Addr::UNSPECIFIED, PORT)).await?;
    println!("{LISTENING} {PORT}");
    loop {
        let (down, _) = listener.accept().await?;
        tokio::spawn(async move {
            if let Err(e) = relay_in(down).await {
                eprintln!("relay (node B): {e}");
            }
        });
    }
}

async fn relay_in(mut down: TcpStream) -> std::io::Result<()> {
    down.set_nodelay(true)?;
    let mut head = [0u8; 6];
    down.read_exact(&mut head).await?;
    let ip = Ipv4Addr::new(head[0], head[1], head[2], head[3]);
    let port = u16::from_be_bytes([head[4], head[5]]);
    let mut server = connect(SocketAddr::V4(SocketAddrV4::new(ip, port)), false).await?;
    tokio::io::copy_bidirectional_with_sizes(&mut down, &mut server, BUF, BUF).await?;
    Ok(())
}
