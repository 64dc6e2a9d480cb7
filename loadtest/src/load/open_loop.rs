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
    let timer = match arrivals {
        Arrivals::Trace(_) => match PreciseTimer::start() {
            Ok(t) => Some(t),
            Err(e) => {
                eprintln!("smg-load: no timer thread ({e}); trace send times fall back to the runtime's timer");
                None
            }
        },
        _ => None,
    };
    loop {
        if let (Arrivals::Trace(offsets), Some(t)) = (&arrivals, &timer) {
            next = ctx.started + trace_offset(offsets, ctx.next_global());
            t.sleep_until(next).await;
        } else if let Arrivals::Trace(offsets) = &arrivals {
            next = ctx.started + trace_offset(offsets, ctx.next_global());
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

/// Wakes the load thread at trace send times to a few tens of microseconds. The runtime's
/// timer wheel fires up to a millisecond late, and spinning for long before each deadline
/// takes a core away from the target on a small box. So a helper thread sleeps in the
/// kernel (`nanosleep` on an hrtimer) until [`SPIN_AHEAD`] before each deadline and then
/// wakes the runtime through a channel; the load thread stays parked, and keeps handling
/// responses, meanwhile. The last stretch it spends turning its runtime without blocking
/// (every turn submits and reaps I/O, so earlier sends go out and responses are read):
/// the two thread wake-ups in between cost 100-200 µs on a virtual machine whose idle
/// cores halt, and a send must not wait for them.
struct PreciseTimer {
    due: std::sync::mpsc::Sender<std::time::Instant>,
    fired: flume::Receiver<()>,
}

impl PreciseTimer {
    fn start() -> std::io::Result<Self> {
        let (due, deadlines) = std::sync::mpsc::channel::<std::time::Instant>();
        let (fire, fired) = flume::bounded(1);
        std::thread::Builder::new().name("smg-load-timer".into()).spawn(move || {
            // Ends when the load thread drops its end of either channel.
            while let Ok(at) = deadlines.recv() {
                let left = at.saturating_duration_since(std::time::Instant::now());
                if !left.is_zero() {
                    std::thread::sleep(left);
                }
                if fire.send(()).is_err() {
                    return;
                }
            }
        })?;
        Ok(Self { due, fired })
    }

    async fn sleep_until(&self, deadline: Instant) {
        let wake = deadline.checked_sub(SPIN_AHEAD).unwrap_or(deadline);
        // Closer than the round trip through the helper: spin from here.
        if wake.saturating_duration_since(Instant::now()) >= Duration::from_micros(50)
            && self.due.send(wake.into_std()).is_ok()
        {
            let _ = self.fired.recv_async().await;
        }
        while Instant::now() < deadline {
            yield_now().await;
        }
    }
}

/// How long before a trace send time the load thread is woken to spin (see [`PreciseTimer`]).
const SPIN_AHEAD: Duration = Duration::from_micros(300);

/// Lets every other ready task run and the runtime poll its I/O once, then resumes.
async fn yield_now() {
    let mut yielded = false;
    std::future::poll_fn(|cx| {
        if yielded {
            return std::task::Poll::Ready(());
        }
        yielded = true;
        cx.waker().wake_by_ref();
        std::task::Poll::Pending
    })
    .await
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
