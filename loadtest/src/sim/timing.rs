//! The timing model: how long until the first token and between tokens, given prefill work, cache hits and batch load.

use std::time::Duration;

use crate::sim::config::Timing;

/// When a request's tokens are due, relative to its admission into a batch slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Schedule {
    /// Base TTFT plus prefill of the uncached prompt tokens.
    pub first_token: Duration,
    /// Gap between consecutive tokens.
    pub itl: Duration,
}

// === impl Schedule ===

impl Schedule {
    /// Offset of token `k` (0-based) from admission.
    pub fn token_due(&self, k: u32) -> Duration {
        self.first_token + self.itl * k
    }

    /// Offset at which the last of `n` tokens is due (when a non-streaming answer is sent).
    pub fn done_after(&self, n: u32) -> Duration {
        self.token_due(n.saturating_sub(1))
    }

    pub fn is_instant(&self) -> bool {
        self.first_token.is_zero() && self.itl.is_zero()
    }
}

/// Plans a request admitted when `running` of `max_running` slots are busy (itself included).
///
/// Cached prompt tokens skip prefill entirely, which is what makes cache-aware routing visible in TTFT.
/// Prefill also slows as the batch fills (it shares each step with the running decodes).
pub fn schedule(t: &Timing, uncached_tokens: u64, running: usize, max_running: usize) -> Schedule {
    let l = load(running, max_running);
    let prefill_ns = uncached_tokens as f64 * t.prefill_ns_per_token as f64 * (1.0 + t.prefill_batch_factor * l);
    let first_token = Duration::from_micros(t.ttft_us) + Duration::from_nanos(prefill_ns as u64);
    Schedule { first_token, itl: itl(t, running, max_running) }
}

/// Plans a PD decode server's request: its KV came from the prefill server, so the prompt costs
/// nothing here and the first token is one decode step after admission (the wait for the KV
/// happens before admission).
pub fn decode_schedule(t: &Timing, running: usize, max_running: usize) -> Schedule {
    let itl = itl(t, running, max_running);
    Schedule { first_token: itl, itl }
}

/// The gap between tokens with `running` of `max_running` slots busy: decode steps get slower as
/// the batch fills, linear from 1 running request to a full batch.
pub fn itl(t: &Timing, running: usize, max_running: usize) -> Duration {
    if t.itl_batch_factor == 0.0 {
        return Duration::from_micros(t.itl_us);
    }
    let itl_us = t.itl_us as f64 * (1.0 + t.itl_batch_factor * load(running, max_running));
    Duration::from_nanos((itl_us * 1000.0) as u64)
}

/// How full the batch is: 0 with one request running, 1 with every slot busy.
fn load(running: usize, max_running: usize) -> f64 {
    if max_running > 1 {
        (running.saturating_sub(1) as f64 / (max_running - 1) as f64).min(1.0)
    } else {
        0.0
    }
}

/// Output length: the request's max_tokens when given (capped), else the worker default.
/// Returns the token count and whether the limit ended generation (finish_reason "length").
pub fn output_tokens(t: &Timing, requested: Option<u64>) -> (u32, bool) {
    match requested {
        Some(n) => {
            let n = n.clamp(1, t.max_output_tokens as u64) as u32;
            (n, true)
        }
        None => (t.output_tokens.min(t.max_output_tokens), false),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timing() -> Timing {
        Timing {
            ttft_us: 50_000,
            itl_us: 10_000,
            prefill_ns_per_token: 1_000,
            itl_batch_factor: 1.0,
            prefill_batch_factor: 1.0,
            output_tokens: 16,
            write_each_event: false,
            max_output_tokens: 100,
        }
    }

    #[test]
    fn prefill_adds_to_ttft_and_cache_skips_it() {
        let t = timing();
        let cold = schedule(&t, 10_000, 1, 8);
        assert_eq!(cold.first_token, Duration::from_millis(60));
        let warm = schedule(&t, 0, 1, 8);
        assert_eq!(warm.first_token, Duration::from_millis(50));
        assert_eq!(warm.token_due(2), Duration::from_millis(70));
        assert_eq!(warm.done_after(1), Duration::from_millis(50));
    }

    #[test]
    fn decode_skips_prefill() {
        let t = timing();
        let s = decode_schedule(&t, 1, 5);
        assert_eq!((s.first_token, s.itl), (Duration::from_millis(10), Duration::from_millis(10)));
        assert_eq!(decode_schedule(&t, 5, 5).first_token, Duration::from_millis(20));
    }

    #[test]
    fn itl_grows_with_batch() {
        let t = timing();
        assert_eq!(schedule(&t, 0, 1, 5).itl, Duration::from_millis(10));
        assert_eq!(schedule(&t, 0, 5, 5).itl, Duration::from_millis(20));
        assert_eq!(schedule(&t, 0, 3, 5).itl, Duration::from_millis(15));
        assert_eq!(itl(&t, 5, 5), Duration::from_millis(20));
    }

    #[test]
    fn prefill_grows_with_batch() {
        let t = timing();
        // 10k uncached tokens at 1 µs: 10 ms alone, 20 ms beside a full batch.
        assert_eq!(schedule(&t, 10_000, 1, 5).first_token, Duration::from_millis(60));
        assert_eq!(schedule(&t, 10_000, 5, 5).first_token, Duration::from_millis(70));
    }

    #[test]
    fn output_length_rules() {
        let t = timing();
        assert_eq!(output_tokens(&t, None), (16, false));
        assert_eq!(output_tokens(&t, Some(5)), (5, true));
        assert_eq!(output_tokens(&t, Some(1_000)), (100, true));
        assert_eq!(output_tokens(&t, Some(0)), (1, true));
    }
}
