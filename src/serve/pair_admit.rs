//! Phase: admit, per role, on a prefill/decode pair: after pick, before each pair attempt
//! (forward.rs). The pools are admission/pd.rs's, exact gateway-wide.
//!
//! 1. The decode. A worker that reports a running window (`max_running_requests`) gives
//!    the pair a slot in it, held until the request ends (`ctx.decode_slot`). None free:
//!    the pair waits up to `--pd-admission-wait-secs`, then is shed with 503
//!    `worker_overload_protection_shed` (`Retry-After`: `--load-monitor-interval`).
//! 2. The prefill, with `--prefill-max-inflight-requests-per-worker`: a place among the
//!    prefill worker's legs in flight, held until the prefill leg ends (`ctx.prefill_slot`,
//!    which the attempt gives back). None free: the pair takes a place in the prefill queue
//!    and waits up to `--prefill-queue-timeout-secs` (429 `pd_prefill_queue_timeout`); no
//!    place left, or no queue: 429 `pd_prefill_queue_full`.
//!
//! The decode comes first, so a pair waiting for its decode holds no prefill slot that
//! another pair could use. A shed is the gateway's decision: not retried, and nothing is
//! sent to either worker.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use super::client::Client;
use super::ctx::{Picked, RequestCtx};
use super::error::Failure;
use super::finish::Outcome;
use super::queue_wait::queue_wait;
use crate::admission::permits::Permits;
use crate::admission::permits::{Admit, Pool, Ticket};
use crate::admission::Permit;
use crate::api::ApiError;
use crate::shard::Shard;

/// See the module doc. Nothing to do for a request to one worker.
pub(super) async fn admit(
    shard: &Shard,
    client: &Client,
    ctx: &mut RequestCtx,
    picked: &Picked,
) -> Result<(), Outcome> {
    let Some(prefill) = picked.prefill() else { return Ok(()) };
    let pools = shard.pd_pools();
    let cfg = *pools.config();
    // A retry's pair: the last attempt's slots go back first.
    ctx.decode_slot = None;
    ctx.prefill_slot = None;
    // Without a queue, the peers' answers bound the wait (they always come).
    let no_queue_bound = shard.cfg().request_timeout;
    let decode = picked.worker();
    if let Some(cap) = decode.max_running.filter(|&n| n > 0) {
        let pool = pools.pool(Pool::Decode { worker: decode.id, cap: cap.min(u64::from(u32::MAX)) as u32 });
        let limit = if cfg.decode_wait.is_zero() { no_queue_bound } else { cfg.decode_wait };
        match take(&pool, client, limit, || {
            crate::debug!("request {}: waiting for a decode slot on {}", ctx.id_str(), decode.url.url);
        })
        .await?
        {
            Some(slot) => ctx.decode_slot = Some(slot),
            None => {
                let secs = shard.cfg().load_interval.as_secs();
                return Err(reject(ApiError::pd_decode_shed(&decode.url.url, secs)));
            }
        }
    }
    if cfg.prefill_inflight == 0 {
        return Ok(());
    }
    let pool = pools.pool(Pool::Prefill(prefill.id));
    let ticket = match Permits::admit(&pool) {
        Admit::Now => {
            ctx.prefill_slot = Some(Permit::new(&pool));
            return Ok(());
        }
        Admit::Full => return Err(reject(ApiError::pd_prefill_queue_full())),
        Admit::Queued(t) => t,
    };
    if cfg.prefill_queue == 0 {
        // A free slot on another shard, or 429.
        return match queue_wait(client, no_queue_bound, || Permits::wait(&ticket)).await? {
            Some(true) => {
                ctx.prefill_slot = Some(held(ticket, &pool));
                Ok(())
            }
            _ => Err(reject(ApiError::pd_prefill_queue_full())),
        };
    }
    // Waiting takes one of the queue's places, gateway-wide, given back when the wait ends.
    let queued = crate::clock::now();
    let place = take(&pools.pool(Pool::PrefillQueue), client, no_queue_bound, || {}).await?;
    if place.is_none() && !ticket.granted() {
        return Err(reject(ApiError::pd_prefill_queue_full()));
    }
    // (A pair granted a peer's free slot meanwhile held its place for that moment only.)
    if !ticket.granted() {
        crate::debug!("request {}: waiting in the prefill queue for {}", ctx.id_str(), prefill.url.url);
    }
    let left = cfg.prefill_queue_timeout.saturating_sub(queued.elapsed());
    match queue_wait(client, left, || Permits::wait(&ticket)).await? {
        Some(true) => {
            ctx.prefill_slot = Some(held(ticket, &pool));
            Ok(())
        }
        Some(false) => Err(reject(ApiError::pd_prefill_queue_full())),
        None => Err(reject(ApiError::pd_prefill_queue_timeout(queued.elapsed()))),
    }
}

/// A permit of `pool`: at once, or within `limit` (`waits` is told when it must wait);
/// None when refused or out of time.
async fn take(
    pool: &Rc<RefCell<Permits>>,
    client: &Client,
    limit: Duration,
    waits: impl FnOnce(),
) -> Result<Option<Permit>, Outcome> {
    let ticket = match Permits::admit(pool) {
        Admit::Now => return Ok(Some(Permit::new(pool))),
        Admit::Full => return Ok(None),
        Admit::Queued(t) => t,
    };
    waits();
    Ok(match queue_wait(client, limit, || Permits::wait(&ticket)).await? {
        Some(true) => Some(held(ticket, pool)),
        _ => None,
    })
}

fn held(ticket: Ticket, pool: &Rc<RefCell<Permits>>) -> Permit {
    ticket.into_held();
    Permit::new(pool)
}

fn reject(e: ApiError) -> Outcome {
    Outcome::Failed(Failure::Rejected(e))
}
