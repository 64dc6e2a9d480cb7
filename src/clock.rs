//! The monotonic clock, read in one place. Logic that decides by time takes `now` from its
//! caller or holds a [`Clock`], so its unit tests move time by hand instead of sleeping.

use std::cell::Cell;
use std::rc::Rc;
use std::time::{Duration, Instant};

/// Now, on the monotonic clock.
#[allow(clippy::disallowed_methods)] // The one place that reads it.
pub fn now() -> Instant {
    Instant::now()
}

/// The clock a stateful component reads at each of its decisions (the scheduler's grants,
/// queue ages and starvation): the real one, or a hand-moved one in tests.
#[derive(Debug, Clone, Default)]
pub enum Clock {
    #[default]
    Real,
    Manual(Rc<Cell<Instant>>),
}

// === impl Clock ===

impl Clock {
    /// A clock that stands still until [`Clock::advance`] moves it.
    pub fn manual() -> Self {
        Clock::Manual(Rc::new(Cell::new(now())))
    }

    pub fn now(&self) -> Instant {
        match self {
            Clock::Real => now(),
            Clock::Manual(t) => t.get(),
        }
    }

    /// Moves a manual clock forward (a real one moves by itself: no effect).
    pub fn advance(&self, by: Duration) {
        if let Clock::Manual(t) = self {
            t.set(t.get() + by);
        }
    }
}
