//! `hbone_connect`: the bytes an HBONE peer sends after the TLS handshake, through the real HTTP/2 server
//! (`weft_hbone::serve_connection`, with its preface and SETTINGS watch and keepalive) and a handler that makes
//! the decisions inbound HBONE makes on each stream: the method must be CONNECT, the `:authority` a literal
//! `ip:port`, and the `forwarded` header is parsed (`for=` is logged, `host=` names the targeted service).
//!
//! Input: byte 0 picks the read size (1 to 2^11 bytes per read); bit 0 of byte 1 set sends the HTTP/2 client
//! preface first (so mutations go to the frames); the rest is the peer's bytes. The clock is paused, so keepalive
//! and handshake deadlines fire as soon as the connection is idle.
//!
//! Invariants: an authority accepted is a socket address with a non-zero port that reads back the same; the
//! handler's verdict (`connect_target`) agrees with method and authority; a `forwarded: for=` address read back
//! is what the header says; a `host=` value has no `;` and no quotes around it; the server never panics and
//! always returns once the peer's bytes end.

use std::net::SocketAddr;

use http::{HeaderMap, Method, StatusCode};
use tokio_util::sync::CancellationToken;
use weft_hbone::{H2Config, InboundRequest, parse_authority};

use crate::mem::MemStream;

/// The HTTP/2 client connection preface (RFC 9113 §3.4).
pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Checks one stream the way inbound HBONE does, then answers it.
fn handle(req: InboundRequest) {
    let authority = req.authority().to_owned();
    let parsed = req.authority_addr();
    if let Ok(addr) = &parsed {
        assert_ne!(addr.port(), 0, "port 0 accepted in {authority:?}");
        assert_eq!(
            authority.parse::<SocketAddr>().ok().as_ref(),
            Some(addr),
            "accepted authority {authority:?} is not the address {addr}"
        );
        assert_eq!(
            parse_authority(&addr.to_string()).ok().as_ref(),
            Some(addr),
            "{addr} does not read back"
        );
    }
    let target = req.connect_target();
    match (&target, req.method() == Method::CONNECT, &parsed) {
        (Ok(t), true, Ok(a)) => assert_eq!(t, a),
        (Err(StatusCode::BAD_REQUEST), false, _) | (Err(StatusCode::BAD_REQUEST), true, Err(_)) => {
        }
        _ => panic!(
            "connect_target {target:?} for {} {authority:?}",
            req.method()
        ),
    }
    check_forwarded(req.headers());
    let _ = match target {
        Ok(addr) if addr.port() % 3 == 0 => req.reject(StatusCode::UNAUTHORIZED),
        Ok(addr) if addr.port() % 3 == 1 => req.accept(HeaderMap::new()).map(drop),
        Ok(_) => req.reject(StatusCode::SERVICE_UNAVAILABLE),
        Err(status) => req.reject(status),
    };
}

/// What inbound reads from `forwarded`.
pub fn check_forwarded(h: &HeaderMap) {
    let text = h.get("forwarded").and_then(|v| v.to_str().ok());
    if let Some(addr) = weft_proxy::fuzzing::forwarded_for(h) {
        let text = text.unwrap_or_default();
        assert!(
            text.contains(&addr.to_string()) || text.contains("for="),
            "for= {addr} read from {text:?}"
        );
        assert_eq!(addr.to_string().parse::<SocketAddr>().ok(), Some(addr));
    }
    if let Some(host) = weft_proxy::fuzzing::forwarded_host(h) {
        assert!(!host.contains(';'), "host= {host:?} spans elements");
        assert!(
            !host.starts_with('"') && !host.ends_with('"'),
            "host= {host:?} keeps its quotes"
        );
        assert!(text.is_some_and(|t| t.contains(host)));
    }
}

/// Feed one input.
pub fn run(data: &[u8]) {
    let [size, flags, rest @ ..] = data else {
        return;
    };
    let chunk = 1usize << (size % 12);
    let mut input = Vec::with_capacity(PREFACE.len() + rest.len());
    if flags & 1 == 1 {
        input.extend_from_slice(PREFACE);
    }
    input.extend_from_slice(rest);
    let rt = crate::paused_runtime();
    let cfg = H2Config::default();
    // Handlers run on spawned tasks, where tokio would catch a panic: pass it back to this thread.
    let (failed, failures) = std::sync::mpsc::channel::<String>();
    rt.block_on(async {
        let served = weft_hbone::serve_connection(
            MemStream::new(input, chunk),
            &cfg,
            CancellationToken::new(),
            |req| {
                let failed = failed.clone();
                async move {
                    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| handle(req)));
                    if let Err(p) = r {
                        let msg = p
                            .downcast_ref::<String>()
                            .cloned()
                            .or_else(|| p.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                            .unwrap_or_default();
                        let _ = failed.send(msg);
                    }
                }
            },
        );
        // The paused clock makes this a bound on virtual time only: every deadline of the server is shorter.
        let r = tokio::time::timeout(std::time::Duration::from_secs(3600), served).await;
        assert!(
            r.is_ok(),
            "the server did not return after the peer's bytes ended"
        );
        // Let handlers spawned last run before the runtime is dropped.
        for _ in 0..4 {
            tokio::task::yield_now().await;
        }
    });
    drop(rt);
    if let Ok(msg) = failures.try_recv() {
        panic!("stream handler: {msg}");
    }
}
