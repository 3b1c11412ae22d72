//! weft's operator-facing HTTP servers: admin (15000, localhost only: `/config_dump`, `/logging`,
//! `/quitquitquit`), metrics (15020: `/stats/prometheus`) and readiness (15021: `/healthz/ready`). They run on the
//! control runtime, never on the data path, and know nothing of the proxy: the binary supplies an [`AdminHandler`].
//!
//! Every server bounds what a client can hold ([`Limits`]): a deadline for request headers, a
//! connection cap, and a maximum connection age. Their counters ([`ServerStats`]) are appended
//! to the metrics page of the metrics server started with the same handler.

mod limits;
pub mod process;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::OwnedSemaphorePermit;
use tokio_util::sync::CancellationToken;

pub use limits::{Limits, ServerStats};

/// What the servers ask the rest of weft.
pub trait AdminHandler: Send + Sync + 'static {
    /// The full state as JSON: `workloads`, `services`, `policies`, `certificates`, `plugins`, `config`, `version`.
    fn config_dump(&self) -> serde_json::Value;
    /// `Ok` when ready; otherwise what is still pending.
    fn readiness(&self) -> Result<(), Vec<String>>;
    /// The current log filter.
    fn log_level(&self) -> String;
    /// Replace the log filter (`info`, `weft_proxy=debug,info`, ...); returns the new filter.
    fn set_log_level(&self, level: &str) -> Result<String, String>;
    /// The filter `POST /logging?reset` goes back to.
    fn default_log_level(&self) -> String {
        "info".to_owned()
    }
    /// Prometheus text exposition of every metric.
    fn metrics(&self) -> String;
    /// The metrics of shadow versions (telemetry plugins' shadows define the names their serving versions do, so
    /// they are exposed apart, at `/metrics/shadow`); `None`: not served.
    fn shadow_metrics(&self) -> Option<String> {
        None
    }
    /// Start a graceful shutdown (drain).
    fn quit(&self);
}

/// Errors starting a server.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// Bind failed.
    #[error("cannot listen on {addr} ({what}): {source}")]
    Bind {
        /// Which server.
        what: &'static str,
        /// Address.
        addr: SocketAddr,
        /// Cause.
        source: std::io::Error,
    },
    /// The admin server must stay on loopback.
    #[error("the admin server must listen on a loopback address, not {0}")]
    NotLoopback(SocketAddr),
    /// A [`Limits`] value that would refuse or cut off every connection.
    #[error("invalid limits for the {what} server: {reason}")]
    InvalidLimits {
        /// Which server.
        what: &'static str,
        /// What is wrong.
        reason: &'static str,
    },
}

/// Which server a listener is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Server {
    /// 15000.
    Admin,
    /// 15020.
    Metrics,
    /// 15021.
    Readiness,
}

impl Server {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Server::Admin => "admin",
            Server::Metrics => "metrics",
            Server::Readiness => "readiness",
        }
    }
}

/// Bind and serve one of the servers with the default [`Limits`] until `stop` is cancelled;
/// returns the bound address.
pub async fn serve(
    which: Server,
    addr: SocketAddr,
    handler: Arc<dyn AdminHandler>,
    stop: CancellationToken,
) -> Result<SocketAddr, AdminError> {
    Ok(serve_with(which, addr, handler, stop, Limits::default())
        .await?
        .addr)
}

/// A running server.
#[derive(Debug, Clone)]
pub struct Serving {
    /// The bound address.
    pub addr: SocketAddr,
    /// Its counters.
    pub stats: Arc<ServerStats>,
    /// Cancelled once the server stopped accepting after `stop` and closed its listener: the port is free.
    pub stopped: CancellationToken,
}

/// Like [`serve`], with explicit limits; also returns the server's counters.
pub async fn serve_with(
    which: Server,
    addr: SocketAddr,
    handler: Arc<dyn AdminHandler>,
    stop: CancellationToken,
    limits: Limits,
) -> Result<Serving, AdminError> {
    if which == Server::Admin && !addr.ip().is_loopback() {
        return Err(AdminError::NotLoopback(addr));
    }
    limits.check().map_err(|reason| AdminError::InvalidLimits {
        what: which.name(),
        reason,
    })?;
    let lis = TcpListener::bind(addr)
        .await
        .map_err(|source| AdminError::Bind {
            what: which.name(),
            addr,
            source,
        })?;
    let bound = lis.local_addr().unwrap_or(addr);
    let stats = Arc::new(ServerStats::default());
    limits::register(handler_key(&handler), which, &stats);
    tracing::info!(server = which.name(), addr = %bound, max_connections = limits.max_connections, "listening");
    let stopped = CancellationToken::new();
    let serving = Serving {
        addr: bound,
        stats: stats.clone(),
        stopped: stopped.clone(),
    };
    let permits = Arc::new(tokio::sync::Semaphore::new(limits.max_connections));
    tokio::spawn(async move {
        loop {
            let (stream, peer) = tokio::select! {
                a = lis.accept() => match a {
                    Ok(a) => a,
                    Err(e) => {
                        tracing::warn!(error = %e, "admin accept failed");
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                        continue;
                    }
                },
                () = stop.cancelled() => {
                    drop(lis);
                    stopped.cancel();
                    return;
                }
            };
            let Ok(permit) = permits.clone().try_acquire_owned() else {
                stats.refused(which, peer, limits.max_connections);
                drop(stream);
                continue;
            };
            tokio::spawn(serve_conn(
                which,
                stream,
                handler.clone(),
                limits.clone(),
                stats.clone(),
                permit,
            ));
        }
    });
    Ok(serving)
}

/// Identifies the weft a handler belongs to: servers started with clones of one `Arc` share it.
fn handler_key(handler: &Arc<dyn AdminHandler>) -> usize {
    Arc::as_ptr(handler).cast::<()>() as usize
}

async fn serve_conn(
    which: Server,
    stream: TcpStream,
    handler: Arc<dyn AdminHandler>,
    limits: Limits,
    stats: Arc<ServerStats>,
    _permit: OwnedSemaphorePermit,
) {
    let _active = stats.serving();
    let key = handler_key(&handler);
    let svc = hyper::service::service_fn(move |req| {
        let handler = handler.clone();
        async move { Ok::<_, Infallible>(route(which, handler.as_ref(), key, req).await) }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .serve_connection(TokioIo::new(stream), svc);
    tokio::pin!(conn);
    let res = tokio::select! {
        res = conn.as_mut() => res,
        () = tokio::time::sleep(limits.max_connection_age) => {
            conn.as_mut().graceful_shutdown();
            match tokio::time::timeout(limits.header_read_timeout, conn.as_mut()).await {
                Ok(res) => res,
                Err(_elapsed) => {
                    stats.timed_out();
                    tracing::debug!(server = which.name(), "admin connection outlived its maximum age, closed");
                    return;
                }
            }
        }
    };
    match res {
        Ok(()) => {}
        Err(e) if e.is_timeout() => {
            stats.timed_out();
            tracing::debug!(server = which.name(), error = %e, "admin connection closed: request headers not received in time");
        }
        Err(e) => tracing::debug!(server = which.name(), error = %e, "admin connection error"),
    }
}

fn text(status: StatusCode, body: impl Into<Bytes>, ctype: &'static str) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    if let Ok(v) = hyper::header::HeaderValue::from_str(ctype) {
        r.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
    }
    r
}

/// The (percent-decoded) value of `key` in the query string; `Some("")` for a bare `key`.
fn query_param(req: &Request<Incoming>, key: &str) -> Option<String> {
    req.uri().query()?.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        (percent_decode(k) == key).then(|| percent_decode(v))
    })
}

/// `application/x-www-form-urlencoded` decoding: `+` is a space, `%XX` a byte.
fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => match std::str::from_utf8(&b[i + 1..i + 3])
                .ok()
                .and_then(|h| u8::from_str_radix(h, 16).ok())
            {
                Some(v) => {
                    out.push(v);
                    i += 2;
                }
                None => out.push(b'%'),
            },
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// What `/logging` answers to a bad method or level (ztunnel's usage text, with weft's filter syntax).
const LOGGING_HELP: &str = "usage: POST /logging\t\t\t\t\t\t(To list current level)
usage: POST /logging?level=<level>\t\t\t\t(To change global levels)
usage: POST /logging?level={mod1}={level1},{mod2}={level2}\t(To change specific mods' logging level)
usage: POST /logging?reset[&level=...]\t\t\t\t(To go back to the default, then apply level)

hint: loglevel:\terror|warn|info|debug|trace|off
hint: mod_name:\tthe module name, i.e. weft_proxy
";

const LEVELS: [&str; 6] = ["off", "error", "warn", "info", "debug", "trace"];

/// ztunnel's check of a `level=` value: each comma-separated clause is a level or `<module>=<level>`.
fn validate_level(level: &str) -> Result<(), String> {
    for clause in level.split(',') {
        let lvl = clause.rsplit_once('=').map_or(clause, |(_, l)| l);
        let module_ok = clause
            .split_once('=')
            .is_none_or(|(m, _)| !m.is_empty() && !m.contains(char::is_whitespace));
        if !LEVELS.contains(&lvl.to_ascii_lowercase().as_str()) || !module_ok {
            return Err(format!("level {clause} is invalid"));
        }
    }
    Ok(())
}

/// `base` with the clauses of `change` applied, as ztunnel's `set_level` does (current, then the change): a
/// clause for a module replaces that module's clause, a bare level replaces the default; the rest stays.
fn merge_filter(base: &str, change: &str) -> String {
    let target = |c: &str| c.split_once('=').map(|(m, _)| m.to_owned());
    let mut clauses: Vec<String> = base
        .split(',')
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .map(str::to_owned)
        .collect();
    for c in change.split(',').map(str::trim).filter(|c| !c.is_empty()) {
        let t = target(c);
        clauses.retain(|old| target(old) != t);
        clauses.push(c.to_owned());
    }
    clauses.join(",")
}

/// `POST /logging`, as ztunnel's: no (or an empty) `level` lists the current filter; `level=...` changes the
/// modules it names (a bare level: the default) and lists the result; `reset` first goes back to the default.
fn logging(h: &dyn AdminHandler, level: Option<String>, reset: bool) -> (StatusCode, String) {
    let list = |f: String| (StatusCode::OK, format!("current log level is {f}\n"));
    let level = level.unwrap_or_default();
    if level.is_empty() && !reset {
        return list(h.log_level());
    }
    if !level.is_empty()
        && let Err(e) = validate_level(&level)
    {
        return (
            StatusCode::BAD_REQUEST,
            format!("Invalid level provided: {level} ({e})\n{LOGGING_HELP}"),
        );
    }
    let base = if reset {
        h.default_log_level()
    } else {
        h.log_level()
    };
    match h.set_log_level(&merge_filter(&base, &level)) {
        Ok(now) => {
            tracing::info!(filter = %now, "log level changed");
            list(now)
        }
        Err(e) => (
            StatusCode::BAD_REQUEST,
            format!("Failed to set new level: {e}\n{LOGGING_HELP}"),
        ),
    }
}

async fn route(
    which: Server,
    h: &dyn AdminHandler,
    key: usize,
    req: Request<Incoming>,
) -> Response<Full<Bytes>> {
    const PLAIN: &str = "text/plain; charset=utf-8";
    const JSON: &str = "application/json";
    let path = req.uri().path().to_owned();
    match (which, req.method(), path.as_str()) {
        (Server::Readiness, &Method::GET, "/healthz/ready") => match h.readiness() {
            Ok(()) => text(StatusCode::OK, "ready\n", PLAIN),
            Err(pending) => text(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("not ready: {}\n", pending.join(", ")),
                PLAIN,
            ),
        },
        (Server::Metrics, &Method::GET, "/stats/prometheus" | "/metrics") => {
            let mut page = h.metrics();
            limits::append_metrics(key, &mut page);
            text(
                StatusCode::OK,
                page,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )
        }
        (Server::Metrics, &Method::GET, "/stats/prometheus/shadow" | "/metrics/shadow") => {
            match h.shadow_metrics() {
                Some(page) => text(
                    StatusCode::OK,
                    page,
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                ),
                None => text(StatusCode::NOT_FOUND, "no shadow metrics here\n", PLAIN),
            }
        }
        (Server::Admin, &Method::GET, "/config_dump" | "/status") => {
            let body = serde_json::to_vec_pretty(&h.config_dump()).unwrap_or_default();
            text(StatusCode::OK, body, JSON)
        }
        (Server::Admin, &Method::GET, "/logging") => {
            text(StatusCode::OK, format!("{}\n", h.log_level()), PLAIN)
        }
        (Server::Admin, &Method::POST, "/logging") => {
            let (status, body) = logging(
                h,
                query_param(&req, "level"),
                query_param(&req, "reset").is_some(),
            );
            text(status, body, PLAIN)
        }
        (Server::Admin, &Method::POST, "/quitquitquit") => {
            h.quit();
            text(StatusCode::OK, "draining\n", PLAIN)
        }
        (Server::Admin, &Method::GET, "/") => text(
            StatusCode::OK,
            "GET /config_dump\nGET /logging\nPOST /logging[?level=<filter>][&reset]\nPOST /quitquitquit\n",
            PLAIN,
        ),
        _ => text(StatusCode::NOT_FOUND, "not found\n", PLAIN),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Nothing;

    impl AdminHandler for Nothing {
        fn config_dump(&self) -> serde_json::Value {
            serde_json::json!({})
        }
        fn readiness(&self) -> Result<(), Vec<String>> {
            Err(vec!["config not loaded".into()])
        }
        fn log_level(&self) -> String {
            "info".into()
        }
        fn set_log_level(&self, level: &str) -> Result<String, String> {
            Ok(level.into())
        }
        fn metrics(&self) -> String {
            String::new()
        }
        fn quit(&self) {}
    }

    /// A handler whose filter is a string.
    struct Filter(std::sync::Mutex<String>);

    impl AdminHandler for Filter {
        fn config_dump(&self) -> serde_json::Value {
            serde_json::json!({})
        }
        fn readiness(&self) -> Result<(), Vec<String>> {
            Ok(())
        }
        fn log_level(&self) -> String {
            self.0.lock().unwrap().clone()
        }
        fn set_log_level(&self, level: &str) -> Result<String, String> {
            *self.0.lock().unwrap() = level.to_owned();
            Ok(level.to_owned())
        }
        fn metrics(&self) -> String {
            String::new()
        }
        fn quit(&self) {}
    }

    #[test]
    fn logging_lists_changes_and_resets_as_ztunnel() {
        let h = Filter(std::sync::Mutex::new("weft_proxy=debug,info".to_owned()));
        // No level, or `level=` (what `istioctl ztunnel-config log` sends with no --level): a listing, no change.
        for level in [None, Some(String::new())] {
            let (st, body) = logging(&h, level, false);
            assert_eq!(st, StatusCode::OK);
            assert_eq!(body, "current log level is weft_proxy=debug,info\n");
        }
        // A bare level replaces the default, a module's level that module's clause; the rest stays.
        let (st, body) = logging(&h, Some("warn".into()), false);
        assert_eq!(
            (st, body.as_str()),
            (
                StatusCode::OK,
                "current log level is weft_proxy=debug,warn\n"
            )
        );
        let (_, body) = logging(&h, Some("weft_proxy=trace,weft_dns=error".into()), false);
        assert_eq!(
            body,
            "current log level is warn,weft_proxy=trace,weft_dns=error\n"
        );
        // Reset goes back to the default, then applies the level.
        let (_, body) = logging(&h, Some("debug".into()), true);
        assert_eq!(body, "current log level is debug\n");
        let (_, body) = logging(&h, None, true);
        assert_eq!(body, "current log level is info\n");
        // A bad level: 400 with the reason; the filter is unchanged.
        for bad in ["verbose", "weft_proxy=loud", "=debug", "access:debug"] {
            let (st, body) = logging(&h, Some(bad.into()), false);
            assert_eq!(st, StatusCode::BAD_REQUEST, "{bad}: {body}");
            assert!(
                body.starts_with(&format!("Invalid level provided: {bad}")),
                "{body}"
            );
        }
        assert_eq!(h.log_level(), "info");
    }

    #[test]
    fn query_values_are_form_decoded() {
        assert_eq!(
            percent_decode("weft_proxy%3Ddebug%2Cinfo"),
            "weft_proxy=debug,info"
        );
        assert_eq!(percent_decode("a+b%zz%4"), "a b%zz%4");
    }

    #[tokio::test]
    async fn admin_refuses_a_non_loopback_address() {
        let r = serve(
            Server::Admin,
            "0.0.0.0:0".parse().unwrap(),
            Arc::new(Nothing),
            CancellationToken::new(),
        )
        .await;
        assert!(matches!(r, Err(AdminError::NotLoopback(_))), "{r:?}");
        // Metrics and readiness may bind anywhere.
        let stop = CancellationToken::new();
        let a = serve(
            Server::Readiness,
            "0.0.0.0:0".parse().unwrap(),
            Arc::new(Nothing),
            stop.clone(),
        )
        .await
        .unwrap();
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", a.port()))
            .await
            .unwrap();
        tokio::io::AsyncWriteExt::write_all(
            &mut s,
            b"GET /healthz/ready HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        )
        .await
        .unwrap();
        let mut out = String::new();
        tokio::io::AsyncReadExt::read_to_string(&mut s, &mut out)
            .await
            .unwrap();
        assert!(
            out.starts_with("HTTP/1.1 500") && out.contains("not ready: config not loaded"),
            "{out}"
        );
        stop.cancel();
    }
}
