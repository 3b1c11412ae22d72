//! Application tunnels through two real weft nodes over mutual-TLS HBONE: a workload with
//! `applicationTunnel: {protocol: PROXY, port}` gets each connection on that port with a PROXY protocol v2 header
//! first (source: the HBONE client's address; destination: the CONNECT authority; TLV 0xD0: the client's SPIFFE
//! id), read here by a strict parser; `protocol: NONE` moves the port only.
#![allow(clippy::unwrap_used)] // a test panics to fail

use std::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use weft_conformance::{Addrs, Mesh, eventually, mesh_yaml};
use weft_devmesh::{socks5, workload};

const SIGNATURE: [u8; 12] = [
    0x0D, 0x0A, 0x0D, 0x0A, 0x00, 0x0D, 0x0A, 0x51, 0x55, 0x49, 0x54, 0x0A,
];

/// A PROXY v2 header as the application read it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Header {
    src: SocketAddrV4,
    dst: SocketAddrV4,
    tlvs: Vec<(u8, Vec<u8>)>,
}

/// Read one PROXY v2 header, refusing anything but exactly what the spec allows for a TCP/IPv4 PROXY command:
/// the signature, version 2 / command PROXY, AF_INET + STREAM, a length that covers the addresses and whole TLVs.
async fn read_header(s: &mut TcpStream) -> Result<Header, String> {
    let mut fixed = [0u8; 16];
    s.read_exact(&mut fixed).await.map_err(|e| e.to_string())?;
    if fixed[..12] != SIGNATURE {
        return Err(format!("bad signature {:02x?}", &fixed[..12]));
    }
    if fixed[12] != 0x21 {
        return Err(format!("version/command {:#04x}, want 0x21", fixed[12]));
    }
    if fixed[13] != 0x11 {
        return Err(format!("family/transport {:#04x}, want 0x11", fixed[13]));
    }
    let len = usize::from(u16::from_be_bytes([fixed[14], fixed[15]]));
    if len < 12 {
        return Err(format!("length {len} cannot hold IPv4 addresses"));
    }
    let mut rest = vec![0u8; len];
    s.read_exact(&mut rest).await.map_err(|e| e.to_string())?;
    let ip = |b: &[u8]| Ipv4Addr::new(b[0], b[1], b[2], b[3]);
    let port = |b: &[u8]| u16::from_be_bytes([b[0], b[1]]);
    let src = SocketAddrV4::new(ip(&rest[0..4]), port(&rest[8..10]));
    let dst = SocketAddrV4::new(ip(&rest[4..8]), port(&rest[10..12]));
    let mut tlvs = Vec::new();
    let mut t = &rest[12..];
    while !t.is_empty() {
        if t.len() < 3 {
            return Err(format!("{} stray bytes after the TLVs", t.len()));
        }
        let n = usize::from(u16::from_be_bytes([t[1], t[2]]));
        if t.len() < 3 + n {
            return Err(format!(
                "TLV {:#04x} of {n} bytes overruns the header",
                t[0]
            ));
        }
        tlvs.push((t[0], t[3..3 + n].to_vec()));
        t = &t[3 + n..];
    }
    Ok(Header { src, dst, tlvs })
}

/// The application behind the tunnel: reads the header (reported on `tx`), then echoes the bytes.
async fn proxy_app(addr: SocketAddr) -> mpsc::UnboundedReceiver<Result<Header, String>> {
    let lis = TcpListener::bind(addr).await.unwrap();
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = lis.accept().await {
            let tx = tx.clone();
            tokio::spawn(async move {
                let h = read_header(&mut s).await;
                let ok = h.is_ok();
                let _ = tx.send(h);
                if ok {
                    let (mut r, mut w) = s.into_split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                    let _ = w.shutdown().await;
                }
            });
        }
    });
    rx
}

fn with_tunnel(yaml: &str, tunnel: &str) -> String {
    let at = "  node: node-b\n  services:\n    default/echo.default.svc.cluster.local:";
    assert!(yaml.contains(at));
    yaml.replace(
        at,
        &format!("  node: node-b\n  applicationTunnel: {tunnel}\n  services:\n    default/echo.default.svc.cluster.local:"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_v2_header_reaches_the_application() {
    let a = Addrs { n: 164 };
    let yaml = with_tunnel(&mesh_yaml(a, "echo"), "{protocol: PROXY, port: 15088}");
    let mut headers = proxy_app(SocketAddr::from((a.echo(), 15088))).await;
    let mesh = Mesh::start(a, &yaml, &yaml).await.unwrap();
    let client_id = b"spiffe://cluster.local/ns/default/sa/client".to_vec();
    let authority = SocketAddrV4::new(a.echo(), 8080);

    // To the workload's address, then to the service VIP (node A resolves it to the same endpoint).
    for (i, dst) in [
        SocketAddr::from((a.echo(), 8080)),
        SocketAddr::from((a.vip(), 80)),
    ]
    .into_iter()
    .enumerate()
    {
        let s = socks5::connect(mesh.a.socks5, Some(IpAddr::V4(a.client())), dst)
            .await
            .unwrap();
        let data: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        let back = workload::round_trip(s, &data).await.unwrap();
        assert!(back == data, "bytes after the header came back changed");
        let h = tokio::time::timeout(Duration::from_secs(30), headers.recv())
            .await
            .unwrap()
            .unwrap()
            .unwrap_or_else(|e| panic!("the application refused the header: {e}"));
        assert_eq!(h.dst, authority, "destination = the CONNECT authority");
        assert_eq!(*h.src.ip(), a.client(), "source = the HBONE client");
        assert_eq!(
            h.tlvs,
            vec![(0xD0, client_id.clone())],
            "TLV 0xD0 = the peer identity"
        );
        // The source port is the HBONE connection's: node B's access log names the same peer address.
        let logs = eventually(Duration::from_secs(30), "node-b access log", || async {
            let l = mesh.b.access_logs();
            (l.len() > i).then_some(l)
        })
        .await;
        let line = &logs[i];
        assert_eq!(line["src.addr"], h.src.to_string(), "{line}");
        // As in ztunnel, policy and telemetry see the port the application was dialled on.
        assert_eq!(line["dst.addr"], format!("{}:15088", a.echo()), "{line}");
        assert_eq!(
            line["src.identity"],
            "spiffe://cluster.local/ns/default/sa/client"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_none_tunnel_moves_the_port_without_a_header() {
    let a = Addrs { n: 166 };
    let yaml = with_tunnel(&mesh_yaml(a, "echo"), "{protocol: NONE, port: 15089}");
    // The application on the tunnel port answers with a mark first and then the bytes exactly as they came, so a
    // header (or the connection landing on the workload's 8080 echo instead) fails the comparison.
    let lis = TcpListener::bind(SocketAddr::from((a.echo(), 15089)))
        .await
        .unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = lis.accept().await {
            tokio::spawn(async move {
                let mut got = Vec::new();
                if s.read_to_end(&mut got).await.is_ok() {
                    let _ = s.write_all(b"15089:").await;
                    let _ = s.write_all(&got).await;
                    let _ = s.shutdown().await;
                }
            });
        }
    });
    let mesh = Mesh::start(a, &yaml, &yaml).await.unwrap();
    let s = socks5::connect(
        mesh.a.socks5,
        Some(IpAddr::V4(a.client())),
        SocketAddr::from((a.echo(), 8080)),
    )
    .await
    .unwrap();
    let data = b"plain bytes, no header".to_vec();
    let back = workload::round_trip(s, &data).await.unwrap();
    assert_eq!(
        String::from_utf8_lossy(&back),
        "15089:plain bytes, no header"
    );
    let logs = eventually(Duration::from_secs(30), "node-b access log", || async {
        let l = mesh.b.access_logs();
        (!l.is_empty()).then_some(l)
    })
    .await;
    assert_eq!(logs[0]["dst.addr"], format!("{}:15089", a.echo()));
}
