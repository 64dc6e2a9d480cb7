//! Phase: relay, for a pair's SGLang `/generate` answer asked with `return_logprob`: the
//! decode's answer with the prefill's prompt log-probabilities in front of its own
//! (src/pair/logprobs.rs), written by the gateway as it reads it, a streamed answer event
//! by event. Every other pair answer is relayed as any worker's (upstream.rs).

use super::client::Client;
use super::ctx::{Picked, RequestCtx};
use super::error::WorkerError;
use super::finish::{announce_close, Outcome};
use super::pair::Merge;
use super::upstream::Answered;
use super::whole::BodyReader;
use crate::contract::json::{self, Kind};
use crate::http::assembled::Assembled;
use crate::http::head::RequestHead;
use crate::http::relay::RelayEnd;
use crate::http::respond::Stamp;
use crate::pair::logprobs::{merge, merge_event, Events};
use crate::shard::Shard;
use crate::workers::breaker::Verdict;

/// See the module doc. Err: the decode failed before a byte
/// reached the client (the retry edge may take it elsewhere).
pub async fn relay(
    shard: &Shard,
    client: &mut Client,
    head: &RequestHead,
    ctx: &mut RequestCtx,
    picked: &Picked,
    answered: Answered,
    wanted: &Merge,
) -> Result<Outcome, WorkerError> {
    let items = &wanted.items[..];
    let Answered { mut conn, head: rhead } = answered;
    let worker = picked.worker();
    let date = shard.date();
    let stamp =
        Stamp { request_id: &ctx.request_id, date: &date, close: announce_close(ctx, Some(head)), http10: ctx.http10 };
    // `/generate` is not read by the contract: the body said whether it streams.
    let streaming = wanted.streamed;
    let mut out = Assembled::new(streaming, stamp.close, &worker.url.url, stamp);
    let idle = shard.cfg().upstream_read_timeout;
    let mut reader = BodyReader::new(&rhead);
    let mut events = Events::default();
    let (mut whole, mut sent) = (Vec::new(), Vec::new());
    // The engine's counts, for a tenant budget (the last event's, streamed).
    let mut usage = (0, 0);
    let end = loop {
        match reader.next(&mut conn, &rhead, idle).await {
            Ok(Some(piece)) if !streaming => {
                whole.extend_from_slice(piece);
                if whole.len() > shard.cfg().max_payload_size {
                    let max = shard.cfg().max_payload_size;
                    let cause = super::error::WorkerCause::TooLarge { len: whole.len() as u64, max };
                    return Err(WorkerError::new(cause, conn.reused));
                }
            }
            Ok(Some(piece)) => {
                events.push(piece);
                sent.clear();
                while let Some(e) = events.next_event() {
                    usage = counts(e.strip_prefix(b"data: ").unwrap_or(e)).unwrap_or(usage);
                    merge_event(e, items, &mut sent);
                }
                if !out.send(&mut client.stream, &sent).await {
                    return Ok(Outcome::ClientGone);
                }
            }
            Ok(None) => break RelayEnd::Done { reusable: reader.reusable() },
            Err(cause) if out.head_sent() => {
                let why = match cause {
                    super::error::WorkerCause::BadBody(why) => why,
                    _ => "the worker's answer ended early",
                };
                break RelayEnd::Worker { why, sent: true };
            }
            Err(cause) => return Err(WorkerError::new(cause, conn.reused)),
        }
    };
    if !streaming {
        usage = counts(&whole).unwrap_or(usage);
        let mut merged = Vec::with_capacity(whole.len() + items.len() + 1);
        if !merge(&whole, items, &mut merged) {
            merged = whole;
        }
        out.whole(merged);
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

/// `meta_info.prompt_tokens` and `completion_tokens` of one answer or event.
fn counts(doc: &[u8]) -> Option<(u64, u64)> {
    let doc = json::parse(doc.trim_ascii()).ok()?;
    if doc.kind(0) != Kind::Object {
        return None;
    }
    let meta = doc.get(0, "meta_info")?;
    let n = |k: &str| doc.get(meta, k).filter(|&v| doc.kind(v) == Kind::Number).map(|v| doc.number(v) as u64);
    Some((n("prompt_tokens")?, n("completion_tokens").unwrap_or(0)))
}
