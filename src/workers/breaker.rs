//! One circuit breaker per worker, kept by the control thread and fed by every shard's
//! outcomes (so there is one state per worker, not one per shard).
//!
//! Closed → Open after `failure_threshold` consecutive failures; Open → HalfOpen once
//! `timeout` has passed (the worker is routable again, on probation); HalfOpen → Closed after
//! `success_threshold` consecutive successes, back to Open on any failure. Outcomes that
//! arrive while Open are requests that were already in flight: they say nothing new.

use std::time::{Duration, Instant};

/// What one finished attempt says about its worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Success,
    Failure,
    /// 429: the worker is alive and pushing back; neither a success nor a failure.
    Neutral,
}

// === impl Verdict ===

impl Verdict {
    /// 408, 500, 502, 503 and 504 are failures, 429 is neither, every other status a success.
    pub fn of_status(status: u16) -> Self {
        match status {
            408 | 500 | 502 | 503 | 504 => Verdict::Failure,
            429 => Verdict::Neutral,
            _ => Verdict::Success,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    Closed,
    Open,
    HalfOpen,
}

// === impl BreakerState ===

impl BreakerState {
    /// SMG's spelling (JSON and metrics).
    pub fn as_str(self) -> &'static str {
        match self {
            BreakerState::Closed => "closed",
            BreakerState::Open => "open",
            BreakerState::HalfOpen => "half_open",
        }
    }

    /// SMG's `smg_worker_cb_state` gauge value.
    pub fn gauge(self) -> u8 {
        match self {
            BreakerState::Closed => 0,
            BreakerState::Open => 1,
            BreakerState::HalfOpen => 2,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BreakerConfig {
    pub failure_threshold: u32,
    pub success_threshold: u32,
    pub timeout: Duration,
}

#[derive(Debug, Clone)]
pub struct Breaker {
    state: BreakerState,
    failures: u32,
    successes: u32,
    opened: Option<Instant>,
    /// Outcomes recorded in each verdict, for the admin API.
    pub total_failures: u64,
    pub total_successes: u64,
}

// === impl Breaker ===

impl Breaker {
    pub fn new() -> Self {
        Breaker {
            state: BreakerState::Closed,
            failures: 0,
            successes: 0,
            opened: None,
            total_failures: 0,
            total_successes: 0,
        }
    }

    pub fn state(&self) -> BreakerState {
        self.state
    }

    pub fn consecutive_failures(&self) -> u32 {
        self.failures
    }

    /// Records one outcome; returns the new state when it changed.
    pub fn record(&mut self, v: Verdict, cfg: &BreakerConfig, now: Instant) -> Option<BreakerState> {
        match v {
            Verdict::Neutral => return None,
            Verdict::Success => self.total_successes += 1,
            Verdict::Failure => self.total_failures += 1,
        }
        match (self.state, v) {
            (BreakerState::Open, _) => None,
            (BreakerState::Closed, Verdict::Success) => {
                self.failures = 0;
                None
            }
            (BreakerState::Closed, _) => {
                self.failures += 1;
                (self.failures >= cfg.failure_threshold).then(|| self.open(now))
            }
            (BreakerState::HalfOpen, Verdict::Success) => {
                self.successes += 1;
                (self.successes >= cfg.success_threshold).then(|| self.to(BreakerState::Closed))
            }
            (BreakerState::HalfOpen, _) => Some(self.open(now)),
        }
    }

    /// Open → HalfOpen once the timeout has passed; returns the new state when it changed.
    pub fn poll(&mut self, cfg: &BreakerConfig, now: Instant) -> Option<BreakerState> {
        let since = self.opened?;
        (self.state == BreakerState::Open && now.duration_since(since) >= cfg.timeout)
            .then(|| self.to(BreakerState::HalfOpen))
    }

    /// When an open breaker turns half-open.
    pub fn reopens_at(&self, cfg: &BreakerConfig) -> Option<Instant> {
        (self.state == BreakerState::Open).then(|| self.opened.map(|t| t + cfg.timeout)).flatten()
    }

    fn open(&mut self, now: Instant) -> BreakerState {
        self.opened = Some(now);
        self.to(BreakerState::Open)
    }

    fn to(&mut self, s: BreakerState) -> BreakerState {
        if s != BreakerState::Open {
            self.opened = None;
        }
        self.state = s;
        self.failures = 0;
        self.successes = 0;
        s
    }
}

impl Default for Breaker {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CFG: BreakerConfig =
        BreakerConfig { failure_threshold: 3, success_threshold: 2, timeout: Duration::from_secs(5) };

    #[test]
    fn opens_on_consecutive_failures_only() {
        let mut b = Breaker::new();
        let t = crate::clock::now();
        assert_eq!(b.record(Verdict::Failure, &CFG, t), None);
        assert_eq!(b.record(Verdict::Failure, &CFG, t), None);
        assert_eq!(b.record(Verdict::Success, &CFG, t), None, "a success resets the run");
        assert_eq!(b.record(Verdict::Failure, &CFG, t), None);
        assert_eq!(b.record(Verdict::Neutral, &CFG, t), None, "429 neither resets nor counts");
        assert_eq!(b.record(Verdict::Failure, &CFG, t), None);
        assert_eq!(b.record(Verdict::Failure, &CFG, t), Some(BreakerState::Open));
        assert_eq!(b.record(Verdict::Success, &CFG, t), None, "stragglers while open change nothing");
        assert_eq!(b.state(), BreakerState::Open);
    }

    #[test]
    fn half_opens_after_timeout_then_closes_or_reopens() {
        let mut b = Breaker::new();
        let t = crate::clock::now();
        for _ in 0..3 {
            b.record(Verdict::Failure, &CFG, t);
        }
        assert_eq!(b.poll(&CFG, t + Duration::from_secs(4)), None);
        assert_eq!(b.reopens_at(&CFG), Some(t + CFG.timeout));
        assert_eq!(b.poll(&CFG, t + Duration::from_secs(5)), Some(BreakerState::HalfOpen));
        let t2 = t + Duration::from_secs(6);
        assert_eq!(b.record(Verdict::Failure, &CFG, t2), Some(BreakerState::Open), "one failure on probation");
        assert_eq!(b.poll(&CFG, t2 + CFG.timeout), Some(BreakerState::HalfOpen));
        assert_eq!(b.record(Verdict::Success, &CFG, t2), None);
        assert_eq!(b.record(Verdict::Success, &CFG, t2), Some(BreakerState::Closed));
        assert_eq!(b.reopens_at(&CFG), None);
    }

    #[test]
    fn statuses_map_as_documented() {
        for s in [408, 500, 502, 503, 504] {
            assert_eq!(Verdict::of_status(s), Verdict::Failure, "{s}");
        }
        assert_eq!(Verdict::of_status(429), Verdict::Neutral);
        for s in [200, 201, 400, 401, 404, 413, 501] {
            assert_eq!(Verdict::of_status(s), Verdict::Success, "{s}");
        }
    }
}
