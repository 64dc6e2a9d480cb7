//! Open loop: requests are due on a schedule (fixed gaps or Poisson arrivals) whether or not earlier ones finished.
//!
//! Each request's clock starts at its intended send time, so time spent waiting for a free
//! connection (because the target is slow) is part of its latency: coordinated omission is
//! avoided. Connections are opened on demand up to `max_conns`; beyond that, due requests queue.

use std::rc::Rc;
use std::time::Duration;

use monoio::time::Instant;

use crate::load::client::Conn;
use crate::load::driver::Ctx;
use crate::rng::Rng;
use crate::sync::WorkQueue;

/// Arrival process.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Arrivals {
    Fixed,
    Poisson,
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
        };
        next += Duration::from_secs_f64(gap);
    }
    queue.close();
    for h in handles {
        h.await;
    }
}
