//! A small, fast, deterministic RNG (wyrand) seeded per shard: no locks, no syscalls.

/// wyrand: one add and one 128-bit multiply per draw; plenty for spreading requests.
#[derive(Debug, Clone)]
pub(crate) struct WyRand(u64);

// === impl WyRand ===

impl WyRand {
    pub(crate) fn new(seed: u64) -> Self {
        WyRand(seed)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0xa076_1d64_78bd_642f);
        let t = u128::from(self.0).wrapping_mul(u128::from(self.0 ^ 0xe703_7ed1_a0b4_28db));
        (t as u64) ^ ((t >> 64) as u64)
    }

    /// Uniform in `0..n` (`n > 0`), by Lemire's multiply-shift (bias below 2^-32 for our n).
    pub(crate) fn below(&mut self, n: usize) -> usize {
        ((u128::from(self.next_u64()) * n as u128) >> 64) as usize
    }
}
