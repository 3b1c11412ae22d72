//! The handover's traffic: steady short connections, long-lived ones pinging through the handover, and what
//! each saw.

use super::*;

/// One failed short connection: when, from which local address (when it got that far), the error.
#[derive(Debug, Clone)]
pub(crate) struct Failure {
    pub(crate) at: Instant,
    pub(crate) local: Option<SocketAddr>,
    pub(crate) what: String,
}

/// What the steady clients saw.
#[derive(Debug, Default)]
pub(crate) struct Tally {
    pub(crate) ok: u64,
    pub(crate) failed: Vec<Failure>,
    /// The slowest connection that worked: how long, which, when it started.
    pub(crate) slowest: Option<(Duration, String, Instant)>,
}

/// A long-lived connection's record: pings answered, and when and why it broke.
#[derive(Debug, Default)]
pub(crate) struct LongLived {
    pub(crate) what: String,
    pub(crate) pings: AtomicU64,
    pub(crate) broke: Mutex<Option<(Instant, String)>>,
}

/// Steady short connections from `pod` to each of `servers` in turn, until `stop`.
pub(crate) fn steady_client(
    pod: &PodNs,
    servers: Vec<SocketAddr>,
    tally: Arc<Mutex<Tally>>,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<Result<(), String>> {
    let name = pod.name.clone();
    pod.ns.run(move || async move {
        let mut i = 0usize;
        while !stop.load(Ordering::Relaxed) {
            let dst = servers[i % servers.len()];
            i += 1;
            let started = Instant::now();
            let local = Mutex::new(None);
            let r = async {
                let mut s = tokio::net::TcpStream::connect(dst).await?;
                *local.lock().unwrap() = s.local_addr().ok();
                s.write_all(b"0123456789abcdef0123456789abcdef").await?;
                let mut back = [0u8; 32];
                s.read_exact(&mut back).await?;
                std::io::Result::Ok(())
            };
            let r = tokio::time::timeout(HUNG, r)
                .await
                .unwrap_or_else(|_| Err(std::io::Error::other(format!("no answer in {HUNG:?}"))));
            let mut t = tally.lock().unwrap();
            match r {
                Ok(()) => {
                    t.ok += 1;
                    let took = started.elapsed();
                    if t.slowest.as_ref().is_none_or(|(d, _, _)| took > *d) {
                        t.slowest = Some((took, format!("{name} -> {dst}"), started));
                    }
                }
                Err(e) => t.failed.push(Failure {
                    at: Instant::now(),
                    local: *local.lock().unwrap(),
                    what: format!("{name} -> {dst}: {e}"),
                }),
            }
        }
    })
}

/// A long-lived connection from `pod` to `dst`, opened now, carrying a ping every [`PING_EVERY`] until it breaks
/// or `stop`.
pub(crate) async fn long_lived(
    pod: &PodNs,
    dst: SocketAddr,
    stop: Arc<AtomicBool>,
) -> (Arc<LongLived>, std::thread::JoinHandle<Result<(), String>>) {
    let rec = Arc::new(LongLived {
        what: format!("{} -> {dst}", pod.name),
        ..Default::default()
    });
    let (opened_tx, opened_rx) = tokio::sync::oneshot::channel();
    let r = rec.clone();
    let h = pod.ns.run(move || async move {
        let mut s = tokio::net::TcpStream::connect(dst).await.unwrap();
        let mut tick = tokio::time::interval(PING_EVERY);
        let mut first = Some(opened_tx);
        while !stop.load(Ordering::Relaxed) {
            tick.tick().await;
            let res = async {
                s.write_all(b"ping").await?;
                let mut b = [0u8; 4];
                s.read_exact(&mut b).await?;
                if &b != b"ping" {
                    return Err(std::io::Error::other("wrong echo"));
                }
                std::io::Result::Ok(())
            }
            .await;
            match res {
                Ok(()) => {
                    r.pings.fetch_add(1, Ordering::Relaxed);
                    if let Some(tx) = first.take() {
                        let _ = tx.send(());
                    }
                }
                Err(e) => {
                    *r.broke.lock().unwrap() = Some((Instant::now(), e.to_string()));
                    return;
                }
            }
        }
    });
    opened_rx
        .await
        .expect("the long-lived connection's first ping");
    (rec, h)
}

pub(crate) fn pings(longs: &[Arc<LongLived>]) -> Vec<u64> {
    longs
        .iter()
        .map(|l| l.pings.load(Ordering::Relaxed))
        .collect()
}
