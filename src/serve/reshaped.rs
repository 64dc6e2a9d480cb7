//! Phase: relay, for an HTTP worker's 2xx answer the gateway rewrites as it reads it rather
//! than relaying its bytes: a pair's `/generate` answer with the prefill's logprobs merged in
//! (merged.rs), a provider's Responses answer patched and kept (provider_turn.rs). One loop
//! reads the body as its framing gives it (whole up to `--max-payload-size`, or event by
//! event), hands it to the [`Reshape`], writes what that makes, and ends the relay: the
//! worker's verdict, its connection back to the pool, `finish`'s usage.

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
use crate::shard::Shard;
use crate::workers::breaker::Verdict;

/// What a reshaping relay makes of an answer.
pub(super) trait Reshape {
    /// One SSE event (with its blank line) as the client gets it, into `out`.
    async fn event(&mut self, shard: &Shard, ctx: &RequestCtx, event: &[u8], out: &mut Vec<u8>);
    /// The whole (non-streamed) body as the client gets it.
    async fn whole(&mut self, shard: &Shard, ctx: &RequestCtx, body: Vec<u8>) -> Vec<u8>;
    /// (prompt, completion) tokens the answer reported, for `finish` (a tenant budget).
    fn usage(&self) -> (u64, u64);
}

/// How the client's response is written.
pub(super) struct Shape<'a> {
    pub streaming: bool,
    /// The worker the response names (`x-smg-routed-worker-id`); "" names none.
    pub named: &'a str,
}

/// See the module doc. Err: the worker failed before a byte reached the client (the retry
/// edge may take it elsewhere).
#[allow(clippy::too_many_arguments)]
pub(super) async fn relay(
    shard: &Shard,
    client: &mut Client,
    head: &RequestHead,
    ctx: &mut RequestCtx,
    picked: &Picked,
    answered: Answered,
    shape: Shape<'_>,
    reshape: &mut impl Reshape,
) -> Result<Outcome, WorkerError> {
    let Answered { mut conn, head: rhead } = answered;
    let worker = picked.worker();
    let date = shard.date();
    let stamp =
        Stamp { request_id: &ctx.request_id, date: &date, close: announce_close(ctx, Some(head)), http10: ctx.http10 };
    let streaming = shape.streaming;
    let mut out = Assembled::new(streaming, stamp.close, shape.named, stamp);
    let (idle, max) = (shard.cfg().upstream_read_timeout, shard.cfg().max_payload_size);
    let mut reader = BodyReader::new(&rhead);
    let mut events = Events::default();
    let (mut whole, mut sent) = (Vec::new(), Vec::new());
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
                    reshape.event(shard, ctx, e, &mut sent).await;
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
        let body = reshape.whole(shard, ctx, whole).await;
        out.whole(body);
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
    let (prompt, completion) = reshape.usage();
    let (end, stats) = out.finish(&mut client.stream, end, prompt, completion, None).await;
    Ok(Outcome::Relayed { end, stats })
}
