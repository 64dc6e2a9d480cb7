//! The one patience factor and the one wait for a signal, shared by the gateway's tests and
//! loadtest/'s (which include this file by path: they are another crate).

use std::time::{Duration, Instant};

/// `d` scaled by `SMG_TEST_PATIENCE_MS / 1000` (default 1000: as written).
pub fn patience(d: Duration) -> Duration {
    let ms = std::env::var("SMG_TEST_PATIENCE_MS").ok().and_then(|v| v.parse::<u64>().ok()).unwrap_or(1000).max(1);
    d.mul_f64(ms as f64 / 1000.0)
}

/// Polls `cond` every 5 ms for at most `within`; true once it held.
pub fn wait_until(within: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let until = Instant::now() + within;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= until {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}
