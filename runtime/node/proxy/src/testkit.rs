//! Test helpers for the data path's unit tests: an in-memory CA, a state from mesh-file text, a recording
//! `ConnectionHooks`, and an `Inner` wired from them (real sockets and TLS, no listeners unless a test starts
//! them).
#![allow(clippy::unwrap_used)] // test code: a panic fails the test

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio_util::sync::CancellationToken;
use weft_hooks::{CloseRecord, ConnectionHooks, ConnectionRecord, Verdict};
use weft_identity::{LocalCa, ManagerConfig, SecretManager};
use weft_state::StateStore;

use crate::{ConnTracker, Inner, ProxyConfig, ProxyMetrics};

/// A secret manager signing with a fresh in-memory development root for `cluster.local`.
pub(crate) fn identity() -> Arc<SecretManager> {
    let (cert, key) =
        weft_identity::ca::generate_root("cluster.local", std::time::Duration::from_secs(3600))
            .unwrap();
    let ca = LocalCa::from_pem(&cert, &key, vec![]).unwrap();
    SecretManager::new(Arc::new(ca), ManagerConfig::default())
}

/// A state store holding the mesh file `yaml`.
pub(crate) fn state(yaml: &str) -> Arc<StateStore> {
    let store = Arc::new(StateStore::new());
    let cfg = weft_state::local::parse(yaml, std::path::Path::new(".")).unwrap();
    store.replace(cfg);
    store
}

/// Which connections a [`Recorder`] denies.
type DenyWhen = Box<dyn Fn(&ConnectionRecord) -> bool + Send + Sync>;

/// Hooks that allow everything unless told to deny, and record what they are told.
#[derive(Default)]
pub(crate) struct Recorder {
    deny: Mutex<Option<DenyWhen>>,
    closes: Mutex<Vec<(ConnectionRecord, CloseRecord)>>,
    changes: Mutex<Option<tokio::sync::watch::Sender<u64>>>,
}

impl Recorder {
    /// Deny connections for which `f` is true (`by` = "test").
    pub(crate) fn deny_when(&self, f: impl Fn(&ConnectionRecord) -> bool + Send + Sync + 'static) {
        *self.deny.lock().unwrap() = Some(Box::new(f));
    }

    /// Every close reported so far.
    pub(crate) fn closes(&self) -> Vec<(ConnectionRecord, CloseRecord)> {
        self.closes.lock().unwrap().clone()
    }
}

impl ConnectionHooks for Recorder {
    fn authorize(&self, conn: &ConnectionRecord) -> Verdict {
        match &*self.deny.lock().unwrap() {
            Some(f) if f(conn) => Verdict::Deny {
                by: "test".into(),
                reason: "denied by the test".into(),
            },
            _ => Verdict::Allow,
        }
    }

    fn on_open(&self, _conn: &Arc<ConnectionRecord>) {}

    fn on_close(&self, conn: &Arc<ConnectionRecord>, close: &CloseRecord) {
        self.closes
            .lock()
            .unwrap()
            .push(((**conn).clone(), close.clone()));
    }

    fn policy_changes(&self) -> tokio::sync::watch::Receiver<u64> {
        let mut tx = self.changes.lock().unwrap();
        tx.get_or_insert_with(|| tokio::sync::watch::channel(0).0)
            .subscribe()
    }
}

/// A data path (no listeners) over `state`, signing with `identity`, with recording hooks.
pub(crate) fn inner(
    cfg: ProxyConfig,
    state: Arc<StateStore>,
    identity: Arc<SecretManager>,
    hooks: Arc<Recorder>,
) -> Arc<Inner> {
    Arc::new(Inner {
        pools: vec![weft_hbone::Pool::new(cfg.pool.clone())],
        cfg,
        state,
        identity,
        hooks,
        tracker: Arc::new(ConnTracker::default()),
        metrics: Arc::new(ProxyMetrics::default()),
        drain: CancellationToken::new(),
        sockets: None,
        transparent: std::sync::atomic::AtomicBool::new(false),
    })
}

/// A config for node `node` with no listener (tests start what they need) and HBONE peers dialled on `hbone_port`.
pub(crate) fn config(node: &str, hbone_port: u16) -> ProxyConfig {
    let mut c = ProxyConfig::new(node);
    c.outbound_addr = None;
    c.socks5_addr = None;
    c.inbound_plaintext_addr = None;
    c.inbound = crate::InboundBind::Disabled;
    c.hbone_port = hbone_port;
    c.bind_source_ip = true;
    c
}

/// A TCP echo server on `addr`; returns its bound address.
pub(crate) async fn echo(addr: SocketAddr) -> SocketAddr {
    let lis = tokio::net::TcpListener::bind(addr).await.unwrap();
    let bound = lis.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = lis.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    bound
}

/// Two connected loopback sockets: (the peer's end, ours).
pub(crate) async fn tcp_pair() -> (tokio::net::TcpStream, tokio::net::TcpStream) {
    let lis = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let peer = tokio::net::TcpStream::connect(lis.local_addr().unwrap())
        .await
        .unwrap();
    let (ours, _) = lis.accept().await.unwrap();
    (peer, ours)
}

/// An inbound connection record with id `id` (HBONE or plaintext), between two fixed loopback addresses.
pub(crate) fn record(id: u64, hbone: bool) -> Arc<ConnectionRecord> {
    Arc::new(ConnectionRecord {
        id,
        direction: weft_hooks::Direction::Inbound,
        src: SocketAddr::from(([127, 0, 0, 1], 40_000)),
        dst: SocketAddr::from(([127, 0, 0, 2], 8080)),
        peer_identity: None,
        src_workload: None,
        dst_workload: None,
        dst_service: None,
        hbone,
    })
}
