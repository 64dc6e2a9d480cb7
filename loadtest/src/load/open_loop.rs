//! Open loop: requests are due on a schedule (fixed gaps or Poisson arrivals) whether or not earlier ones finished.
//!
//! Each request's clock starts at its intended send time, so time spent waiting for a free
//! connection (because the target is slow) is part of its latency: coordinated omission is
//! avoided. Connections are opened on demand up to `max_conns`; beyond that, due requests queue.
//! A trace (`--trace`) gives every request its own send time instead of a rate.

use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use monoio::time::Instant;

use crate::load::client::Conn;
use crate::load::driver::Ctx;
use crate::rng::Rng;
use crate::sync::WorkQueue;

/// Arrival process.
#[derive(Clone, Debug, PartialEq)]
pub enum Arrivals {
    Fixed,
    Poisson,
    /// Request i (of the pool, in order) is due at offset i from the start of the run.
    Trace(Arc<Vec<Duration>>),
}

/// Send offset of the `i`-th request of a trace. Past its end the trace repeats, one mean gap
/// after its last request, so --requests beyond the trace's length keeps the same shape.
pub fn trace_offset(offsets: &[Duration], i: usize) -> Duration {
    let n = offsets.len().max(1);
    let last = offsets.last().copied().unwrap_or_default();
    let period = last + last / (n.saturating_sub(1).max(1) as u32);
    offsets.get(i % n).copied().unwrap_or_default() + period * (i / n) as u32
}

struct Ticket {
    origin: Instant,
    idx: usize,
}

/// Issues `rate` requests per second on this thread.
pub async fn run(ctx: Rc<Ctx>, rate: f64, arrivals: Arrivals, max_conns: usize) {
    let queue: Rc<WorkQueue<Ticket>> = WorkQueue::new();
    let mut handles = Vec::new();
    let rng = Rng::from_entropy();
    let mean_gap = 1.0 / rate.max(1e-9);
    let mut next = Instant::now();
    loop {
        if let Arrivals::Trace(offsets) = &arrivals {
            next = ctx.started + trace_offset(offsets, ctx.next_global());
            sleep_precise(next).await;
        }
        if next > Instant::now() {
            monoio::time::sleep_until(next).await;
        }
        let Some(idx) = ctx.claim(next) else { break };
        let woke = queue.push(Ticket { origin: next, idx });
        if !woke && handles.len() < max_conns.max(1) {
            let (ctx, queue) = (ctx.clone(), queue.clone());
            handles.push(monoio::spawn(async move {
                let mut conn = Conn::new(ctx.plan.addr);
                conn.parse_usage = ctx.plan.parse_usage;
                while let Some(t) = queue.pop().await {
                    ctx.send_one(&mut conn, t.origin, t.idx).await;
                }
                ctx.add_connects(conn.connects);
            }));
        }
        let gap = match arrivals {
            Arrivals::Fixed => mean_gap,
            Arrivals::Poisson => rng.exp(mean_gap),
            Arrivals::Trace(_) => continue,
        };
        next += Duration::from_secs_f64(gap);
    }
    queue.close();
    for h in handles {
        h.await;
    }
}

/// The timer wheel wakes up to a millisecond late; a trace promises its send times to better
/// than that. So sleep on the timer until 2 ms before, then yield to the runtime (which keeps
/// polling I/O in between) until the deadline: at most 2 ms of busy waiting per request, and
/// none when requests are closer together than that.
async fn sleep_precise(deadline: Instant) {
    const SPIN: Duration = Duration::from_millis(2);
    if let Some(coarse) = deadline.checked_sub(SPIN) {
        if coarse > Instant::now() {
            monoio::time::sleep_until(coarse).await;
        }
    }
    while Instant::now() < deadline {
        YieldNow(false).await;
    }
}

/// Returns Pending once (waking itself), so other tasks and I/O completions run first.
struct YieldNow(bool);

impl std::future::Future for YieldNow {
    type Output = ();
    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<()> {
        if self.0 {
            return std::task::Poll::Ready(());
        }
        self.0 = true;
        cx.waker().wake_by_ref();
        std::task::Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trace_offsets_repeat_after_the_end() {
        let ms = Duration::from_millis;
        let o = [ms(0), ms(10), ms(40)];
        assert_eq!(trace_offset(&o, 2), ms(40));
        // Period: last offset plus the mean gap (20 ms).
        assert_eq!(trace_offset(&o, 3), ms(60));
        assert_eq!(trace_offset(&o, 7), ms(130));
    }
}
