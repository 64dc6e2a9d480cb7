//! Fault injection: per request, draw which failure (if any) a worker plays, and answer health under fault settings.

use std::cell::Cell;
use std::time::Duration;

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

/// Health as /health reports it: an explicit override from the control endpoint wins, else the
/// start-up grace rule, else flapping (when on), else healthy.
///
/// Only /health reads this, so the clock reads cost nothing on the inference path.
pub struct Health {
    started: Instant,
    unhealthy_for_ms: u64,
    forced: Cell<Option<bool>>,
    /// Half-period of flapping in ms; 0 is off.
    flap_ms: Cell<u64>,
    /// When the flap phase was last (re)started: start-up, or the control knob changing it.
    flap_since: Cell<Instant>,
}

// === impl Health ===

impl Health {
    pub fn new(unhealthy_for_ms: u64, start_unhealthy: bool, flap_ms: u64) -> Self {
        let now = Instant::now();
        Self {
            started: now,
            unhealthy_for_ms,
            forced: Cell::new(if start_unhealthy { Some(false) } else { None }),
            flap_ms: Cell::new(flap_ms),
            flap_since: Cell::new(now),
        }
    }

    pub fn is_healthy(&self) -> bool {
        self.healthy_at(Instant::now())
    }

    fn healthy_at(&self, now: Instant) -> bool {
        if let Some(h) = self.forced.get() {
            return h;
        }
        let grace_end = self.started + Duration::from_millis(self.unhealthy_for_ms);
        if now < grace_end {
            return false;
        }
        let flap = self.flap_ms.get();
        if flap == 0 {
            return true;
        }
        // Phases count from the end of the grace period (or the knob's last change), so the
        // first phase is always the healthy one.
        let since = self.flap_since.get().max(grace_end);
        let phase = now.saturating_duration_since(since).as_millis() as u64 / flap;
        phase.is_multiple_of(2)
    }

    pub fn force(&self, healthy: bool) {
        self.forced.set(Some(healthy));
    }

    /// Drops a forced state, so the grace and flap rules apply again.
    pub fn unforce(&self) {
        self.forced.set(None);
    }

    pub fn flap_ms(&self) -> u64 {
        self.flap_ms.get()
    }

    /// Sets the flap half-period and restarts the phase now (healthy first); 0 turns flapping off.
    pub fn set_flap(&self, ms: u64) {
        self.flap_ms.set(ms);
        self.flap_since.set(Instant::now());
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
            close_after_response: false,
            reported_load: None,
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
        let h = Health::new(0, false, 0);
        assert!(h.is_healthy());
        h.force(false);
        assert!(!h.is_healthy());
        h.unforce();
        assert!(h.is_healthy());
        let h = Health::new(60_000, false, 0);
        assert!(!h.is_healthy());
        let h = Health::new(0, true, 0);
        assert!(!h.is_healthy());
        h.force(true);
        assert!(h.is_healthy());
    }

    #[test]
    fn flapping_alternates_from_healthy() {
        let ms = Duration::from_millis;
        let h = Health::new(0, false, 100);
        let t0 = h.started;
        let got: Vec<bool> = [0, 99, 100, 199, 200, 350].iter().map(|&t| h.healthy_at(t0 + ms(t))).collect();
        assert_eq!(got, [true, true, false, false, true, false]);
        // An override wins over the flap.
        h.force(true);
        assert!(h.healthy_at(t0 + ms(150)));
        h.unforce();
        assert!(!h.healthy_at(t0 + ms(150)));
        // With a grace period, flapping starts healthy when the grace ends.
        let h = Health::new(1000, false, 100);
        let t0 = h.started;
        let got: Vec<bool> = [0, 999, 1000, 1099, 1100, 1200].iter().map(|&t| h.healthy_at(t0 + ms(t))).collect();
        assert_eq!(got, [false, false, true, true, false, true]);
        // Changing the period restarts the phase, healthy first; 0 turns flapping off.
        h.set_flap(0);
        assert!(h.healthy_at(t0 + ms(5000)));
    }
}
