//! Secret manager tests with an in-process CA whose latency, failures and call log the test controls. Every test
//! runs on tokio's paused clock and the CA signs on the same clock ([`TokioWallClock`]), so renewals, expiries,
//! backoffs and CA latency happen at exact virtual instants however loaded the machine is: a `sleep` here means
//! "let every task run until it waits, then move virtual time on", never a wait on the wall clock.
#![allow(clippy::unwrap_used)]

use super::*;
use crate::ca::{IssuedChain, LocalCa, generate_root};
use crate::clock::TokioWallClock;
use std::sync::atomic::{AtomicBool, AtomicUsize};

#[derive(Debug)]
struct TestCa {
    inner: LocalCa,
    calls: AtomicUsize,
    log: Mutex<Vec<String>>,
    fail: AtomicBool,
    delay: Duration,
    gate: tokio::sync::Semaphore,
    clock: TokioWallClock,
}

impl TestCa {
    fn new(delay: Duration, gated: bool) -> Arc<Self> {
        let (cert, key) = generate_root("cluster.local", Duration::from_secs(3600)).unwrap();
        Arc::new(Self {
            inner: LocalCa::from_pem(&cert, &key, vec![]).unwrap(),
            calls: AtomicUsize::new(0),
            log: Mutex::new(Vec::new()),
            fail: AtomicBool::new(false),
            delay,
            gate: tokio::sync::Semaphore::new(if gated { 0 } else { 1 << 20 }),
            clock: TokioWallClock::new(),
        })
    }
    fn calls(&self) -> usize {
        self.calls.load(Relaxed)
    }
}

impl CaClient for TestCa {
    fn sign<'a>(&'a self, req: &'a CertRequest) -> BoxFuture<'a, Result<IssuedChain, Error>> {
        Box::pin(async move {
            self.calls.fetch_add(1, Relaxed);
            let _g = self
                .gate
                .acquire()
                .await
                .map_err(|e| Error::Ca(e.to_string()))?;
            self.log
                .lock()
                .unwrap()
                .push(req.identity.service_account().to_owned());
            tokio::time::sleep(self.delay).await;
            if self.fail.load(Relaxed) {
                return Err(Error::CaUnavailable("injected outage".into()));
            }
            if req.identity.namespace() == "elsewhere" {
                return Err(Error::CaRefused {
                    code: "PermissionDenied".into(),
                    message: "not on this node".into(),
                });
            }
            Ok(IssuedChain {
                chain_pem: self.inner.sign_csr_at(
                    &req.identity,
                    &req.csr_pem,
                    req.validity,
                    self.clock.now(),
                )?,
                roots_pem: self.inner.trust_roots(),
            })
        })
    }
    fn trust_roots(&self) -> Vec<String> {
        self.inner.trust_roots()
    }
}

fn id(sa: &str) -> SpiffeId {
    SpiffeId::new("cluster.local", "default", sa).unwrap()
}

/// The manager's knobs for a test whose CA is `ca`: both read time from the CA's clock.
fn cfg(ca: &TestCa) -> ManagerConfig {
    ManagerConfig {
        clock: Arc::new(ca.clock),
        refresh_jitter: 0.0,
        backoff_initial: Duration::from_millis(100),
        backoff_max: Duration::from_millis(400),
        ..ManagerConfig::default()
    }
}

#[tokio::test(start_paused = true)]
async fn a_burst_of_1000_fetches_makes_one_ca_call() {
    let ca = TestCa::new(Duration::from_millis(50), false);
    let m = SecretManager::new(ca.clone(), cfg(&ca));
    let mut tasks = Vec::new();
    for _ in 0..1000 {
        let m = m.clone();
        tasks.push(tokio::spawn(async move { m.fetch(&id("burst")).await }));
    }
    let mut serials = HashSet::new();
    for t in tasks {
        serials.insert(t.await.unwrap().unwrap().serial().to_owned());
    }
    assert_eq!(ca.calls(), 1);
    assert_eq!(serials.len(), 1);
    assert_eq!(m.counters().fetches.load(Relaxed), 1);
    assert!(m.counters().coalesced.load(Relaxed) >= 1);
}

#[tokio::test(start_paused = true)]
async fn waiting_calls_are_served_by_priority() {
    let ca = TestCa::new(Duration::ZERO, true);
    let m = SecretManager::new(
        ca.clone(),
        ManagerConfig {
            max_in_flight: 1,
            ..cfg(&ca)
        },
    );
    // "first" takes the only slot and blocks in the CA; then a background-ish prefetch, and a connection.
    m.prefetch(&id("first"));
    while ca.calls() < 1 {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    m.prefetch(&id("warm"));
    tokio::time::sleep(Duration::from_millis(10)).await;
    let m2 = m.clone();
    let conn = tokio::spawn(async move { m2.fetch(&id("conn")).await });
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(m.ca_calls(), (1, 2));
    ca.gate.add_permits(1 << 20);
    conn.await.unwrap().unwrap();
    while m.dump().iter().any(|d| d.state != "Available") {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(*ca.log.lock().unwrap(), ["first", "conn", "warm"]);
}

#[tokio::test(start_paused = true)]
async fn renews_at_half_life_and_retries_with_backoff_while_the_old_cert_serves() {
    let ca = TestCa::new(Duration::ZERO, false);
    let m = SecretManager::new(
        ca.clone(),
        ManagerConfig {
            validity: Duration::from_secs(100),
            ..cfg(&ca)
        },
    );
    let _r = m.spawn_refresher(Duration::from_secs(5));
    let first = m.fetch(&id("rot")).await.unwrap();
    // Renewed at half of the lifetime left on arrival: X.509 keeps whole seconds, so 99-100 s of life, renewal at
    // 49.5-50 s. Not at 45 s; done by 55 s.
    tokio::time::sleep(Duration::from_secs(45)).await;
    assert_eq!(m.fetch(&id("rot")).await.unwrap().serial(), first.serial());
    assert_eq!(ca.calls(), 1);
    tokio::time::sleep(Duration::from_secs(10)).await;
    let second = m.fetch(&id("rot")).await.unwrap();
    assert_ne!(second.serial(), first.serial());
    assert_eq!(m.counters().renewals.load(Relaxed), 1);
    assert_eq!(ca.calls(), 2);

    // Outage from t=55 s: the next renewal (due at ~100 s) fails and is retried with growing delays (backoff 100,
    // 200, 400, 400 ms, ...) while `second` keeps serving (valid until ~150 s).
    ca.fail.store(true, Relaxed);
    let calls_before = ca.calls();
    while m.dump()[0].consecutive_failures == 0 {
        tokio::time::sleep(Duration::from_millis(7)).await;
    }
    assert_eq!(ca.calls() - calls_before, 1);
    // Seen within 7 ms of the first failure; one second later exactly the retries at +0.1, +0.3 and +0.7 s have been
    // made (the next is at +1.1 s): not one per refresher tick, not a busy loop.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let retries = ca.calls() - calls_before - 1;
    assert_eq!(retries, 3);
    let during = m.fetch(&id("rot")).await.unwrap();
    assert_eq!(during.serial(), second.serial());
    let d = &m.dump()[0];
    assert_eq!(d.state, "Available");
    assert_eq!(d.consecutive_failures, 4, "{d:?}");
    assert!(d.last_error.as_deref().unwrap().contains("injected outage"));

    // Recovery without anyone asking: the next retry (at most 400 ms away) succeeds.
    ca.fail.store(false, Relaxed);
    tokio::time::sleep(Duration::from_millis(450)).await;
    let d = &m.dump()[0];
    assert_eq!(d.consecutive_failures, 0, "{d:?}");
    assert_ne!(d.serial_number.as_deref(), Some(second.serial()));
}

#[tokio::test(start_paused = true)]
async fn an_outage_longer_than_the_certificate_makes_it_unavailable_then_recovers() {
    let ca = TestCa::new(Duration::ZERO, false);
    let m = SecretManager::new(
        ca.clone(),
        ManagerConfig {
            validity: Duration::from_secs(100),
            backoff_max: Duration::from_secs(30),
            ..cfg(&ca)
        },
    );
    let _r = m.spawn_refresher(Duration::from_secs(5));
    let first = m.fetch(&id("exp")).await.unwrap();
    ca.fail.store(true, Relaxed);
    // Past not-after (<= 100 s): the certificate is no longer handed out, and connections get the CA's error.
    tokio::time::sleep(Duration::from_secs(101)).await;
    let d = &m.dump()[0];
    assert_ne!(d.state, "Available", "{d:?}");
    let err = m.fetch(&id("exp")).await.unwrap_err();
    assert!(err.to_string().contains("injected outage"), "{err}");
    assert!(m.soonest_expiry().is_none());
    // The CA comes back: the next retry (backoff at most 30 s) restores it without a connection asking.
    ca.fail.store(false, Relaxed);
    tokio::time::sleep(Duration::from_secs(31)).await;
    let d = &m.dump()[0];
    assert_eq!(d.state, "Available", "{d:?}");
    assert_ne!(d.serial_number.as_deref(), Some(first.serial()));
}

#[tokio::test(start_paused = true)]
async fn a_refusal_fails_connections_fast_and_is_counted() {
    let ca = TestCa::new(Duration::ZERO, false);
    let m = SecretManager::new(ca.clone(), cfg(&ca));
    let other = SpiffeId::new("cluster.local", "elsewhere", "x").unwrap();
    let err = m.fetch(&other).await.unwrap_err();
    assert!(err.to_string().contains("PermissionDenied"), "{err}");
    // Within the first backoff step: the same error, no new CA call.
    let again = m.fetch(&other).await.unwrap_err();
    assert_eq!(again.to_string(), err.to_string());
    assert_eq!(ca.calls(), 1);
    assert_eq!(m.counters().refused.load(Relaxed), 1);
    assert_eq!(m.dump()[0].state, "Unavailable");
    // After it: a connection tries again.
    tokio::time::sleep(Duration::from_millis(120)).await;
    assert!(m.fetch(&other).await.is_err());
    assert_eq!(ca.calls(), 2);
}

#[tokio::test(start_paused = true)]
async fn retain_prefetches_new_identities_and_forgets_old_ones() {
    let ca = TestCa::new(Duration::from_millis(20), false);
    let m = SecretManager::new(ca.clone(), cfg(&ca));
    m.retain(&[id("a"), id("b")].into_iter().collect());
    while m.dump().iter().filter(|d| d.state == "Available").count() < 2 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(m.soonest_expiry().is_some());
    m.retain(&[id("b")].into_iter().collect());
    let ids: Vec<String> = m.dump().into_iter().map(|d| d.identity).collect();
    assert_eq!(ids, ["spiffe://cluster.local/ns/default/sa/b"]);
    // Forgetting an identity whose fetch is in flight cancels it; its waiters get a clear error.
    let m2 = m.clone();
    let waiting = tokio::spawn(async move { m2.fetch(&id("c")).await });
    tokio::time::sleep(Duration::from_millis(5)).await;
    m.retain(&[id("b")].into_iter().collect());
    let err = waiting.await.unwrap().unwrap_err();
    assert!(matches!(err, Error::Forgotten(_)), "{err}");
}

#[tokio::test(start_paused = true)]
async fn the_dump_has_ztunnels_certificate_shape() {
    let ca = TestCa::new(Duration::ZERO, false);
    let m = SecretManager::new(ca.clone(), cfg(&ca));
    let cert = m.fetch(&id("dump")).await.unwrap();
    let d = serde_json::to_value(&m.dump()[0]).unwrap();
    assert_eq!(d["state"], "Available", "{d}");
    // Decimal serial numbers (istioctl parses them base 10), the leaf's as the chain's first.
    let leaf = &d["certChain"][0];
    assert_eq!(leaf["serialNumber"], cert.serial(), "{d}");
    assert!(
        cert.serial().bytes().all(|b| b.is_ascii_digit()),
        "{}",
        cert.serial()
    );
    // Roots are objects with their PEM, serial number and validity, not bare PEM strings.
    let root = &d["rootCerts"][0];
    for k in ["pem", "serialNumber", "validFrom", "expirationTime"] {
        assert!(root[k].as_str().is_some_and(|s| !s.is_empty()), "{k}: {d}");
    }
    assert!(
        root["pem"]
            .as_str()
            .unwrap()
            .starts_with("-----BEGIN CERTIFICATE-----")
    );
}
