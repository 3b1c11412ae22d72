//! Waiting for an event: poll a condition until it holds, failing only after a generous bound. The wait ends at
//! the event, so the bound costs nothing when things work and keeps a loaded machine (a CI run, a parallel build)
//! from turning a slow event into a failure. The async waits use tokio's clock, so under a paused clock the bound
//! passes at once when nothing else can happen.

use std::future::Future;
use std::time::Duration;

/// How long a wait lasts before the test fails.
pub const PATIENCE: Duration = Duration::from_secs(60);

/// Between two polls (async waits yield to the runtime meanwhile).
const POLL: Duration = Duration::from_millis(5);

/// A wait that ran out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Timeout {
    /// What was waited for.
    pub what: String,
    /// How long.
    pub after: Duration,
}

impl std::fmt::Display for Timeout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "timed out after {:?} waiting for {}",
            self.after, self.what
        )
    }
}

impl std::error::Error for Timeout {}

/// Poll `f` until it returns `Some`, or `Err` after `timeout`.
pub async fn eventually_within<T, F, Fut>(timeout: Duration, what: &str, f: F) -> Result<T, Timeout>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    poll_within(timeout, POLL, what, f).await
}

/// [`eventually_within`], polling every `every` (for polls that cost something: an HTTP request to a process).
pub async fn poll_within<T, F, Fut>(
    timeout: Duration,
    every: Duration,
    what: &str,
    mut f: F,
) -> Result<T, Timeout>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return Ok(v);
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(Timeout {
                what: what.to_owned(),
                after: timeout,
            });
        }
        tokio::time::sleep(every).await;
    }
}

/// Poll `f` until it returns `Some`; panics (fails the test) after [`PATIENCE`].
pub async fn eventually<T, F, Fut>(what: &str, f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    match eventually_within(PATIENCE, what, f).await {
        Ok(v) => v,
        Err(e) => panic!("{e}"),
    }
}

/// Poll `cond` until it holds; panics (fails the test) after [`PATIENCE`].
pub async fn until(what: &str, mut cond: impl FnMut() -> bool) {
    eventually(what, || std::future::ready(cond().then_some(()))).await
}

/// [`eventually`] for a thread with no runtime (the plugin host's tests): polls every millisecond, real time.
pub fn eventually_blocking<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = std::time::Instant::now() + PATIENCE;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "timed out after {PATIENCE:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[tokio::test(start_paused = true)]
    async fn a_wait_ends_at_the_event_and_times_out_without_one() {
        let n = Arc::new(AtomicU32::new(0));
        let seen = eventually("three polls", || {
            let v = n.fetch_add(1, Ordering::Relaxed);
            std::future::ready((v == 2).then_some(v))
        })
        .await;
        assert_eq!(seen, 2);
        let r = eventually_within(Duration::from_secs(1), "never", || {
            std::future::ready(None::<()>)
        })
        .await;
        assert_eq!(
            r.unwrap_err().to_string(),
            "timed out after 1s waiting for never"
        );
    }

    #[tokio::test(start_paused = true)]
    #[should_panic(expected = "waiting for nothing")]
    async fn until_fails_the_test_after_patience() {
        until("nothing", || false).await;
    }

    #[test]
    fn the_blocking_wait_returns_the_value() {
        let mut n = 0;
        assert_eq!(
            eventually_blocking("n reaches 3", || {
                n += 1;
                (n == 3).then_some(n)
            }),
            3
        );
    }
}
