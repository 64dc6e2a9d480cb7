//! A worker's health status, moved only by health-check results and the admin API
//! (SMG's states and thresholds):
//!
//! ```text
//!  Pending ──S passes──► Ready ──F fails──► NotReady ──3F more fails──► Failed
//!     │                    ▲                   │                          │
//!     │ 10F checks         └───── S passes ────┴──────── S passes ────────┘
//!     └─ without Ready ──► Failed
//!  any ──DELETE──► Draining ──settle, then in-flight done──► removed
//! ```
//!
//! F = `--health-failure-threshold`, S = `--health-success-threshold` (consecutive). Only
//! Ready workers are routable. Unlike SMG, a Failed worker is still checked (every
//! interval) and taken back after S passes: a worker that took long to load its model, or
//! was restarted, should not need an operator; `--remove-unhealthy-workers` removes Failed
//! ones instead.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Pending,
    Ready,
    NotReady,
    Failed,
    Draining,
}

// === impl Status ===

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Pending => "pending",
            Status::Ready => "ready",
            Status::NotReady => "not_ready",
            Status::Failed => "failed",
            Status::Draining => "draining",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Thresholds {
    pub failures: u32,
    pub successes: u32,
}

/// The health-check side of a worker's status.
#[derive(Debug, Clone)]
pub struct Health {
    status: Status,
    passes: u32,
    fails: u32,
    /// Checks since the last status change (a Pending worker gets 10 F of them).
    checks: u32,
}

// === impl Health ===

impl Health {
    pub fn new() -> Self {
        Health { status: Status::Pending, passes: 0, fails: 0, checks: 0 }
    }

    /// Ready from the start (health checks disabled).
    pub fn ready() -> Self {
        Health { status: Status::Ready, passes: 0, fails: 0, checks: 0 }
    }

    pub fn status(&self) -> Status {
        self.status
    }

    /// Records one health-check result; returns the new status when it changed.
    pub fn record(&mut self, passed: bool, t: &Thresholds) -> Option<Status> {
        if self.status == Status::Draining {
            return None;
        }
        self.checks = self.checks.saturating_add(1);
        if passed {
            self.fails = 0;
            self.passes += 1;
            let promote = self.status != Status::Ready && self.passes >= t.successes;
            promote.then(|| self.to(Status::Ready))
        } else {
            self.passes = 0;
            self.fails += 1;
            let next = match self.status {
                Status::Pending if self.checks >= t.failures.saturating_mul(10) => Status::Failed,
                Status::Ready if self.fails >= t.failures => Status::NotReady,
                Status::NotReady if self.fails >= t.failures.saturating_mul(3) => Status::Failed,
                _ => return None,
            };
            Some(self.to(next))
        }
    }

    /// A run of passes has begun that will make it Ready: worth checking again soon.
    pub fn confirming(&self) -> bool {
        self.status != Status::Ready && self.passes > 0
    }

    /// Forces a status (admin API: drain, or a health override).
    pub fn set(&mut self, s: Status) -> Option<Status> {
        (self.status != s).then(|| self.to(s))
    }

    fn to(&mut self, s: Status) -> Status {
        self.status = s;
        self.passes = 0;
        self.fails = 0;
        self.checks = 0;
        s
    }
}

impl Default for Health {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Thresholds = Thresholds { failures: 3, successes: 2 };

    #[test]
    fn walks_the_documented_states() {
        let mut h = Health::new();
        assert_eq!(h.record(true, &T), None);
        assert_eq!(h.record(true, &T), Some(Status::Ready), "S passes register");
        assert_eq!(h.record(false, &T), None);
        assert_eq!(h.record(false, &T), None);
        assert_eq!(h.record(true, &T), None, "a pass resets the run");
        for _ in 0..2 {
            assert_eq!(h.record(false, &T), None);
        }
        assert_eq!(h.record(false, &T), Some(Status::NotReady));
        assert_eq!(h.record(true, &T), None);
        assert_eq!(h.record(true, &T), Some(Status::Ready), "S passes bring it back");
        for _ in 0..3 {
            h.record(false, &T);
        }
        assert_eq!(h.status(), Status::NotReady);
        for _ in 0..8 {
            assert_eq!(h.record(false, &T), None);
        }
        assert_eq!(h.record(false, &T), Some(Status::Failed), "3F more");
        assert_eq!(h.record(false, &T), None);
        assert_eq!(h.record(true, &T), None);
        assert_eq!(h.record(true, &T), Some(Status::Ready), "taken back");
        assert_eq!(h.set(Status::Draining), Some(Status::Draining));
        assert_eq!(h.record(true, &T), None, "draining is final");
        assert_eq!(h.record(false, &T), None);
    }

    #[test]
    fn a_pending_worker_that_never_comes_up_fails() {
        let mut h = Health::new();
        for _ in 0..29 {
            assert_eq!(h.record(false, &T), None);
        }
        assert_eq!(h.record(false, &T), Some(Status::Failed));
    }
}
