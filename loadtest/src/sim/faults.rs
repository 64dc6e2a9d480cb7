//! Fault injection: per request, draw which failure (if any) a worker plays, and answer health under fault settings.

use std::cell::Cell;

use monoio::time::Instant;

use crate::rng::Rng;
use crate::sim::config::FaultPlan;

/// The failure one inference request gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    None,
    /// Answer at once with this status and an error body.
    Fail {
        status: u16,
    },
    /// Never answer; keep the connection until the client leaves.
    Hang,
    /// Stop the response early and close the connection; `after_tokens` of None means half the output.
    Truncate {
        after_tokens: Option<u32>,
    },
}

/// Draws a fault: fail, then hang, then truncate, each with its own probability.
pub fn draw(plan: &FaultPlan, rng: &Rng) -> Fault {
    if rng.chance(plan.fail_rate) {
        Fault::Fail { status: plan.fail_status }
    } else if rng.chance(plan.hang_rate) {
        Fault::Hang
    } else if rng.chance(plan.truncate_rate) {
        Fault::Truncate { after_tokens: plan.truncate_after_tokens }
    } else {
        Fault::None
    }
}

/// Health as /health reports it: an explicit override from the control endpoint wins, else the start-up grace rule.
pub struct Health {
    started: Instant,
    unhealthy_for_ms: u64,
    forced: Cell<Option<bool>>,
}

// === impl Health ===

impl Health {
    pub fn new(unhealthy_for_ms: u64, start_unhealthy: bool) -> Self {
        Self {
            started: Instant::now(),
            unhealthy_for_ms,
            forced: Cell::new(if start_unhealthy { Some(false) } else { None }),
        }
    }

    pub fn is_healthy(&self) -> bool {
        match self.forced.get() {
            Some(h) => h,
            None => self.started.elapsed().as_millis() as u64 >= self.unhealthy_for_ms,
        }
    }

    pub fn force(&self, healthy: bool) {
        self.forced.set(Some(healthy));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan() -> FaultPlan {
        FaultPlan {
            fail_rate: 0.0,
            fail_status: 503,
            hang_rate: 0.0,
            truncate_rate: 0.0,
            truncate_after_tokens: Some(3),
            die_after: None,
            accept_delay_ms: 0,
        }
    }

    #[test]
    fn draws_follow_rates() {
        let rng = Rng::with_seed(3);
        let mut p = plan();
        assert_eq!(draw(&p, &rng), Fault::None);
        p.fail_rate = 1.0;
        assert_eq!(draw(&p, &rng), Fault::Fail { status: 503 });
        p.fail_rate = 0.0;
        p.hang_rate = 1.0;
        assert_eq!(draw(&p, &rng), Fault::Hang);
        p.hang_rate = 0.0;
        p.truncate_rate = 1.0;
        assert_eq!(draw(&p, &rng), Fault::Truncate { after_tokens: Some(3) });
        p.truncate_rate = 0.0;
        p.fail_rate = 0.5;
        let fails = (0..10_000).filter(|_| draw(&p, &rng) != Fault::None).count();
        assert!((4_500..5_500).contains(&fails), "{fails}");
    }

    #[test]
    fn health_override_and_grace() {
        let h = Health::new(0, false);
        assert!(h.is_healthy());
        h.force(false);
        assert!(!h.is_healthy());
        let h = Health::new(60_000, false);
        assert!(!h.is_healthy());
        let h = Health::new(0, true);
        assert!(!h.is_healthy());
        h.force(true);
        assert!(h.is_healthy());
    }
}
