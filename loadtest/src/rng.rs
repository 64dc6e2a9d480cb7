//! A tiny per-thread xorshift generator: fault injection and Poisson arrivals need cheap randomness, not crypto.

use std::cell::Cell;

/// xorshift64* (Vigna); period 2^64-1, plenty for coin flips and exponential gaps.
#[derive(Debug)]
pub struct Rng {
    state: Cell<u64>,
}

// === impl Rng ===

impl Rng {
    /// Seeds from the clock and the thread's stack address so threads do not share a sequence.
    pub fn from_entropy() -> Self {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0x9E37_79B9_7F4A_7C15);
        let local = 0u8;
        let addr = &local as *const u8 as u64;
        Self::with_seed(t ^ addr.rotate_left(32))
    }

    pub fn with_seed(seed: u64) -> Self {
        // A zero state would stay zero forever.
        Self { state: Cell::new(seed | 1) }
    }

    pub fn next_u64(&self) -> u64 {
        let mut x = self.state.get();
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.state.set(x);
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in [0, 1).
    pub fn next_f64(&self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// True with probability `p` (p <= 0 never, p >= 1 always).
    pub fn chance(&self, p: f64) -> bool {
        p > 0.0 && (p >= 1.0 || self.next_f64() < p)
    }

    /// Exponentially distributed with the given mean: the gap between Poisson arrivals.
    pub fn exp(&self, mean: f64) -> f64 {
        // 1 - u is in (0, 1], so ln never sees zero.
        -mean * (1.0 - self.next_f64()).ln()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chance_extremes_and_mean() {
        let r = Rng::with_seed(7);
        assert!(!r.chance(0.0));
        assert!(r.chance(1.0));
        let hits = (0..100_000).filter(|_| r.chance(0.25)).count();
        assert!((23_000..27_000).contains(&hits), "{hits}");
    }

    #[test]
    fn exp_mean_is_close() {
        let r = Rng::with_seed(11);
        let n = 100_000;
        let sum: f64 = (0..n).map(|_| r.exp(2.0)).sum();
        let mean = sum / n as f64;
        assert!((1.9..2.1).contains(&mean), "{mean}");
    }
}
