//! Test helpers: a loopback HBONE server with pluggable handlers, and client dialing.
#![allow(clippy::unwrap_used)] // a test panics to fail
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{HeaderMap, HeaderValue};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::AbortHandle;
use tokio_util::sync::CancellationToken;
use weft_hbone::{Error, H2Client, H2Config, InboundRequest, serve_connection};
#[allow(unused_imports)] // not every test binary waits
pub use weft_testkit::until as eventually;

/// Upper bound for anything a test waits on.
pub const WAIT: Duration = Duration::from_secs(20);

/// Default settings without keepalive PINGs, for tests on tokio's paused clock: there the only
/// timers should be the ones under test.
///
/// Paused-clock tests run on a current-thread runtime, so the test and every peer share one
/// thread, and loopback TCP has put a write into the peer's receive queue by the time the write
/// returns; the runtime therefore never parks with bytes in flight, and the clock only jumps
/// ahead (auto-advance) once every task waits for a timer.
pub fn no_keepalive() -> H2Config {
    H2Config {
        keepalive_interval: None,
        ..Default::default()
    }
}

/// One accepted server connection: its own shutdown token and the abort handle of its task.
pub struct ServerConn {
    pub shutdown: CancellationToken,
    pub task: AbortHandle,
    pub done: tokio::sync::watch::Receiver<Option<Result<(), String>>>,
}

/// A loopback HBONE server accepting any number of connections.
pub struct TestServer {
    pub addr: SocketAddr,
    pub shutdown: CancellationToken,
    pub accepted: Arc<AtomicUsize>,
    pub closed: Arc<AtomicUsize>,
    pub conns: Arc<Mutex<Vec<ServerConn>>>,
}

impl TestServer {
    /// Starts a server whose streams are handled by `handler`.
    pub async fn start<H, Fut>(cfg: H2Config, handler: H) -> TestServer
    where
        H: Fn(InboundRequest) -> Fut + Clone + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("local addr");
        let shutdown = CancellationToken::new();
        let accepted = Arc::new(AtomicUsize::new(0));
        let closed = Arc::new(AtomicUsize::new(0));
        let conns = Arc::new(Mutex::new(Vec::new()));
        let server = TestServer {
            addr,
            shutdown: shutdown.clone(),
            accepted: accepted.clone(),
            closed: closed.clone(),
            conns: conns.clone(),
        };
        tokio::spawn(async move {
            loop {
                let (tcp, _) = tokio::select! {
                    r = listener.accept() => match r { Ok(x) => x, Err(_) => return },
                    _ = shutdown.cancelled() => return,
                };
                let _ = tcp.set_nodelay(true);
                accepted.fetch_add(1, Ordering::SeqCst);
                let token = shutdown.child_token();
                let (tx, rx) = tokio::sync::watch::channel(None);
                let (cfg, handler, closed, t) =
                    (cfg.clone(), handler.clone(), closed.clone(), token.clone());
                let task = tokio::spawn(async move {
                    let res = serve_connection(tcp, &cfg, t, handler).await;
                    closed.fetch_add(1, Ordering::SeqCst);
                    let _ = tx.send(Some(res.map_err(|e| e.to_string())));
                });
                conns.lock().expect("lock").push(ServerConn {
                    shutdown: token,
                    task: task.abort_handle(),
                    done: rx,
                });
            }
        });
        server
    }

    /// Starts an echo server (see [`echo`]).
    pub async fn echo(cfg: H2Config) -> TestServer {
        Self::start(cfg, echo).await
    }

    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }

    pub fn closed(&self) -> usize {
        self.closed.load(Ordering::SeqCst)
    }

    /// Kills server connection `i` abruptly (TCP closed without GOAWAY).
    pub fn abort_conn(&self, i: usize) {
        self.conns.lock().expect("lock")[i].task.abort();
    }

    /// Starts a graceful shutdown (GOAWAY) of server connection `i`.
    pub fn goaway_conn(&self, i: usize) {
        self.conns.lock().expect("lock")[i].shutdown.cancel();
    }

    /// Waits for server connection `i`'s `serve_connection` to return.
    pub async fn conn_result(&self, i: usize) -> Result<(), String> {
        let mut rx = self.conns.lock().expect("lock")[i].done.clone();
        let r = tokio::time::timeout(WAIT, rx.wait_for(|r| r.is_some()))
            .await
            .expect("serve_connection did not return")
            .expect("watch");
        r.clone().expect("some")
    }
}

/// Handler: validates the CONNECT, answers 200 with `x-authority` echoing the parsed target,
/// then echoes every byte back and half-closes after the client does.
pub async fn echo(req: InboundRequest) {
    let addr = match req.connect_target() {
        Ok(a) => a,
        Err(status) => {
            let _ = req.reject(status);
            return;
        }
    };
    let mut headers = HeaderMap::new();
    if let Ok(v) = HeaderValue::from_str(&addr.to_string()) {
        headers.insert("x-authority", v);
    }
    if let Some(v) = req.headers().get("x-echo") {
        headers.insert("x-echo", v.clone());
    }
    let Ok(stream) = req.accept(headers) else {
        return;
    };
    let (mut r, mut w) = stream.into_split();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match r.read(&mut buf).await {
            Ok(0) => break,
            Ok(n) => {
                if w.write_all(&buf[..n]).await.is_err() {
                    return;
                }
            }
            Err(_) => return,
        }
    }
    let _ = w.shutdown().await;
}

/// Dials `addr` over TCP and performs the HBONE client handshake.
pub async fn dial(addr: SocketAddr, cfg: &H2Config) -> Result<H2Client, Error> {
    let tcp = TcpStream::connect(addr).await?;
    tcp.set_nodelay(true)?;
    weft_hbone::handshake(tcp, cfg).await
}

/// Half-closes `stream` and reads what comes back until the peer closes its side.
pub async fn finish(stream: &mut weft_hbone::H2Stream) -> Vec<u8> {
    stream.shutdown().await.expect("shutdown");
    let mut back = Vec::new();
    tokio::time::timeout(WAIT, stream.read_to_end(&mut back))
        .await
        .expect("timeout")
        .expect("read");
    back
}

/// Deterministic test payload: byte `i` of the stream is a function of `i` and `seed`.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| ((i as u64).wrapping_mul(2_654_435_761) >> 13) as u8 ^ seed)
        .collect()
}
