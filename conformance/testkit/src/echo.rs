//! Echo workloads: a TCP server that sends every byte back (and answers the client's half-close with its own), and
//! the client's round trip.

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// Serve echo on `addr` (port 0: any); returns the bound address and the accept task.
pub async fn echo_server(addr: SocketAddr) -> std::io::Result<(SocketAddr, JoinHandle<()>)> {
    let lis = TcpListener::bind(addr).await?;
    let bound = lis.local_addr()?;
    let task = tokio::spawn(async move {
        while let Ok((s, _)) = lis.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = s.into_split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
                let _ = w.shutdown().await;
            });
        }
    });
    Ok((bound, task))
}

/// Write `payload`, half-close, read everything back; returns what came back.
pub async fn round_trip(mut s: TcpStream, payload: &[u8]) -> std::io::Result<Vec<u8>> {
    let (mut r, mut w) = s.split();
    let send = async {
        w.write_all(payload).await?;
        w.shutdown().await
    };
    let mut back = Vec::with_capacity(payload.len());
    let recv = r.read_to_end(&mut back);
    let (a, b) = tokio::join!(send, recv);
    a?;
    b?;
    Ok(back)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn bytes_come_back_and_eof_is_answered() -> std::io::Result<()> {
        let (addr, _task) = echo_server(SocketAddr::from(([127, 0, 0, 1], 0))).await?;
        let back = round_trip(TcpStream::connect(addr).await?, b"hello").await?;
        assert_eq!(back, b"hello");
        Ok(())
    }
}
