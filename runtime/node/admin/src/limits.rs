//! Per-server limits (header-read deadline, connection cap, connection age) and the counters
//! that show them at work, exported on the metrics page.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use tokio::time::Instant;

use crate::Server;

/// How long a refusal WARN silences the next ones of the same server.
const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// Limits of one server. 15020 and 15021 listen on every address, so any host that reaches
/// the node can open connections to them; these keep such a peer from holding resources.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// A client must send a request's headers within this, counted from when the server starts
    /// waiting for them: right after accepting, and after each response on a keep-alive
    /// connection (so an idle keep-alive connection is closed after it too). hyper's
    /// `header_read_timeout` (hyper's default is 30 s, but only with a timer, which these servers
    /// did not set). Default 10 s.
    pub header_read_timeout: Duration,
    /// Connections served at once. A connection beyond it is closed as soon as it is accepted,
    /// counted in `weft_admin_connections_refused_total` and logged (WARN, at most once per
    /// 10 s per server). Default 64.
    pub max_connections: usize,
    /// A connection older than this stops being kept alive: the request in progress is
    /// finished and the connection closed; if that takes longer than
    /// [`header_read_timeout`](Self::header_read_timeout) (a client that does not read its
    /// response), it is closed regardless. Default 60 s.
    pub max_connection_age: Duration,
}

impl Limits {
    /// Why these limits would refuse or cut off every connection, if they would.
    pub(crate) fn check(&self) -> Result<(), &'static str> {
        if self.max_connections == 0 {
            return Err("max_connections must be at least 1");
        }
        if self.max_connections > tokio::sync::Semaphore::MAX_PERMITS {
            return Err("max_connections is too large");
        }
        if self.header_read_timeout.is_zero() {
            return Err("header_read_timeout must not be zero");
        }
        if self.max_connection_age.is_zero() {
            return Err("max_connection_age must not be zero");
        }
        Ok(())
    }
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            header_read_timeout: Duration::from_secs(10),
            max_connections: 64,
            max_connection_age: Duration::from_secs(60),
        }
    }
}

/// Counters of one server, live while it runs.
#[derive(Debug, Default)]
pub struct ServerStats {
    active: AtomicUsize,
    refused: AtomicU64,
    timed_out: AtomicU64,
    /// When a refusal was last logged, and the refusal count then.
    last_refusal_log: Mutex<Option<(Instant, u64)>>,
}

impl ServerStats {
    /// Connections being served now.
    pub fn active(&self) -> usize {
        self.active.load(Ordering::Acquire)
    }

    /// Connections closed at once because [`Limits::max_connections`] were being served.
    pub fn refused_total(&self) -> u64 {
        self.refused.load(Ordering::Acquire)
    }

    /// Connections closed because a request's headers did not arrive within
    /// [`Limits::header_read_timeout`] or the connection outlived
    /// [`Limits::max_connection_age`] and did not finish in time.
    pub fn timed_out_total(&self) -> u64 {
        self.timed_out.load(Ordering::Acquire)
    }

    pub(crate) fn timed_out(&self) {
        self.timed_out.fetch_add(1, Ordering::AcqRel);
    }

    /// Counts one connection as served until the guard is dropped.
    pub(crate) fn serving(self: &Arc<Self>) -> ActiveGuard {
        self.active.fetch_add(1, Ordering::AcqRel);
        ActiveGuard(self.clone())
    }

    /// Counts a refused connection and logs it, rate-limited.
    pub(crate) fn refused(&self, which: Server, peer: std::net::SocketAddr, cap: usize) {
        let total = self.refused.fetch_add(1, Ordering::AcqRel) + 1;
        let now = Instant::now();
        let mut last = self
            .last_refusal_log
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let since_last_log = match *last {
            Some((at, _)) if now.duration_since(at) < REFUSAL_LOG_INTERVAL => {
                tracing::debug!(server = which.name(), %peer, "connection refused (cap)");
                return;
            }
            Some((_, count)) => total - count,
            None => total,
        };
        *last = Some((now, total));
        tracing::warn!(
            server = which.name(),
            %peer,
            max_connections = cap,
            refused_since_last_log = since_last_log,
            refused_total = total,
            "connection cap reached, closing new connections"
        );
    }
}

/// Keeps one connection counted in [`ServerStats::active`].
pub(crate) struct ActiveGuard(Arc<ServerStats>);

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The servers started with one handler (one weft), so that the metrics server can export the
/// counters of its siblings without the binary wiring them. Keyed by the handler's address;
/// entries go when their server does.
type Entry = (usize, Server, Weak<ServerStats>);

fn registry() -> MutexGuard<'static, Vec<Entry>> {
    static REGISTRY: Mutex<Vec<Entry>> = Mutex::new(Vec::new());
    let mut r = REGISTRY.lock().unwrap_or_else(|p| p.into_inner());
    r.retain(|(_, _, s)| s.strong_count() > 0);
    r
}

pub(crate) fn register(handler: usize, which: Server, stats: &Arc<ServerStats>) {
    registry().push((handler, which, Arc::downgrade(stats)));
}

/// Prometheus text for the servers registered with `handler`, inserted before the `# EOF` line
/// of `page` if it has one.
pub(crate) fn append_metrics(handler: usize, page: &mut String) {
    let servers: Vec<(Server, Arc<ServerStats>)> = registry()
        .iter()
        .filter(|(h, _, _)| *h == handler)
        .filter_map(|(_, w, s)| Some((*w, s.upgrade()?)))
        .collect();
    let mut out = String::new();
    type Get = fn(&ServerStats) -> u64;
    let families: [(&str, &str, &str, Get); 3] = [
        (
            "weft_admin_connections_refused",
            "counter",
            "Connections to the admin, metrics or readiness server closed at once because its connection cap was reached.",
            ServerStats::refused_total,
        ),
        (
            "weft_admin_connections_timed_out",
            "counter",
            "Connections to the admin, metrics or readiness server closed because request headers were late or the connection outlived its maximum age.",
            ServerStats::timed_out_total,
        ),
        (
            "weft_admin_connections_active",
            "gauge",
            "Connections being served by the admin, metrics or readiness server.",
            |s| s.active() as u64,
        ),
    ];
    for (name, kind, help, get) in families {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} {kind}");
        let sample = if kind == "counter" {
            format!("{name}_total")
        } else {
            name.to_owned()
        };
        for which in [Server::Admin, Server::Metrics, Server::Readiness] {
            let v: u64 = servers
                .iter()
                .filter(|(w, _)| *w == which)
                .map(|(_, s)| get(s))
                .sum();
            if servers.iter().any(|(w, _)| *w == which) {
                let _ = writeln!(out, "{sample}{{server=\"{}\"}} {v}", which.name());
            }
        }
    }
    match page.rfind("# EOF") {
        Some(at) if page[at..].trim_end() == "# EOF" => page.insert_str(at, &out),
        _ => page.push_str(&out),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Collects formatted log lines.
    #[derive(Clone, Default)]
    struct Lines(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Lines {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Lines {
        fn warnings(&self) -> Vec<String> {
            String::from_utf8(self.0.lock().unwrap().clone())
                .unwrap()
                .lines()
                .filter(|l| l.contains("WARN"))
                .map(str::to_owned)
                .collect()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn refusals_are_counted_every_time_and_logged_at_most_every_10s() {
        let lines = Lines::default();
        let writer = lines.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::WARN)
            .finish();
        let _guard = tracing::subscriber::set_default(subscriber);
        let stats = ServerStats::default();
        let peer = "10.0.0.9:4000".parse().unwrap();
        for _ in 0..5 {
            stats.refused(Server::Readiness, peer, 64);
        }
        assert_eq!(stats.refused_total(), 5);
        let warned = lines.warnings();
        assert_eq!(warned.len(), 1, "{warned:?}");
        assert!(
            warned[0].contains("connection cap reached") && warned[0].contains("refused_total=1"),
            "{warned:?}"
        );
        tokio::time::advance(REFUSAL_LOG_INTERVAL - Duration::from_millis(1)).await;
        stats.refused(Server::Readiness, peer, 64);
        assert_eq!(lines.warnings().len(), 1);
        tokio::time::advance(Duration::from_millis(1)).await;
        stats.refused(Server::Readiness, peer, 64);
        let warned = lines.warnings();
        assert_eq!(warned.len(), 2, "{warned:?}");
        assert!(
            warned[1].contains("refused_since_last_log=6") && warned[1].contains("refused_total=7"),
            "{warned:?}"
        );
        assert_eq!(stats.refused_total(), 7);
    }
}
