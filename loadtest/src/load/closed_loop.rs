//! Closed loop: N connections, each sending its next request as soon as the previous answer is complete.
//!
//! Latency here is service time only; use the open loop to see queueing (coordinated omission).

use std::rc::Rc;

use monoio::time::Instant;

use crate::load::client::Conn;
use crate::load::driver::Ctx;

pub async fn run(ctx: Rc<Ctx>, concurrency: usize) {
    let handles: Vec<_> = (0..concurrency.max(1))
        .map(|_| {
            let ctx = ctx.clone();
            monoio::spawn(async move {
                let mut conn = Conn::new(ctx.plan.addr);
                conn.parse_usage = ctx.plan.parse_usage;
                loop {
                    let origin = Instant::now();
                    let Some(idx) = ctx.claim(origin) else { break };
                    ctx.send_one(&mut conn, origin, idx).await;
                }
                ctx.add_connects(conn.connects);
            })
        })
        .collect();
    for h in handles {
        h.await;
    }
}
