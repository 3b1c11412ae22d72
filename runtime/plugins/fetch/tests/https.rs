//! https fetches from a real TLS server in the test (hyper + rustls on a loopback port): verified by sha256,
//! redirects followed, 5xx retried with backoff, size bounded, an untrusted server refused, the disk cache used
//! only for a pinned sha256.
#![allow(clippy::unwrap_used)]

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use weft_fetch::testing::{TestCa, module};
use weft_fetch::{Backoff, FetchConfig, FetchError, Fetcher, Request, Roots, sha256_hex};

struct Server {
    base: String,
    hits: Arc<AtomicU32>,
    flaky: Arc<AtomicU32>,
}

async fn serve(ca: &TestCa, wasm: Vec<u8>) -> Server {
    let (cert, key) = ca.server_cert();
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert.as_bytes())
        .map(|c| c.unwrap())
        .collect();
    let key = PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap();
    let cfg = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("https://{}", listener.local_addr().unwrap());
    let hits = Arc::new(AtomicU32::new(0));
    let flaky = Arc::new(AtomicU32::new(0));
    let wasm = Bytes::from(wasm);
    let (h, fl) = (hits.clone(), flaky.clone());
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let (acceptor, wasm, h, fl) = (acceptor.clone(), wasm.clone(), h.clone(), fl.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let svc = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    let (wasm, h, fl) = (wasm.clone(), h.clone(), fl.clone());
                    async move {
                        h.fetch_add(1, Ordering::SeqCst);
                        let resp = hyper::Response::builder();
                        let r = match req.uri().path() {
                            "/plugin.wasm" => resp.body(Full::new(wasm)),
                            "/redirect" => resp
                                .status(302)
                                .header("location", "/plugin.wasm")
                                .body(Full::new(Bytes::new())),
                            "/to-http" => resp
                                .status(302)
                                .header("location", "http://127.0.0.1:1/plugin.wasm")
                                .body(Full::new(Bytes::new())),
                            "/flaky" if fl.fetch_add(1, Ordering::SeqCst) < 2 => resp
                                .status(503)
                                .body(Full::new(Bytes::from_static(b"try later"))),
                            "/flaky" => resp.body(Full::new(wasm)),
                            "/big" => resp.body(Full::new(Bytes::from(vec![0u8; 300_000]))),
                            _ => resp
                                .status(404)
                                .body(Full::new(Bytes::from_static(b"no such plugin"))),
                        };
                        Ok::<_, Infallible>(r.unwrap())
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), svc)
                    .await;
            });
        }
    });
    Server { base, hits, flaky }
}

fn config(ca_file: &std::path::Path) -> FetchConfig {
    FetchConfig {
        roots: Roots::File(ca_file.to_path_buf()),
        max_bytes: 200_000,
        retries: 3,
        backoff: Backoff {
            base: Duration::from_millis(5),
            max: Duration::from_millis(20),
        },
        ..FetchConfig::default()
    }
}

#[tokio::test]
async fn fetches_verifies_retries_and_bounds() {
    let ca = TestCa::new("https CA");
    let m = module("https");
    let srv = serve(&ca, m.clone()).await;
    let tmp = tempfile::tempdir().unwrap();
    let ca_file = ca.write(tmp.path());
    let mut cfg = config(&ca_file);
    cfg.cache_dir = Some(tmp.path().join("cache"));
    let f = Fetcher::new(cfg).unwrap();
    let sha = sha256_hex(&m);

    let got = f
        .fetch(&Request::new(format!("{}/plugin.wasm", srv.base)).with_sha256(&sha))
        .await
        .unwrap();
    assert_eq!(
        (*got.bytes == m, got.sha256.as_str(), got.attempts),
        (true, sha.as_str(), 1)
    );

    // Pinned and cached: no request at all.
    let before = srv.hits.load(Ordering::SeqCst);
    let got = f
        .fetch(
            &Request::new(format!("{}/plugin.wasm", srv.base)).with_sha256(format!("sha256:{sha}")),
        )
        .await
        .unwrap();
    assert!(got.from_cache);
    assert_eq!(srv.hits.load(Ordering::SeqCst), before);

    // Unpinned: always fetched (a URL's content may change).
    let got = f
        .fetch(&Request::new(format!("{}/redirect", srv.base)))
        .await
        .unwrap();
    assert!(!got.from_cache);
    assert_eq!(*got.bytes, m);

    // 503 twice, then served: three attempts.
    let got = f
        .fetch(&Request::new(format!("{}/flaky", srv.base)))
        .await
        .unwrap();
    assert_eq!(got.attempts, 3);
    assert_eq!(srv.flaky.load(Ordering::SeqCst), 3);

    // Wrong pin.
    let wrong = sha256_hex(b"other");
    let e = f
        .fetch(&Request::new(format!("{}/redirect", srv.base)).with_sha256(&wrong))
        .await
        .unwrap_err();
    assert!(matches!(e, FetchError::Sha256Mismatch { .. }), "{e}");
    assert!(
        e.to_string().contains(&wrong) && e.to_string().contains(&sha),
        "{e}"
    );

    // Too big: refused, not retried.
    let e = f
        .fetch(&Request::new(format!("{}/big", srv.base)))
        .await
        .unwrap_err();
    assert!(
        matches!(e, FetchError::TooLarge { limit: 200_000, .. }),
        "{e}"
    );

    // 404: final at once, with the body in the message.
    let before = srv.hits.load(Ordering::SeqCst);
    let e = f
        .fetch(&Request::new(format!("{}/nope", srv.base)))
        .await
        .unwrap_err();
    assert!(
        e.to_string().contains("404") && e.to_string().contains("no such plugin"),
        "{e}"
    );
    assert_eq!(srv.hits.load(Ordering::SeqCst), before + 1);

    // A redirect to plain http is not followed.
    let e = f
        .fetch(&Request::new(format!("{}/to-http", srv.base)))
        .await
        .unwrap_err();
    assert!(matches!(e, FetchError::Redirect { .. }), "{e}");
}

#[tokio::test]
async fn an_untrusted_server_is_refused() {
    let ca = TestCa::new("https CA");
    let srv = serve(&ca, module("x")).await;
    let tmp = tempfile::tempdir().unwrap();
    let other = TestCa::new("another CA");
    let mut cfg = config(&other.write(tmp.path()));
    cfg.retries = 0;
    let f = Fetcher::new(cfg).unwrap();
    let e = f
        .fetch(&Request::new(format!("{}/plugin.wasm", srv.base)))
        .await
        .unwrap_err();
    assert!(matches!(e, FetchError::Connect { .. }), "{e}");
    assert!(e.to_string().contains("TLS"), "{e}");
    // A roots file with nothing in it is an error at construction, not at the first fetch.
    let empty = tmp.path().join("empty.pem");
    std::fs::write(&empty, "").unwrap();
    let e = Fetcher::new(FetchConfig {
        roots: Roots::File(empty),
        ..FetchConfig::default()
    })
    .unwrap_err();
    assert!(e.to_string().contains("no usable certificate"), "{e}");
}

#[tokio::test]
async fn an_attempt_that_hangs_times_out_and_is_retried() {
    // A server that accepts and never answers: each attempt times out.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicU32::new(0));
    let a = accepted.clone();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = listener.accept().await {
            a.fetch_add(1, Ordering::SeqCst);
            held.push(s);
        }
    });
    let ca = TestCa::new("https CA");
    let tmp = tempfile::tempdir().unwrap();
    let mut cfg = config(&ca.write(tmp.path()));
    cfg.retries = 2;
    cfg.timeout = Duration::from_millis(200);
    let f = Fetcher::new(cfg).unwrap();
    let e = f
        .fetch(&Request::new(format!("https://{addr}/plugin.wasm")))
        .await
        .unwrap_err();
    match &e {
        FetchError::GaveUp { attempts: 3, last } => {
            assert!(matches!(**last, FetchError::Timeout { .. }), "{last}")
        }
        other => panic!("{other}"),
    }
    assert!(accepted.load(Ordering::SeqCst) <= 3);
}
