//! Cheap randomness for fault injection and Poisson arrivals (not crypto): fastrand's wyrand
//! per thread, with the two draws the tools need on top.

use std::cell::RefCell;

#[derive(Debug)]
pub struct Rng {
    inner: RefCell<fastrand::Rng>,
}

// === impl Rng ===

impl Rng {
    /// Seeded from the OS, so threads do not share a sequence.
    pub fn from_entropy() -> Self {
        Self { inner: RefCell::new(fastrand::Rng::new()) }
    }

    pub fn with_seed(seed: u64) -> Self {
        Self { inner: RefCell::new(fastrand::Rng::with_seed(seed)) }
    }

    pub fn next_u64(&self) -> u64 {
        self.inner.borrow_mut().u64(..)
    }

    /// Uniform in [0, 1).
    pub fn next_f64(&self) -> f64 {
        self.inner.borrow_mut().f64()
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
