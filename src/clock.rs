//! The monotonic clock, read in one place. Logic that decides by time takes `now` from its
//! caller or holds a [`Clock`], so its unit tests move time by hand instead of sleeping.
//!
//! A client connection's task reads the clock once per wake, as nginx caches its time once
//! per turn of its event loop ([`per_wake`]). A proxied request read it eleven times
//! (callgrind), most of them in a wake that had already read it: its start, the body's
//! deadline, the pick, the upstream's start, the pool's idle check, the response timer.
//! `perf record` on chat-1k put the vDSO read at 1.3% of the gateway's samples (about 5% of
//! its user time), and at 0.6% after (monoio's driver reads it once a park).

use std::cell::Cell;
use std::future::{Future, IntoFuture};
use std::rc::Rc;
use std::time::{Duration, Instant};

/// Where this thread is, for [`now`].
#[derive(Clone, Copy)]
enum Wake {
    /// Not inside a [`per_wake`] task: every call reads the clock.
    Outside,
    /// Inside one, and the clock not yet read in this wake.
    Unread,
    /// Inside one, and read at this instant in this wake.
    Read(Instant),
}

thread_local! {
    static WAKE: Cell<Wake> = const { Cell::new(Wake::Outside) };
}

/// Now, on the monotonic clock. Within a [`per_wake`] task, the instant of this wake's first
/// read: everything one wake does happens "at once", a deadline set late in a wake is early
/// by that wake's own length, and a span measured inside one wake reads zero (use [`fresh`]).
#[inline]
pub fn now() -> Instant {
    match WAKE.with(Cell::get) {
        Wake::Read(t) => t,
        w => read(w),
    }
}

/// The read behind [`now`], out of line so every caller inlines only the cached case.
#[inline(never)]
fn read(w: Wake) -> Instant {
    let t = fresh();
    if let Wake::Unread = w {
        WAKE.with(|c| c.set(Wake::Read(t)));
    }
    t
}

/// Now, read from the clock whatever the task.
#[allow(clippy::disallowed_methods)] // The one place that reads it.
pub fn fresh() -> Instant {
    Instant::now()
}

/// Runs `task` so that [`now`] reads the clock at most once per poll of it. For the tasks
/// that do a little work per wake (a client connection); never for one that spins on the
/// clock without awaiting, which would see time stand still.
pub fn per_wake<F: IntoFuture>(task: F) -> PerWake<F::IntoFuture> {
    PerWake { task: task.into_future() }
}

pin_project_lite::pin_project! {
    /// The future [`per_wake`] returns: the task, held in place (an `async fn` wrapper kept
    /// a second copy of a connection's whole state machine).
    pub struct PerWake<F> {
        #[pin]
        task: F,
    }
}

impl<F: Future> Future for PerWake<F> {
    type Output = F::Output;

    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<F::Output> {
        /// Puts back what the thread had, on return and on unwind alike.
        struct Restore(Wake);
        impl Drop for Restore {
            fn drop(&mut self) {
                WAKE.with(|w| w.set(self.0));
            }
        }
        let _restore = Restore(WAKE.with(|w| w.replace(Wake::Unread)));
        self.project().task.poll(cx)
    }
}

/// A timer that fires `after` from [`now`] (monoio's `sleep` reads the clock itself).
pub fn timer(after: Duration) -> monoio::time::Sleep {
    monoio::time::sleep_until(monoio::time::Instant::from_std(deadline(after)))
}

/// `f`, given up after `limit` from [`now`].
pub fn timeout<F: Future>(limit: Duration, f: F) -> monoio::time::Timeout<F> {
    monoio::time::timeout_at(monoio::time::Instant::from_std(deadline(limit)), f)
}

/// [`now`] + `after`, or thirty years on where that overflows (an unlimited wait).
fn deadline(after: Duration) -> Instant {
    let now = now();
    now.checked_add(after).unwrap_or_else(|| now + Duration::from_secs(86_400 * 365 * 30))
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

#[cfg(test)]
mod tests {
    use std::pin::pin;
    use std::task::{Context, Poll, Waker};

    use super::*;

    /// Reads the clock until it has moved past `t` (nanoseconds: a few reads at most).
    fn past(t: Instant) {
        while fresh() <= t {}
    }

    /// Pending once, then ready: the task's next wake.
    async fn yield_once() {
        let mut yielded = false;
        std::future::poll_fn(|_| if std::mem::replace(&mut yielded, true) { Poll::Ready(()) } else { Poll::Pending })
            .await
    }

    #[test]
    fn one_read_a_wake_inside_and_every_call_outside() {
        let task = per_wake(async {
            let a = now();
            past(a);
            assert_eq!(now(), a, "a second read in the same wake is the first one");
            yield_once().await;
            let b = now();
            assert!(b > a, "the next wake reads the clock again");
            past(b);
            assert_eq!(now(), b);
            b
        });
        let mut task = pin!(task);
        let mut cx = Context::from_waker(Waker::noop());
        assert!(task.as_mut().poll(&mut cx).is_pending());
        // Between the task's wakes the thread reads the clock each time.
        let outside = now();
        past(outside);
        assert!(now() > outside);
        let Poll::Ready(b) = task.as_mut().poll(&mut cx) else { panic!("the task ends on its second wake") };
        past(b);
        assert!(now() > b, "after the task, every call reads the clock");
    }

    #[test]
    fn a_panicking_task_leaves_the_thread_reading_the_clock() {
        let caught = std::panic::catch_unwind(|| {
            let task = pin!(per_wake(async {
                now();
                panic!("in the wake");
            }));
            let _ = task.poll(&mut Context::from_waker(Waker::noop()));
        });
        assert!(caught.is_err());
        let t = now();
        past(t);
        assert!(now() > t);
    }

    #[test]
    fn timers_and_unlimited_waits_do_not_overflow() {
        assert!(deadline(Duration::MAX) > now() + Duration::from_secs(86_400 * 365));
        let t = now();
        assert!(deadline(Duration::from_secs(5)) >= t + Duration::from_secs(5));
    }
}
