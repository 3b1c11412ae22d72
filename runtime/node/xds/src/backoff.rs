//! Reconnect delays: ztunnel's 10 ms doubling to 15 s, reset by a stream that delivered a response (a server
//! rotating connections, e.g. istiod's max connection age, is reconnected to at once), with jitter so the nodes of a
//! cluster do not all come back in the same millisecond after a control-plane restart.

use std::time::Duration;

/// The reconnect delay state of one source.
#[derive(Debug, Clone)]
pub(crate) struct Backoff {
    initial: Duration,
    max: Duration,
    current: Duration,
}

impl Backoff {
    pub(crate) fn new(initial: Duration, max: Duration) -> Self {
        let initial = initial.max(Duration::from_millis(1));
        Self {
            initial,
            max: max.max(initial),
            current: initial,
        }
    }

    /// The delay before the next attempt. `productive`: the stream that just ended delivered at least one response
    /// (the delay starts over); otherwise the delay doubles, up to the maximum.
    pub(crate) fn next(&mut self, productive: bool) -> Duration {
        self.current = if productive {
            self.initial
        } else {
            self.current.saturating_mul(2).min(self.max)
        };
        jitter(self.current)
    }

    /// The delay the next failure would start from.
    #[cfg(test)]
    pub(crate) fn current(&self) -> Duration {
        self.current
    }
}

/// A delay in `[d/2, d]`.
fn jitter(d: Duration) -> Duration {
    let half = d / 2;
    let extra = rand::random_range(0..=half.as_micros().min(u128::from(u64::MAX)) as u64);
    half + Duration::from_micros(extra)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_to_the_cap_and_resets_after_a_productive_stream() {
        let mut b = Backoff::new(Duration::from_millis(10), Duration::from_secs(15));
        let mut last = Duration::ZERO;
        for _ in 0..20 {
            let d = b.next(false);
            assert!(d >= b.current() / 2 && d <= b.current());
            assert!(b.current() >= last);
            last = b.current();
        }
        assert_eq!(b.current(), Duration::from_secs(15));
        b.next(true);
        assert_eq!(b.current(), Duration::from_millis(10));
        b.next(false);
        assert_eq!(b.current(), Duration::from_millis(20));
    }
}
