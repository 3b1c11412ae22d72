//! A node started in-process from a `NodeConfig` (`weft::start`), on the test's own runtime: its SOCKS5 listener
//! and its admin server answer, `/config_dump` shows the config it runs with, and it shuts down cleanly.
#![allow(clippy::unwrap_used)] // a test panics to fail

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A port free on loopback now (the node binds it a moment later).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

async fn get(addr: std::net::SocketAddr, path: &str) -> String {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let req = format!("GET {path} HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_starts_in_process_from_a_node_config_and_shuts_down() {
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca");
    weft_identity::ca::write_root(&ca, "cluster.local", Duration::from_secs(3600)).unwrap();
    let mesh = dir.path().join("mesh.yaml");
    std::fs::write(&mesh, "workloads: []\n").unwrap();
    let socks5 = format!("127.0.0.1:{}", free_port());
    let node_yaml = dir.path().join("node.yaml");
    std::fs::write(
        &node_yaml,
        format!(
            "node: in-process\nconfig: {}\ncaDir: {}\nsocks5: {socks5}\nadmin: 127.0.0.1:0\n\
             metrics: off\nreadiness: off\noutbound: off\ninboundPlaintext: off\nhbone: off\ndns: off\n\
             defaultPlugins: false\nworkerThreads: 1\nshards: 0\n",
            mesh.display(),
            ca.display()
        ),
    )
    .unwrap();
    let config =
        weft::NodeConfig::from_args(["--config-file", node_yaml.to_str().unwrap()]).unwrap();
    assert_eq!(config.node, "in-process");

    let node = weft::start(config).await.unwrap();

    // SOCKS5: the greeting with "no authentication" is accepted.
    let mut s = TcpStream::connect(&socks5).await.unwrap();
    s.write_all(&[5, 1, 0]).await.unwrap();
    let mut reply = [0u8; 2];
    s.read_exact(&mut reply).await.unwrap();
    assert_eq!(reply, [5, 0]);
    drop(s);

    // The admin server answers, and /config_dump shows the config the node runs with.
    let admin = node.admin_addr().unwrap();
    let dump = get(admin, "/config_dump").await;
    assert!(dump.starts_with("HTTP/1.1 200"), "{dump}");
    assert!(dump.contains("\"nodeConfig\""), "{dump}");
    let shown = node.config_dump();
    assert_eq!(shown["nodeConfig"]["node"], "in-process");
    assert_eq!(shown["nodeConfig"]["socks5"], socks5.as_str());
    assert_eq!(shown["nodeConfig"]["tlsRecordLayer"], "weft");
    assert_eq!(shown["nodeConfig"]["tuning"]["configPoll"], "250ms");

    node.shutdown().await.unwrap();
    // Drained: nothing listens any more.
    assert!(TcpStream::connect(&socks5).await.is_err());
    assert!(TcpStream::connect(admin).await.is_err());
}
