//! Phase: attempt, on a prefill/decode pair: pick chose a decode worker and its prefill
//! leg; this is one attempt of the upstream loop (forward.rs), ending, like an HTTP
//! attempt, in the decode's response head (relayed as any worker's) or a [`WorkerError`].
//! A failure on the prefill leg says so (`WorkerError::on`), so the loop judges, avoids and
//! reports the prefill worker, not the decode.
//!
//! - SGLang prefill: both legs at once, the same body with the bootstrap fields
//!   (pair/bootstrap.rs). A leg that cannot be reached or breaks before its head ends the
//!   attempt and drops the other (its connection closes): an unreachable prefill does not
//!   leave the decode waiting for KV that never comes. A prefill answering non-2xx fails the
//!   attempt with its status and message, whatever the decode answered (a decode answers
//!   500 when its KV never comes: the prefill's failure is the cause, and is retried). With
//!   both heads in, the prefill's answer is read whole (its connection pooled) and the
//!   decode's, 2xx or not, is the answer.
//!   On `/generate` with `return_logprob`, the prefill's prompt log-probabilities go
//!   with the decode's answer to its relay (serve/merged.rs).
//! - vLLM prefill (pair/nixl.rs): the prefill first, alone, read whole; then the decode
//!   with the prefill's `kv_transfer_params`.

use std::pin::pin;

use super::client::Client;
use super::ctx::{Picked, RequestCtx};
use super::error::{Failure, WorkerCause, WorkerError};
use super::upstream::{
    await_head, give_head_buffer, head_buffer, head_failed, open_to, upstream_head, Answered, AttemptError,
};
use super::whole::read_whole;
use crate::api::{ApiError, EndpointSpec};
use crate::contract;
use crate::http::body::Body;
use crate::http::head::RequestHead;
use crate::http::pool::UpstreamConn;
use crate::http::response_head::{read_response_head, ResponseHead};
use crate::io::Writev2;
use crate::pair::bootstrap::{self, Bootstrap};
use crate::pair::{bootstrap_host, logprobs, nixl, PairRoute, Unsplicable};
use crate::shard::Shard;
use crate::trace::SpanIds;
use crate::workers::breaker::Verdict;
use crate::workers::snapshot::{Role, Runtime};
use crate::workers::Worker;

/// The route as a pair serves it; None for any other (pick sends no other to a pair).
pub fn pair_route(spec: &EndpointSpec) -> Option<PairRoute> {
    match spec.schema {
        Some(contract::Endpoint::ChatCompletions) => Some(PairRoute::Chat),
        Some(contract::Endpoint::Completions) => Some(PairRoute::Completions),
        _ if spec.path == super::grpc::GENERATE => Some(PairRoute::Generate),
        _ => None,
    }
}

/// See the module doc. `fresh`: both legs skip the pool (a pooled socket proved stale).
#[allow(clippy::too_many_arguments)]
pub async fn attempt(
    shard: &Shard,
    client: &Client,
    head: &RequestHead,
    ctx: &mut RequestCtx,
    spec: &EndpointSpec,
    picked: &Picked,
    body: &Body,
    fresh: bool,
    watch: &mut bool,
) -> Result<(Answered, Option<Merge>), AttemptError> {
    let Some(prefill) = picked.prefill() else { unreachable!("a pair attempt has its prefill") };
    let Some(route) = pair_route(spec) else { unreachable!("pick sends pairs generation only") };
    let sent = body.bytes(&client.buf);
    let unsplicable = |e: Unsplicable| AttemptError::Failed(Failure::Rejected(ApiError::bad_request(e.0)));
    if prefill.meta.runtime == Runtime::Vllm {
        let mut p_body = Vec::with_capacity(sent.len() + 192);
        nixl::prefill_body(sent, &mut p_body).map_err(unsplicable)?;
        let span = ctx.span.as_ref().map(|(ids, _)| *ids);
        let (conn, h) = prefill_leg(shard, client, head, span, prefill, p_body, fresh, Some(watch)).await?;
        let (conn, h) = check_prefill(prefill, conn, h, shard).await?;
        let answer = prefill_answer(shard, ctx, prefill, conn, h).await?;
        ctx.prefill_slot = None;
        let mut d_body = Vec::with_capacity(sent.len() + 256);
        match nixl::returned_params(&answer) {
            Some(params) => nixl::decode_body(sent, params, &mut d_body).map_err(unsplicable)?,
            // A prefill engine without a KV connector: the decode computes the prompt itself.
            None => d_body.extend_from_slice(sent),
        }
        return Ok((decode_leg(shard, client, head, ctx, picked.worker(), d_body, fresh, watch).await?, None));
    }
    let Role::Prefill { bootstrap_port } = prefill.meta.role else { unreachable!("picked as a prefill worker") };
    let to = Bootstrap { host: bootstrap_host(&prefill.url.authority), port: bootstrap_port };
    let mut d_body = Vec::with_capacity(sent.len() + 128);
    bootstrap::splice(sent, route, to, || shard.next_random(), &mut d_body).map_err(unsplicable)?;
    let p_body = d_body.clone();
    if let Some(rank) = prefill.meta.dp_rank {
        bootstrap::tell_prefill_rank(&mut d_body, rank);
    }
    let span = ctx.span.as_ref().map(|(ids, _)| *ids);
    let ((conn, h), answered) = {
        let mut p_leg = pin!(prefill_leg(shard, client, head, span, prefill, p_body, fresh, None));
        let mut d_leg = pin!(decode_leg(shard, client, head, ctx, picked.worker(), d_body, fresh, watch));
        monoio::select! {
            p = &mut p_leg => {
                let (conn, h) = p?;
                let checked = check_prefill(prefill, conn, h, shard).await?;
                (checked, d_leg.as_mut().await?)
            }
            d = &mut d_leg => {
                // Whatever the decode said, a prefill that failed is the cause (a decode
                // answers 500 when the KV never comes): its failure wins, and is retried.
                let answered = d?;
                let (conn, h) = p_leg.as_mut().await?;
                (check_prefill(prefill, conn, h, shard).await?, answered)
            }
        }
    };
    let answer = prefill_answer(shard, ctx, prefill, conn, h).await?;
    // The prefill leg is over: its place among the prefill's legs in flight goes back.
    ctx.prefill_slot = None;
    // SGLang's prompt log-probabilities are the prefill's: merged into the decode's answer.
    let merge =
        route == PairRoute::Generate && (200..300).contains(&answered.head.status) && flag(sent, "return_logprob");
    let merge = merge.then(|| logprobs::prefill_items(&answer)).flatten();
    Ok((answered, merge.map(|items| Merge { items, streamed: flag(sent, "stream") })))
}

/// What the relay of a pair's answer merges in: the prefill's prompt log-probabilities, into
/// an SSE answer (`streamed`) or a JSON one.
pub struct Merge {
    pub items: Vec<u8>,
    pub streamed: bool,
}

/// The body sets `key` to true.
fn flag(body: &[u8], key: &str) -> bool {
    let Ok(doc) = contract::json::parse(body) else { return false };
    doc.kind(0) == contract::json::Kind::Object
        && doc.get(0, key).is_some_and(|v| doc.kind(v) == contract::json::Kind::Bool && doc.node(v).flag)
}

/// The prefill leg: its head and `body` written, its response head read. The client is
/// watched only when `watch` is given (the leg runs alone); beside the decode leg, that
/// leg watches.
#[allow(clippy::too_many_arguments)]
async fn prefill_leg(
    shard: &Shard,
    client: &Client,
    head: &RequestHead,
    span: Option<SpanIds>,
    prefill: &Worker,
    body: Vec<u8>,
    fresh: bool,
    watch: Option<&mut bool>,
) -> Result<(UpstreamConn, ResponseHead), AttemptError> {
    let on = |e: AttemptError| match e {
        AttemptError::Failed(Failure::Worker(w)) => AttemptError::Failed(Failure::Worker(w.on(prefill))),
        other => other,
    };
    let mut conn = send(shard, client, head, span.as_ref(), prefill, body, fresh).await.map_err(on)?;
    let reused = conn.reused;
    let mut unwatched = false;
    let watch = watch.unwrap_or(&mut unwatched);
    match read_response_head(&mut conn, &client.stream, watch, shard.cfg().request_timeout).await {
        Ok(h) => Ok((conn, h)),
        Err(e) => Err(on(head_failed(e, reused))),
    }
}

/// The decode leg: its head and `body` written, its response head awaited as any HTTP
/// attempt's is.
#[allow(clippy::too_many_arguments)]
async fn decode_leg(
    shard: &Shard,
    client: &Client,
    head: &RequestHead,
    ctx: &mut RequestCtx,
    decode: &Worker,
    body: Vec<u8>,
    fresh: bool,
    watch: &mut bool,
) -> Result<Answered, AttemptError> {
    let span = ctx.span.as_ref().map(|(ids, _)| *ids);
    let conn = send(shard, client, head, span.as_ref(), decode, body, fresh).await?;
    await_head(shard, client, ctx, conn, watch).await
}

/// A connection to `worker` with the request head for it and `body` written.
async fn send(
    shard: &Shard,
    client: &Client,
    head: &RequestHead,
    span: Option<&SpanIds>,
    worker: &Worker,
    body: Vec<u8>,
    fresh: bool,
) -> Result<UpstreamConn, AttemptError> {
    let mut up_head = head_buffer();
    let skip = upstream_head(
        &mut up_head,
        head,
        &client.buf,
        &worker.url.authority,
        &body,
        body.len(),
        span,
        &worker.meta,
        None,
        &shard.cfg().auth,
    );
    let mut conn = open_to(shard, worker, fresh).await?;
    let n = body.len();
    let (res, up_head, _) = Writev2::write(&mut conn.stream, up_head, body, skip, n).await;
    give_head_buffer(up_head);
    match res {
        Ok(()) => Ok(conn),
        Err(e) => Err(WorkerError::new(WorkerCause::Write(e), conn.reused).into()),
    }
}

/// A prefill head that is not 2xx fails the attempt with the prefill's status and message.
async fn check_prefill(
    prefill: &Worker,
    mut conn: UpstreamConn,
    h: ResponseHead,
    shard: &Shard,
) -> Result<(UpstreamConn, ResponseHead), AttemptError> {
    if (200..300).contains(&h.status) {
        return Ok((conn, h));
    }
    let (max, idle) = (shard.cfg().max_payload_size, shard.cfg().upstream_read_timeout);
    let message = match read_whole(&mut conn, &h, max, idle).await {
        Ok((body, _)) => error_message(&body),
        Err(cause) => cause.to_string(),
    };
    Err(WorkerError::new(WorkerCause::Prefill { status: h.status, message }, conn.reused).on(prefill).into())
}

/// A 2xx prefill answer (past [`check_prefill`]), read whole: the worker is judged by it,
/// the connection pooled when clean. The body is what the decode may need from it.
async fn prefill_answer(
    shard: &Shard,
    ctx: &mut RequestCtx,
    prefill: &Worker,
    mut conn: UpstreamConn,
    h: ResponseHead,
) -> Result<Vec<u8>, AttemptError> {
    let (max, idle) = (shard.cfg().max_payload_size, shard.cfg().upstream_read_timeout);
    match read_whole(&mut conn, &h, max, idle).await {
        Ok((body, reusable)) => {
            ctx.judge(prefill.id, Verdict::of_status(h.status));
            if reusable {
                conn.buf.clear();
                shard.put_conn(prefill.id, conn);
            }
            Ok(body)
        }
        Err(cause) => Err(WorkerError::new(cause, conn.reused).on(prefill).into()),
    }
}

/// The message of an engine's error body: OpenAI's `error.message`, SGLang's `message`, or
/// the body itself.
fn error_message(body: &[u8]) -> String {
    let text = || String::from_utf8_lossy(body).into_owned();
    let Ok(doc) = contract::json::parse(body) else { return text() };
    let error = doc.get(0, "error").filter(|&e| doc.kind(e) == contract::json::Kind::Object);
    let message = error.and_then(|e| doc.get(e, "message")).or_else(|| doc.get(0, "message"));
    match message.filter(|&m| doc.kind(m) == contract::json::Kind::String) {
        Some(m) => doc.str(m).into_owned(),
        None => text(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_engine_error_says_its_message() {
        assert_eq!(error_message(br#"{"error":{"message":"bad prompt","code":400}}"#), "bad prompt");
        assert_eq!(error_message(br#"{"object":"error","message":"too long"}"#), "too long");
        assert_eq!(error_message(b"Internal Server Error"), "Internal Server Error");
    }
}
