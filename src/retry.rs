//! Retry policy: how many attempts a request gets and how long it waits between them
//! (SMG's flags and formula). Pure data and arithmetic; the retry edge is in serve/.

use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetryPolicy {
    /// Total attempts, the first included (`--retry-max-retries`, as SMG counts it).
    pub max_attempts: u32,
    pub initial: Duration,
    pub max: Duration,
    pub multiplier: f64,
    pub jitter: f64,
}

// === impl RetryPolicy ===

impl RetryPolicy {
    /// The wait before attempt `next` (2 = the first retry): `initial × multiplier^(next-2)`,
    /// capped at `max`, then moved by up to ±`jitter` of itself; `unit` is uniform in [0, 1).
    pub fn backoff(&self, next: u32, unit: f64) -> Duration {
        let exp = next.saturating_sub(2).min(64) as i32;
        let base = (self.initial.as_secs_f64() * self.multiplier.powi(exp)).min(self.max.as_secs_f64());
        let moved = base * (1.0 + self.jitter * (2.0 * unit - 1.0));
        Duration::from_secs_f64(moved.max(0.0))
    }
}

/// Statuses worth another attempt on another worker, as SMG 1.13 retries: a 500 (and any
/// other status) is the answer, given once, as is.
pub fn retryable_status(status: u16) -> bool {
    matches!(status, 408 | 429 | 502 | 503 | 504)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_caps_and_jitters() {
        let p = RetryPolicy {
            max_attempts: 5,
            initial: Duration::from_millis(50),
            max: Duration::from_millis(100),
            multiplier: 1.5,
            jitter: 0.2,
        };
        assert_eq!(p.backoff(2, 0.5), Duration::from_millis(50));
        assert_eq!(p.backoff(3, 0.5), Duration::from_millis(75));
        assert_eq!(p.backoff(4, 0.5), Duration::from_millis(100), "capped");
        assert_eq!(p.backoff(9, 0.0), Duration::from_millis(80), "jitter after the cap");
        assert!(p.backoff(9, 0.999_999) <= Duration::from_millis(120));
        assert!(retryable_status(429) && retryable_status(504) && !retryable_status(501) && !retryable_status(400));
    }
}
