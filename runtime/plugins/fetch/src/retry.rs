//! Retries with exponential backoff and jitter, for errors that another attempt may cure.

use std::future::Future;
use std::time::Duration;

use rand::Rng;

use crate::FetchError;

/// Exponential backoff: attempt `n` (from 0) waits a random time in `[d/2, d]` where `d = min(max, base * 2^n)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// The first delay.
    pub base: Duration,
    /// The largest delay.
    pub max: Duration,
}

impl Backoff {
    /// The upper bound of the delay before retry `n` (0 = the first retry).
    pub fn ceiling(&self, n: u32) -> Duration {
        let factor = 1u32.checked_shl(n.min(20)).unwrap_or(u32::MAX);
        self.base
            .saturating_mul(factor)
            .min(self.max.max(self.base))
    }

    /// The delay before retry `n`, jittered.
    pub fn delay(&self, n: u32) -> Duration {
        let ceiling = self.ceiling(n);
        let half = ceiling / 2;
        let span = (ceiling - half).as_nanos().min(u128::from(u64::MAX)) as u64;
        half + Duration::from_nanos(if span == 0 {
            0
        } else {
            rand::rng().random_range(0..=span)
        })
    }
}

pub(crate) struct Policy {
    pub retries: u32,
    pub backoff: Backoff,
}

impl Policy {
    /// Runs `attempt` until it succeeds, fails with a non-retryable error, or the retries are spent. Returns the
    /// value and the number of attempts.
    pub async fn run<T, F, Fut>(&self, what: &str, mut attempt: F) -> Result<(T, u32), FetchError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, FetchError>>,
    {
        let mut n = 0u32;
        loop {
            n += 1;
            match attempt().await {
                Ok(v) => return Ok((v, n)),
                Err(e) if e.is_retryable() && n <= self.retries => {
                    let delay = self.backoff.delay(n - 1);
                    tracing::warn!(uri = %what, attempt = n, error = %e, retry_in = ?delay,
                        "plugin code fetch failed; retrying");
                    tokio::time::sleep(delay).await;
                }
                Err(e) if n > 1 => {
                    return Err(FetchError::GaveUp {
                        attempts: n,
                        last: Box::new(e),
                    });
                }
                Err(e) => return Err(e),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ceiling_doubles_up_to_max() {
        let b = Backoff {
            base: Duration::from_millis(100),
            max: Duration::from_secs(1),
        };
        assert_eq!(b.ceiling(0), Duration::from_millis(100));
        assert_eq!(b.ceiling(1), Duration::from_millis(200));
        assert_eq!(b.ceiling(3), Duration::from_millis(800));
        assert_eq!(b.ceiling(4), Duration::from_secs(1));
        assert_eq!(b.ceiling(1000), Duration::from_secs(1));
        for n in 0..8 {
            let d = b.delay(n);
            assert!(d >= b.ceiling(n) / 2 && d <= b.ceiling(n), "{n}: {d:?}");
        }
    }

    fn unavailable() -> FetchError {
        FetchError::Status {
            url: "https://x/".into(),
            status: 503,
            detail: String::new(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn retries_retryable_errors_then_gives_up() {
        let p = Policy {
            retries: 2,
            backoff: Backoff {
                base: Duration::from_secs(1),
                max: Duration::from_secs(4),
            },
        };
        let mut calls = 0;
        let started = tokio::time::Instant::now();
        let r: Result<((), u32), _> = p
            .run("https://x/", || {
                calls += 1;
                async { Err(unavailable()) }
            })
            .await;
        assert_eq!(calls, 3);
        match r {
            Err(FetchError::GaveUp { attempts: 3, last }) => {
                assert!(matches!(*last, FetchError::Status { status: 503, .. }))
            }
            other => panic!("{other:?}"),
        }
        // Two backoffs: at least 0.5 s + 1 s of (paused, auto-advanced) time.
        assert!(started.elapsed() >= Duration::from_millis(1500));
    }

    #[tokio::test(start_paused = true)]
    async fn stops_at_success_and_at_a_final_error() {
        let p = Policy {
            retries: 5,
            backoff: Backoff {
                base: Duration::from_millis(10),
                max: Duration::from_millis(10),
            },
        };
        let mut calls = 0;
        let r = p
            .run("u", || {
                calls += 1;
                let n = calls;
                async move { if n < 3 { Err(unavailable()) } else { Ok(n) } }
            })
            .await;
        assert_eq!(r.ok(), Some((3, 3)));
        let mut calls = 0;
        let r: Result<((), u32), _> = p
            .run("u", || {
                calls += 1;
                async {
                    Err(FetchError::Status {
                        url: "u".into(),
                        status: 404,
                        detail: String::new(),
                    })
                }
            })
            .await;
        assert_eq!(calls, 1);
        assert!(matches!(r, Err(FetchError::Status { status: 404, .. })));
    }
}
