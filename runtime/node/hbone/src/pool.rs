//! Connection pool: reuses HBONE connections per key, creating one at a time per key.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use http::HeaderMap;
use tokio_util::sync::CancellationToken;

use crate::Error;
use crate::client::{ConnectRequest, EarlyData, H2Client};
use crate::counter::StreamDropGuard;
use crate::error::SharedError;
use crate::stream::H2Stream;

/// How often a CONNECT is retried on another connection when a pooled connection turns out to
/// be going away or dead.
const MAX_STALE_RETRIES: usize = 3;

/// Pool limits, ztunnel-compatible by default.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolConfig {
    /// Streams allowed at once on one connection (also capped by the peer's
    /// `SETTINGS_MAX_CONCURRENT_STREAMS`). Default 100. Values below 1 count as 1.
    pub max_streams_per_conn: usize,
    /// A connection with no open stream for this long is released. Default 5 minutes.
    pub idle_timeout: Duration,
}

impl Default for PoolConfig {
    fn default() -> Self {
        Self {
            max_streams_per_conn: 100,
            idle_timeout: Duration::from_secs(5 * 60),
        }
    }
}

/// A pool of [`H2Client`] connections, keyed by `K` (for example source identity, destination
/// identity and address). Cheap to clone: clones share the pool.
///
/// [`connect`](Self::connect) opens a stream on a pooled connection with room; only when there
/// is none does it call the caller's connect function. At most one connection is being created
/// per key at a time: concurrent callers for that key wait for it and then share it, while
/// requests that find room on an existing connection never wait. Connections that are closed,
/// received GOAWAY, or have been idle for [`PoolConfig::idle_timeout`] are dropped (a
/// background task reaps idle ones). Dropping a connection from the pool lets it close once
/// its remaining streams end.
pub struct Pool<K> {
    inner: Arc<PoolInner<K>>,
}

impl<K> Clone for Pool<K> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

impl<K> std::fmt::Debug for Pool<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("config", &self.inner.cfg)
            .field("created_total", &self.created_total())
            .finish_non_exhaustive()
    }
}

struct PoolInner<K> {
    cfg: PoolConfig,
    keys: Mutex<HashMap<K, KeyState>>,
    created_total: AtomicU64,
    reaper_stop: CancellationToken,
}

impl<K> Drop for PoolInner<K> {
    fn drop(&mut self) {
        self.reaper_stop.cancel();
    }
}

/// Per-key state; all of it is guarded by the pool's (synchronous, never held across an await)
/// map lock, except `connect_lock`, which serialises connection creation for the key.
#[derive(Default)]
struct KeyState {
    conns: Vec<H2Client>,
    connect_lock: Arc<tokio::sync::Mutex<()>>,
    /// Connection attempts finished for this key.
    completed: u64,
    /// The last failed attempt: its `completed` number and cause.
    last_failure: Option<(u64, SharedError)>,
}

impl KeyState {
    /// Reserves a stream on the first usable connection with room, pruning dead ones.
    fn checkout(&mut self, max_streams: usize) -> Option<(H2Client, StreamDropGuard)> {
        self.conns.retain(usable);
        self.conns.iter().find_map(|c| {
            let limit = max_streams.min(c.peer_max_concurrent_streams());
            c.stream_counter().try_guard(limit).map(|g| (c.clone(), g))
        })
    }
}

fn usable(c: &H2Client) -> bool {
    let ok = c.is_ready();
    if !ok {
        tracing::debug!(conn = c.id(), "hbone pool dropping closed connection");
    }
    ok
}

impl<K: Hash + Eq + Clone + Send + Sync + 'static> Pool<K> {
    /// Creates a pool. Inside a tokio runtime this also starts the idle reaper, which stops when
    /// the last clone of the pool is dropped; outside one, call [`reap`](Self::reap) yourself.
    pub fn new(cfg: PoolConfig) -> Self {
        let cfg = PoolConfig {
            max_streams_per_conn: cfg.max_streams_per_conn.max(1),
            ..cfg
        };
        let inner = Arc::new(PoolInner {
            cfg,
            keys: Mutex::new(HashMap::new()),
            created_total: AtomicU64::new(0),
            reaper_stop: CancellationToken::new(),
        });
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(reap_loop(Arc::downgrade(&inner), inner.reaper_stop.clone()));
        }
        Self { inner }
    }

    /// Opens a tunnel for `req` on a connection of `key`'s pool, returning the stream and the
    /// response headers.
    ///
    /// `connect_fn` is called (at most once) only when no pooled connection of `key` has room;
    /// it must dial, do the TLS handshake and [`crate::handshake`], and should bound its own
    /// duration: callers for the same key wait for it. If it fails, this caller and those that
    /// were waiting for that attempt get [`Error::ConnectFailed`] with its cause. A stream that
    /// fails because its pooled connection was going away is retried on another connection.
    pub async fn connect<F, Fut, E>(
        &self,
        key: K,
        req: ConnectRequest,
        connect_fn: F,
    ) -> Result<(H2Stream, HeaderMap), Error>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<H2Client, E>>,
        E: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        self.connect_inner(key, req, None, connect_fn).await
    }

    /// Like [`connect`](Self::connect), sending what `early` offers while the response is awaited
    /// (see [`EarlyData`]). Once any early data went out, the stream is retried on another
    /// connection only where the peer cannot have delivered it
    /// ([`Error::is_retryable_on_new_connection`]), and the retry sends every chunk taken so far
    /// again, in order, before it takes more: the source gives each chunk once, so the tunnel
    /// would otherwise lose them.
    pub async fn connect_with_early<F, Fut, E>(
        &self,
        key: K,
        req: ConnectRequest,
        early: &mut dyn EarlyData,
        connect_fn: F,
    ) -> Result<(H2Stream, HeaderMap), Error>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<H2Client, E>>,
        E: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        self.connect_inner(key, req, Some(early), connect_fn).await
    }

    async fn connect_inner<F, Fut, E>(
        &self,
        key: K,
        req: ConnectRequest,
        mut early: Option<&mut dyn EarlyData>,
        connect_fn: F,
    ) -> Result<(H2Stream, HeaderMap), Error>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<H2Client, E>>,
        E: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        // The chunks `early` offered so far: a retry sends them again before asking for more.
        let mut taken = Vec::new();
        let mut connect_fn = Some(connect_fn);
        let mut stale_retries = 0;
        loop {
            let fast = self
                .inner
                .lock()
                .get_mut(&key)
                .and_then(|s| s.checkout(self.max()));
            let (client, guard, fresh) = match fast {
                Some((c, g)) => (c, g, false),
                None => self.create(&key, &mut connect_fn).await?,
            };
            let attempt =
                client.connect_with_guard(req.clone(), guard, early.as_deref_mut(), &mut taken);
            match attempt.await {
                Ok(ok) => return Ok(ok),
                Err(e) => {
                    let retry = !fresh
                        && stale_retries < MAX_STALE_RETRIES
                        && e.is_retryable_on_new_connection(
                            !req.early_data.is_empty() || !taken.is_empty(),
                        );
                    if retry || !client.is_ready() {
                        self.evict(&key, &client);
                    }
                    if !retry {
                        return Err(e);
                    }
                    tracing::debug!(conn = client.id(), error = %e, "hbone pooled connection stale, retrying");
                    stale_retries += 1;
                }
            }
        }
    }

    /// Slow path: under the key's creation lock, reuse a connection made meanwhile or make one.
    /// Returns the client, a reserved stream slot, and whether the connection is new.
    async fn create<F, Fut, E>(
        &self,
        key: &K,
        connect_fn: &mut Option<F>,
    ) -> Result<(H2Client, StreamDropGuard, bool), Error>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<H2Client, E>>,
        E: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let (lock, seen) = {
            let mut keys = self.inner.lock();
            let state = keys.entry(key.clone()).or_default();
            (state.connect_lock.clone(), state.completed)
        };
        let _creating = lock.lock().await;
        {
            let mut keys = self.inner.lock();
            let state = keys.entry(key.clone()).or_default();
            if let Some((c, g)) = state.checkout(self.max()) {
                return Ok((c, g, false));
            }
            match &state.last_failure {
                // The attempt we queued behind failed: share its fate instead of hammering.
                Some((at, err)) if *at > seen => return Err(Error::ConnectFailed(err.clone())),
                _ => {}
            }
        }
        let Some(f) = connect_fn.take() else {
            return Err(Error::ConnectionClosed);
        };
        let result = f().await;
        let mut keys = self.inner.lock();
        let state = keys.entry(key.clone()).or_default();
        state.completed += 1;
        match result {
            Ok(client) => {
                let n = self.inner.created_total.fetch_add(1, Ordering::Relaxed) + 1;
                tracing::debug!(
                    conn = client.id(),
                    created_total = n,
                    "hbone pool added connection"
                );
                let guard = client.stream_counter().guard();
                state.conns.push(client.clone());
                state.last_failure = None;
                Ok((client, guard, true))
            }
            Err(e) => {
                let err: SharedError = Arc::from(e.into());
                state.last_failure = Some((state.completed, err.clone()));
                Err(Error::ConnectFailed(err))
            }
        }
    }

    fn evict(&self, key: &K, client: &H2Client) {
        if let Some(state) = self.inner.lock().get_mut(key) {
            state.conns.retain(|c| !c.same_connection(client));
        }
    }

    fn max(&self) -> usize {
        self.inner.cfg.max_streams_per_conn
    }

    /// Drops every pooled connection of `key` (their open streams continue).
    pub fn remove_key(&self, key: &K) {
        if let Some(state) = self.inner.lock().get_mut(key) {
            state.conns.clear();
        }
    }

    /// Releases connections that are closed or idle for longer than the idle timeout. The
    /// background reaper calls this periodically.
    pub fn reap(&self) {
        self.inner.reap();
    }

    /// Connections currently pooled, over all keys.
    pub fn connections(&self) -> usize {
        self.inner.lock().values().map(|s| s.conns.len()).sum()
    }

    /// Connections currently pooled for `key`.
    pub fn connections_for(&self, key: &K) -> usize {
        self.inner.lock().get(key).map_or(0, |s| s.conns.len())
    }

    /// Open streams on pooled connections, over all keys.
    pub fn active_streams(&self) -> usize {
        let keys = self.inner.lock();
        keys.values()
            .flat_map(|s| s.conns.iter())
            .map(H2Client::active_streams)
            .sum()
    }

    /// A snapshot of the pooled connections of every key, for the admin page.
    pub fn snapshot(&self) -> Vec<(K, Vec<H2Client>)> {
        let keys = self.inner.lock();
        keys.iter()
            .filter(|(_, s)| !s.conns.is_empty())
            .map(|(k, s)| (k.clone(), s.conns.clone()))
            .collect()
    }
}

impl<K> Pool<K> {
    /// Connections ever created by this pool.
    pub fn created_total(&self) -> u64 {
        self.inner.created_total.load(Ordering::Relaxed)
    }

    /// The pool's configuration.
    pub fn config(&self) -> &PoolConfig {
        &self.inner.cfg
    }
}

impl<K: Hash + Eq> PoolInner<K> {
    fn lock(&self) -> MutexGuard<'_, HashMap<K, KeyState>> {
        // Critical sections never panic midway, so a poisoned map is still consistent.
        self.keys.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn reap(&self) {
        let idle = self.cfg.idle_timeout;
        self.lock().retain(|_, state| {
            state.conns.retain(|c| {
                let idle_for = c.stream_counter().idle_for();
                let keep = usable(c) && idle_for.is_none_or(|d| d < idle);
                if !keep {
                    tracing::debug!(conn = c.id(), ?idle_for, "hbone pool released connection");
                }
                keep
            });
            // Keep the key while a caller holds or waits for its creation lock.
            !state.conns.is_empty() || Arc::strong_count(&state.connect_lock) > 1
        });
    }
}

async fn reap_loop<K: Hash + Eq>(pool: Weak<PoolInner<K>>, stop: CancellationToken) {
    let period = match pool.upgrade() {
        Some(p) => {
            (p.cfg.idle_timeout / 4).clamp(Duration::from_millis(50), Duration::from_secs(30))
        }
        None => return,
    };
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        match pool.upgrade() {
            Some(p) => p.reap(),
            None => return,
        }
    }
}
