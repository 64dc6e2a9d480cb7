//! Phase: relay, for a Responses turn on a cloud provider that keeps no state for the
//! gateway (src/responses/provider_turn.rs): the provider's 2xx answer read as it comes,
//! its response object patched to say what the client asked and what was kept, and kept in
//! the history store before the client is told it is. A non-streamed answer is read whole
//! (up to `--max-payload-size`); a streamed one is written event by event, the store written
//! before the event that ends it (`response.completed` / `.incomplete`) goes out. Any other
//! answer of the provider's is relayed as it came (upstream.rs).

use super::client::Client;
use super::ctx::{Picked, RequestCtx};
use super::error::{WorkerCause, WorkerError};
use super::finish::{announce_close, Outcome};
use super::upstream::Answered;
use super::whole::BodyReader;
use crate::http::assembled::Assembled;
use crate::http::head::RequestHead;
use crate::http::relay::RelayEnd;
use crate::http::respond::Stamp;
use crate::pair::logprobs::Events;
use crate::responses::provider_turn::{Answer, Ends, ProviderTurn};
use crate::shard::Shard;
use crate::workers::breaker::Verdict;

/// See the module doc. Err: the provider failed before a byte reached the client (the retry
/// edge may take it elsewhere).
pub async fn relay(
    shard: &Shard,
    client: &mut Client,
    head: &RequestHead,
    ctx: &mut RequestCtx,
    picked: &Picked,
    answered: Answered,
    turn: &ProviderTurn,
) -> Result<Outcome, WorkerError> {
    let Answered { mut conn, head: rhead } = answered;
    let worker = picked.worker();
    let date = shard.date();
    let stamp =
        Stamp { request_id: &ctx.request_id, date: &date, close: announce_close(ctx, Some(head)), http10: ctx.http10 };
    let streaming = turn.stream;
    // A Responses answer does not name its worker (SMG's rule).
    let mut out = Assembled::new(streaming, stamp.close, "", stamp);
    let idle = shard.cfg().upstream_read_timeout;
    let max = shard.cfg().max_payload_size;
    let mut reader = BodyReader::new(&rhead);
    let mut events = Events::default();
    let (mut whole, mut sent) = (Vec::new(), Vec::new());
    let mut usage = (0, 0);
    let end = loop {
        match reader.next(&mut conn, &rhead, idle).await {
            Ok(Some(piece)) if !streaming => {
                whole.extend_from_slice(piece);
                if whole.len() > max {
                    let cause = WorkerCause::TooLarge { len: whole.len() as u64, max };
                    return Err(WorkerError::new(cause, conn.reused));
                }
            }
            Ok(Some(piece)) => {
                events.push(piece);
                sent.clear();
                while let Some(e) = events.next_event() {
                    match (ProviderTurn::ends(e), ProviderTurn::event_object(e)) {
                        (Some(Ends::Kept), Some(r)) => {
                            let answer = turn.answer(&e[r.clone()]);
                            usage = answer.usage;
                            sent.extend_from_slice(&e[..r.start]);
                            sent.extend_from_slice(&kept(shard, ctx, turn, &e[r.clone()], answer).await);
                            sent.extend_from_slice(&e[r.end..]);
                        }
                        (Some(_), _) => turn.patch_event(e, false, &mut sent),
                        (None, _) => turn.patch_event(e, turn.store, &mut sent),
                    }
                }
                if !out.send(&mut client.stream, &sent).await {
                    return Ok(Outcome::ClientGone);
                }
            }
            Ok(None) => break RelayEnd::Done { reusable: reader.reusable() },
            Err(cause) if out.head_sent() => {
                let why = match cause {
                    WorkerCause::BadBody(why) => why,
                    _ => "the worker's answer ended early",
                };
                break RelayEnd::Worker { why, sent: true };
            }
            Err(cause) => return Err(WorkerError::new(cause, conn.reused)),
        }
    };
    if !streaming {
        let answer = turn.answer(&whole);
        usage = answer.usage;
        out.whole(kept(shard, ctx, turn, &whole, answer).await);
    } else if !events.rest().is_empty() {
        let rest = events.rest().to_vec();
        out.send(&mut client.stream, &rest).await;
    }
    let verdict = match end {
        RelayEnd::Worker { .. } => Verdict::Failure,
        _ => Verdict::Success,
    };
    ctx.judge(worker.id, verdict);
    if let RelayEnd::Done { reusable: true } = end {
        conn.buf.clear();
        shard.put_conn(worker.id, conn);
    }
    let (end, stats) = out.finish(&mut client.stream, end, usage.0, usage.1, None).await;
    Ok(Outcome::Relayed { end, stats })
}

/// Keeps the provider's response `object` (read as `answer`; the turn appended to its
/// conversation): the object as the client gets it, saying it is stored only when it is.
async fn kept(shard: &Shard, ctx: &RequestCtx, turn: &ProviderTurn, object: &[u8], answer: Answer) -> Vec<u8> {
    let Some(ops) = answer.ops else {
        crate::warn!("request {}: the provider's response is not a JSON object with an id (or nests past 128 levels); not stored", ctx.id_str());
        return turn.patched(object, false);
    };
    for op in ops {
        if let Err(e) = shard.history().write(op).await {
            crate::warn!("request {}: the provider's response not stored: {}", ctx.id_str(), e.0);
            return turn.patched(object, false);
        }
    }
    answer.text
}
