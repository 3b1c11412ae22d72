//! A TCP front for the replicas, as a Kubernetes Service is: each connection goes to the first replica of the
//! list that accepts it, so when a replica dies its nodes' reconnections land on the next.

use std::net::SocketAddr;

use tokio::net::{TcpListener, TcpStream};

/// Listen on a free port of 127.0.0.1; returns the address and the task.
pub async fn front(upstreams: Vec<SocketAddr>) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let task = tokio::spawn(async move {
        loop {
            let Ok((mut down, _)) = l.accept().await else {
                continue;
            };
            let ups = upstreams.clone();
            tokio::spawn(async move {
                for u in ups {
                    if let Ok(mut up) = TcpStream::connect(u).await {
                        let _ = tokio::io::copy_bidirectional(&mut down, &mut up).await;
                        return;
                    }
                }
            });
        }
    });
    (addr, task)
}
