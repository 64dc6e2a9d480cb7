//! Chat Completions and Completions on a gRPC worker: the branch `forward` takes when the
//! picked worker is `grpc://`. The contract already validated the body; here it is parsed
//! once, rendered and tokenized with the worker's model (src/grpc/request.rs), sent as
//! Generate calls on the shard's h2 connection, and answered with OpenAI JSON or SSE the
//! gateway assembles (src/grpc/reply.rs), detokenizing incrementally and matching stop
//! strings on the decoded text.
//!
//! Until the first engine message nothing is written to the client: an engine refusal is
//! `start_generation_failed` with the engine's status mapped, retried on another worker
//! when that status is retryable (as for HTTP workers). After it, a failure is the
//! contract's stream error event then `[DONE]`. A client that leaves mid-generation gets
//! its engine requests aborted at once (Abort RPC, and the stream reset).

use std::rc::Rc;
use std::sync::Arc;

use bytes::Bytes;
use h2::client::SendRequest;
use monoio::net::TcpStream;
use smg_proto::paths::sglang_scheduler as path;
use smg_proto::scheduler::{
    generate_response, AbortRequest, AbortResponse, GenerateRequest, GenerateResponse, TokenizedInput,
};
use smg_wire::num::put_hex_width;

use super::client::Client;
use super::ctx::RequestCtx;
use super::error::Failure;
use super::finish::{announce_close, Outcome};
use super::pick::pick_worker;
use crate::api::{ApiError, EndpointSpec};
use crate::contract::Endpoint;
use crate::grpc::conn::{self, Call, Limits};
use crate::grpc::logprobs::{self, Entry, Offset};
use crate::grpc::model::GrpcModel;
use crate::grpc::reply::{self, Choice, ChunkUsage, Delta, Meta, Usage};
use crate::grpc::request::{self, Kind, Prepared};
use crate::grpc::stop::StopMatcher;
use crate::grpc::wire::{self, Code, Status};
use crate::http::body::Body;
use crate::http::head::RequestHead;
use crate::http::relay::{RelayEnd, RelayStats};
use crate::http::respond::{header_line, status_line, Stamp};
use crate::http::usage::UsageScan;
use crate::io::{peer_closed, write_all};
use crate::shard::Shard;
use crate::tokenizer::IncrementalDecoder;
use crate::workers::breaker::Verdict;
use crate::workers::WorkerId;

/// The worker a call went to.
struct Target {
    id: WorkerId,
    /// `--dp-aware`: the data-parallel rank this worker entry stands for.
    dp_rank: Option<u32>,
    url: String,
    authority: String,
    send: SendRequest<Bytes>,
}

/// Engine calls that have produced their first message.
struct Started {
    calls: Vec<(String, Call, Option<GenerateResponse>)>,
}

/// A request prepared before pick, so a text policy routes on its token ids.
pub struct Early {
    doc: sonic_rs::Value,
    model: Arc<GrpcModel>,
    prepared: Prepared,
}

impl Early {
    /// The first engine request's prompt.
    pub fn tokens(&self) -> &[u32] {
        self.prepared.prompts.first().map(Vec::as_slice).unwrap_or(&[])
    }
}

/// With `cache_aware` or `prefix_hash` and a gRPC worker serving the model, renders and
/// tokenizes with that worker's model before pick. None when nothing calls for it or it
/// fails (the request is then prepared after pick and refused there).
pub fn early(shard: &Shard, spec: &EndpointSpec, ctx: &RequestCtx, body: &[u8]) -> Option<Early> {
    if !shard.cfg().routing.policy.uses_text() {
        return None;
    }
    let kind = match spec.schema {
        Some(Endpoint::ChatCompletions) => Kind::Chat,
        Some(Endpoint::Completions) => Kind::Completions,
        _ => return None,
    };
    let snap = shard.snapshot();
    let serves = |w: &&crate::workers::Worker| ctx.model.is_none() || w.model == ctx.model;
    let model = snap.workers.iter().filter(serves).find(|w| w.healthy).and_then(|w| w.meta.grpc.clone())?;
    let doc: sonic_rs::Value = sonic_rs::from_slice(body).ok()?;
    let prepared = request::prepare(kind, &doc, &model).ok()?;
    Some(Early { doc, model, prepared })
}

/// From pick (a gRPC worker chosen) to the end of the response, with the retry edge back to
/// pick while nothing has reached the client.
// The phases' shared state, passed as the other phases take it.
#[allow(clippy::too_many_arguments)]
pub async fn forward(
    shard: &Rc<Shard>,
    client: &mut Client,
    head: &RequestHead,
    ctx: &mut RequestCtx,
    spec: &EndpointSpec,
    body: &Body,
    failed_on: &mut Vec<WorkerId>,
    early: Option<Early>,
) -> Outcome {
    let kind = match spec.schema {
        Some(Endpoint::ChatCompletions) => Kind::Chat,
        Some(Endpoint::Completions) => Kind::Completions,
        _ => {
            let msg = format!("{} is not served by gRPC workers", spec.path);
            return reject(ApiError::new(501, "endpoint_not_supported_on_grpc", msg));
        }
    };
    let (doc, mut prepared) = match early {
        Some(e) => (e.doc, Some((e.model, e.prepared))),
        None => match sonic_rs::from_slice(body.bytes(&client.buf)) {
            Ok(v) => (v, None),
            Err(e) => return reject(ApiError::bad_request(format!("request body: {e}"))),
        },
    };
    let mut id = response_id(shard, spec.id_prefix);
    loop {
        let worker = ctx.chosen.as_ref().expect("picked").worker();
        let Some(model) = worker.meta.grpc.clone() else {
            return reject(ApiError::no_available_workers(ctx.model.as_deref()));
        };
        let (wid, addr, dp_rank) = (worker.id, worker.url.addr, worker.meta.dp_rank);
        let (url, authority) = (worker.url.url.clone(), worker.url.authority.clone());
        // Prepared once per model: another worker of the same model reuses it.
        if !prepared.as_ref().is_some_and(|(m, _)| Arc::ptr_eq(m, &model)) {
            match request::prepare(kind, &doc, &model) {
                Ok(p) => prepared = Some((Arc::clone(&model), p)),
                Err(e) => return reject(e),
            }
        }
        let (model, prep) = prepared.as_ref().expect("prepared");
        ctx.attempts += 1;
        let started = match shard.grpc().ready(wid, addr).await {
            Ok(send) => {
                let mut target = Target { id: wid, dp_rank, url, authority, send };
                let limits = Limits {
                    deadline: Some(
                        ctx.timings.upstream_started.unwrap_or(ctx.timings.started) + shard.cfg().request_timeout,
                    ),
                    idle: Some(shard.cfg().upstream_read_timeout),
                };
                match start(&mut target, client, prep, &id, limits).await {
                    Ok(Some(s)) => Ok((target, s)),
                    Ok(None) => return Outcome::ClientGone,
                    Err(s) => Err(s),
                }
            }
            Err(s) => Err(s),
        };
        let status = match started {
            Ok((target, s)) => {
                return respond(shard, client, head, ctx, kind, model, prep, &id, target, s).await;
            }
            Err(s) => s,
        };
        let http = wire::http_status(status.code);
        // Invalid arguments are the request's fault: not counted against the worker.
        let verdict = if http == 400 { Verdict::Success } else { Verdict::of_status(http) };
        shard.record_outcome(wid, verdict);
        if status.message.starts_with("transport") || status.message.starts_with("connect") {
            shard.grpc().forget(wid);
        }
        let retryable = crate::retry::retryable_status(http) && may_retry(shard, ctx);
        if !retryable {
            ctx.retries_exhausted = crate::retry::retryable_status(http) && shard.cfg().retry.is_some();
            return reject(start_failed(&status));
        }
        crate::debug!("request {}: gRPC worker {}: {status}; retrying", ctx.id_str(), ctx.worker_url());
        failed_on.push(wid);
        ctx.chosen = None;
        let policy = shard.cfg().retry.expect("may_retry");
        let unit = (shard.next_random() >> 11) as f64 / (1u64 << 53) as f64;
        crate::io::sleep(policy.backoff(u32::from(ctx.attempts) + 1, unit)).await;
        let tokens = prepared.as_ref().and_then(|(_, p)| p.prompts.first()).map(Vec::as_slice);
        let picked = pick_worker(shard, spec, head, &client.buf, body.bytes(&client.buf), ctx, failed_on, tokens);
        if let Err(f) = picked {
            return Outcome::Failed(f);
        }
        if !ctx.chosen.as_ref().expect("picked").worker().url.grpc {
            return reject(start_failed(&status));
        }
        // A new engine request id per attempt: the failed one may still be known there.
        id = response_id(shard, spec.id_prefix);
    }
}

fn may_retry(shard: &Shard, ctx: &RequestCtx) -> bool {
    shard.cfg().retry.is_some_and(|p| u32::from(ctx.attempts) < p.max_attempts)
}

fn reject(e: ApiError) -> Outcome {
    Outcome::Failed(Failure::Rejected(e))
}

/// The engine did not start generation: the status follows the engine's gRPC status.
fn start_failed(s: &Status) -> ApiError {
    ApiError::new(wire::http_status(s.code), "start_generation_failed", format!("Generation failed to start: {s}"))
}

/// `chatcmpl-` / `cmpl-` and 24 hex digits: the response id, and the engine request id.
fn response_id(shard: &Shard, prefix: &str) -> String {
    let mut id = Vec::with_capacity(prefix.len() + 24);
    id.extend_from_slice(prefix.as_bytes());
    put_hex_width(&mut id, shard.next_random(), 16);
    put_hex_width(&mut id, shard.next_random(), 8);
    String::from_utf8(id).unwrap_or_default()
}

fn engine_request(prep: &Prepared, rid: String, ids: &[u32], dp_rank: Option<u32>) -> GenerateRequest {
    GenerateRequest {
        data_parallel_rank: dp_rank.and_then(|r| i32::try_from(r).ok()),
        request_id: rid,
        tokenized: Some(TokenizedInput { original_text: String::new(), input_ids: ids.to_vec() }),
        sampling_params: Some(prep.params.clone()),
        logprob_start_len: -1,
        stream: prep.stream,
        require_reasoning: prep.reasoning,
        return_logprob: prep.logprobs.is_some(),
        top_logprobs_num: prep.logprobs.map_or(0, |k| k.min(i32::MAX as u32) as i32),
        ..Default::default()
    }
}

/// Sends every engine request and waits for each one's first message, watching the client.
/// Ok(None): the client left (its requests were aborted).
async fn start(
    target: &mut Target,
    client: &Client,
    prep: &Prepared,
    id: &str,
    limits: Limits,
) -> Result<Option<Started>, Status> {
    let many = prep.prompts.len() > 1;
    let mut calls = Vec::with_capacity(prep.prompts.len());
    for (i, ids) in prep.prompts.iter().enumerate() {
        let rid = if many { format!("{id}-{i}") } else { id.to_string() };
        let req = engine_request(prep, rid.clone(), ids, target.dp_rank);
        let mut send = target.send.clone().ready().await.map_err(wire::transport)?;
        // The response head comes at once (the engine answers it before admitting the
        // request): the client is watched from the first message on.
        let mut call = Call::start(&mut send, &target.authority, path::GENERATE, &req).await?;
        call.limit(limits);
        calls.push((rid, call, None));
    }
    for i in 0..calls.len() {
        let first = monoio::select! {
            m = calls[i].1.next::<GenerateResponse>() => m,
            closed = peer_closed(&client.stream) => {
                if closed {
                    abort_all(target, calls.iter().map(|(r, _, _)| r.clone()));
                    return Ok(None);
                }
                calls[i].1.next::<GenerateResponse>().await
            }
        };
        match first {
            Some(Ok(m)) => calls[i].2 = Some(m),
            Some(Err(s)) => return Err(s),
            None => return Err(Status::new(Code::INTERNAL, "the engine ended the call without a message")),
        }
    }
    Ok(Some(Started { calls }))
}

/// Abort RPCs for `rids`, sent from a task of their own (the request is over for us).
fn abort_all(target: &Target, rids: impl Iterator<Item = String>) {
    for rid in rids {
        let send = target.send.clone();
        let authority = target.authority.clone();
        monoio::spawn(async move {
            let Ok(mut send) = send.ready().await else { return };
            let req = AbortRequest { request_id: rid, reason: "client disconnected".into() };
            let _ = conn::unary::<_, AbortResponse>(&mut send, &authority, path::ABORT, &req).await;
        });
    }
}

/// One choice's progress.
struct ChoiceState<'a> {
    decoder: IncrementalDecoder<'a>,
    stop: StopMatcher<'a>,
    text: String,
    finish: Option<String>,
    completion: u64,
    reasoning: u64,
    /// Speculative decoding's counts, from GenerateComplete.
    drafted: u64,
    accepted: u64,
    /// Its first chunk was written (chat's role chunk, completions' echo).
    begun: bool,
    /// The engine sent this sample's GenerateComplete.
    engine_done: bool,
    /// Log-probabilities of tokens whose text has not been sent yet.
    lp: Vec<Entry>,
    lp_offset: Offset,
}

impl ChoiceState<'_> {
    /// Decodes `ids` and returns the text that is certain (a possible stop string's start
    /// is held back; nothing after a stop string comes out).
    /// `emit` gets the text; `piece` is scratch (both reused across tokens: no allocation
    /// per token). Returns how many of `ids` were taken (the rest follow a stop string).
    fn feed(&mut self, ids: &[u32], emit: &mut String, piece: &mut String) -> usize {
        for (i, &t) in ids.iter().enumerate() {
            piece.clear();
            self.decoder.step(t, piece);
            if self.stop.push(piece, emit) {
                return i + 1;
            }
        }
        ids.len()
    }

    /// Keeps the log-probabilities of the first `taken` tokens of a message.
    fn keep_logprobs(&mut self, lp: Option<&smg_proto::scheduler::OutputLogProbs>, taken: usize) {
        if let Some(lp) = lp {
            logprobs::take(lp, taken, &mut self.lp);
        }
    }

    /// The pending log-probabilities as JSON into `out` (cleared first); false when
    /// none were asked for.
    fn render_logprobs(
        &mut self,
        prep: &Prepared,
        kind: Kind,
        tok: &crate::tokenizer::Tokenizer,
        out: &mut Vec<u8>,
    ) -> bool {
        let Some(top) = prep.logprobs else { return false };
        out.clear();
        logprobs::put(out, kind, tok, &self.lp, top, &mut self.lp_offset);
        self.lp.clear();
        true
    }

    /// The sample ended: what the decoder and the stop matcher still hold.
    fn end(&mut self, emit: &mut String, piece: &mut String) {
        if self.stop.stopped() {
            return;
        }
        piece.clear();
        self.decoder.finish(piece);
        self.stop.push(piece, emit);
        self.stop.finish(emit);
    }
}

/// Per engine request: the prompt's counters (shared by its samples).
#[derive(Default, Clone, Copy)]
struct PromptCounts {
    prompt: u64,
    cached: u64,
}

#[allow(clippy::too_many_arguments)]
async fn respond(
    shard: &Rc<Shard>,
    client: &mut Client,
    head: &RequestHead,
    ctx: &mut RequestCtx,
    kind: Kind,
    model: &GrpcModel,
    prep: &Prepared,
    id: &str,
    target: Target,
    started: Started,
) -> Outcome {
    let n = prep.n as usize;
    let total = n * prep.prompts.len();
    let tok = &model.tokenizer;
    let mut choices: Vec<ChoiceState<'_>> = (0..total)
        .map(|_| ChoiceState {
            // A completion continues its prompt; a chat reply starts a message.
            decoder: match kind {
                Kind::Completions => tok.decoder(prep.skip_special).continuing(),
                Kind::Chat => tok.decoder(prep.skip_special),
            },
            stop: StopMatcher::new(&prep.stop, prep.no_stop_trim),
            text: String::new(),
            finish: None,
            completion: 0,
            reasoning: 0,
            drafted: 0,
            accepted: 0,
            begun: false,
            engine_done: false,
            lp: Vec::new(),
            lp_offset: Offset::default(),
        })
        .collect();
    // Completions' echo: the prompt's text starts each of its choices (and their offsets).
    for (i, c) in choices.iter_mut().enumerate() {
        if let Some(e) = prep.echo.get(i / n) {
            c.lp_offset = Offset(e.chars().count() as u64);
        }
    }
    let mut counts = vec![PromptCounts::default(); prep.prompts.len()];
    let created = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let model_name = ctx.model.clone().unwrap_or_default();
    let meta = Meta { kind, id, created, model: &model_name };
    let mut out = Stream::new(ctx, head, prep.stream, &target.url, &shard.date());
    // DeepSeek's stream format: the whole request's usage on the last finish chunk (asked
    // for or not), `usage: null` before it when asked for, no usage-only chunk.
    let deepseek = prep.stream && matches!(ctx.profile, crate::contract::Profile::DeepSeek { .. });
    let mut failure: Option<Status> = None;
    let mut gone = false;
    let mut watch = true;
    for (p, (rid, mut call, first)) in started.calls.into_iter().enumerate() {
        let mut next = first;
        // SSE events not yet written: the events of messages that arrived together go out in
        // one write, not one write per token.
        let mut events: Vec<u8> = Vec::new();
        // A message's decoded text, and the decoder's scratch: reused for every message.
        let (mut text, mut piece) = (String::new(), String::new());
        // A chunk's `logprobs` JSON, reused.
        let mut lp_json: Vec<u8> = Vec::new();
        loop {
            let msg = match next.take() {
                Some(m) => m,
                None if watch => {
                    monoio::select! {
                        m = call.next::<GenerateResponse>() => match m {
                            Some(Ok(m)) => m,
                            Some(Err(s)) => { failure = Some(s); break; }
                            None => break,
                        },
                        closed = peer_closed(&client.stream) => {
                            if closed {
                                gone = true;
                                abort_all(&target, std::iter::once(rid.clone()));
                                break;
                            }
                            watch = false;
                            continue;
                        }
                    }
                }
                None => match call.next::<GenerateResponse>().await {
                    Some(Ok(m)) => m,
                    Some(Err(s)) => {
                        failure = Some(s);
                        break;
                    }
                    None => break,
                },
            };
            let update = match msg.response {
                Some(generate_response::Response::Chunk(c)) => {
                    counts[p] = PromptCounts { prompt: c.prompt_tokens as u64, cached: c.cached_tokens as u64 };
                    let i = p * n + c.index as usize;
                    let Some(st) = choices.get_mut(i).filter(|st| st.finish.is_none()) else { continue };
                    st.completion = c.completion_tokens as u64;
                    st.reasoning = c.reasoning_tokens as u64;
                    text.clear();
                    let taken = st.feed(&c.token_ids, &mut text, &mut piece);
                    if prep.logprobs.is_some() {
                        st.keep_logprobs(c.output_logprobs.as_ref(), taken);
                    }
                    if st.stop.stopped() {
                        st.finish = Some("stop".into());
                    }
                    Some(i)
                }
                Some(generate_response::Response::Complete(c)) => {
                    counts[p] = PromptCounts { prompt: c.prompt_tokens as u64, cached: c.cached_tokens as u64 };
                    // Streaming: the sample its index names. Otherwise arrival order, as SMG
                    // reads them: SGLang's non-streaming Completes all carry index 0.
                    let i = if prep.stream {
                        p * n + c.index as usize
                    } else {
                        p * n + choices[p * n..(p + 1) * n].iter().filter(|s| s.engine_done).count()
                    };
                    let Some(st) = choices.get_mut(i) else { continue };
                    st.completion = c.completion_tokens as u64;
                    st.reasoning = c.reasoning_tokens as u64;
                    st.drafted = c.spec_draft_tokens as u64;
                    st.accepted = c.spec_accepted_tokens as u64;
                    st.engine_done = true;
                    if st.finish.is_some() {
                        continue;
                    }
                    // Streaming: the tokens came in chunks; the whole output otherwise.
                    text.clear();
                    if !prep.stream {
                        let taken = st.feed(&c.output_ids, &mut text, &mut piece);
                        if prep.logprobs.is_some() {
                            st.keep_logprobs(c.output_logprobs.as_ref(), taken);
                        }
                    }
                    st.end(&mut text, &mut piece);
                    if st.stop.stopped() {
                        st.finish = Some("stop".into());
                    } else {
                        match reply::finish_reason(&c.finish_reason) {
                            Some(f) => st.finish = Some(f.to_string()),
                            None => {
                                failure = Some(Status::new(Code::INTERNAL, "the engine finished with an error"));
                                break;
                            }
                        }
                    }
                    Some(i)
                }
                None => None,
            };
            let Some(i) = update else { continue };
            if prep.stream {
                let last_finish = deepseek && choices.iter().all(|c| c.finish.is_some());
                let total = ((prep.continuous_usage && !deepseek) || last_finish).then(|| usage_of(&choices, &counts));
                // Every chunk but DeepSeek's last finish chunk: the running usage (continuous
                // stats), or DeepSeek's null when usage was asked for.
                let before = match (&total, deepseek) {
                    (_, true) if prep.include_usage => ChunkUsage::Null,
                    (Some(u), false) => ChunkUsage::Of(u),
                    _ => ChunkUsage::Absent,
                };
                let st = &mut choices[i];
                let first = !st.begun;
                st.begun = true;
                if first && kind == Kind::Chat {
                    let d = Delta { role: true, ..Delta::default() };
                    reply::chunk(&mut events, &meta, i as u32, &d, before);
                }
                // Completions: a choice's first chunk leads with its echoed prompt, and its
                // finish chunk ends with the suffix.
                if first {
                    if let Some(e) = prep.echo.get(i / n) {
                        text.insert_str(0, e);
                    }
                }
                if let (Some(s), Some(_)) = (&prep.suffix, &st.finish) {
                    text.push_str(s);
                }
                if !text.is_empty() || st.finish.is_some() {
                    let lp = st.render_logprobs(prep, kind, tok, &mut lp_json);
                    let d = Delta {
                        role: false,
                        text: (!text.is_empty()).then_some(text.as_str()),
                        finish: st.finish.as_deref(),
                        logprobs: lp.then_some(lp_json.as_slice()),
                    };
                    let usage = match &total {
                        Some(u) if last_finish => ChunkUsage::Of(u),
                        _ => before,
                    };
                    reply::chunk(&mut events, &meta, i as u32, &d, usage);
                }
            } else {
                choices[i].text.push_str(&text);
            }
            // Every sample of this engine request is done (stop strings found by the gateway
            // before the engine's own end): the engine need not go on.
            let all_done = choices[p * n..(p + 1) * n].iter().all(|s| s.finish.is_some());
            if all_done && !choices[p * n..(p + 1) * n].iter().all(|s| s.engine_done) {
                abort_all(&target, std::iter::once(rid.clone()));
                break;
            }
            if !events.is_empty() && !call.has_message() {
                if !out.send(client, &events).await {
                    gone = true;
                    abort_all(&target, std::iter::once(rid.clone()));
                    break;
                }
                events.clear();
            }
        }
        if !gone && !events.is_empty() && !out.send(client, &events).await {
            gone = true;
        }
        if gone || failure.is_some() {
            break;
        }
    }
    let usage = usage_of(&choices, &counts);
    if gone {
        shard.record_outcome(target.id, Verdict::Success);
        return Outcome::ClientGone;
    }
    if let Some(s) = &failure {
        shard.record_outcome(target.id, Verdict::Failure);
        if !out.head_sent {
            // Nothing reached the client: an ordinary error answer.
            return reject(ApiError::new(
                wire::http_status(s.code),
                "generation_failed",
                format!("Generation failed: {s}"),
            ));
        }
        let mut events = Vec::new();
        reply::error_event(&mut events, &format!("Stream error: {s}"));
        events.extend_from_slice(reply::DONE);
        out.send(client, &events).await;
        return out.finish(client, ctx, usage, RelayEnd::Worker { why: "gRPC stream failed", sent: true }).await;
    }
    if choices.iter().any(|c| c.finish.is_none()) {
        // The engine ended a call before finishing every sample.
        shard.record_outcome(target.id, Verdict::Failure);
        let s = Status::new(Code::INTERNAL, "the engine ended the stream before every choice finished");
        if !out.head_sent {
            return reject(ApiError::new(500, "generation_failed", format!("Generation failed: {s}")));
        }
        let mut events = Vec::new();
        reply::error_event(&mut events, &format!("Stream error: {s}"));
        events.extend_from_slice(reply::DONE);
        out.send(client, &events).await;
        return out.finish(client, ctx, usage, RelayEnd::Worker { why: "gRPC stream incomplete", sent: true }).await;
    }
    shard.record_outcome(target.id, Verdict::Success);
    if let Some(r) = ctx.reservation.take() {
        r.settle(usage.total());
    }
    if prep.stream {
        let mut events = Vec::new();
        if prep.include_usage && !deepseek {
            reply::usage_chunk(&mut events, &meta, &usage);
        }
        events.extend_from_slice(reply::DONE);
        if !out.send(client, &events).await {
            return Outcome::ClientGone;
        }
    } else {
        if !prep.echo.is_empty() || prep.suffix.is_some() {
            for (i, c) in choices.iter_mut().enumerate() {
                if let Some(e) = prep.echo.get(i / n) {
                    c.text.insert_str(0, e);
                }
                if let Some(s) = &prep.suffix {
                    c.text.push_str(s);
                }
            }
        }
        let lps: Vec<Option<Vec<u8>>> = choices
            .iter_mut()
            .map(|c| {
                let mut out = Vec::new();
                c.render_logprobs(prep, kind, tok, &mut out).then_some(out)
            })
            .collect();
        let list: Vec<Choice<'_>> = choices
            .iter()
            .zip(&lps)
            .enumerate()
            .map(|(i, (c, lp))| Choice {
                index: i as u32,
                text: &c.text,
                finish_reason: c.finish.as_deref().unwrap_or("stop"),
                logprobs: lp.as_deref(),
            })
            .collect();
        let body = reply::full(&meta, &list, &usage);
        out.whole(body);
    }
    out.finish(client, ctx, usage, RelayEnd::Done { reusable: false }).await
}

fn usage_of(choices: &[ChoiceState<'_>], counts: &[PromptCounts]) -> Usage {
    Usage {
        prompt: counts.iter().map(|c| c.prompt).sum(),
        cached: counts.iter().map(|c| c.cached).sum(),
        completion: choices.iter().map(|c| c.completion).sum(),
        reasoning: choices.iter().map(|c| c.reasoning).sum(),
        drafted: choices.iter().map(|c| c.drafted).sum(),
        accepted: choices.iter().map(|c| c.accepted).sum(),
    }
}

/// The client side of the response: a streamed SSE body (chunked, or close-delimited for
/// HTTP/1.0) written as events come, or one JSON body.
struct Stream {
    head: Vec<u8>,
    head_sent: bool,
    streaming: bool,
    raw: bool,
    close: bool,
    bytes: u64,
    first_byte: Option<std::time::Instant>,
    body: Option<Vec<u8>>,
}

impl Stream {
    fn new(ctx: &RequestCtx, head: &RequestHead, streaming: bool, worker_url: &str, date: &[u8]) -> Self {
        let raw = streaming && ctx.http10;
        let close = announce_close(ctx, Some(head)) || raw;
        let mut h = Vec::with_capacity(256);
        status_line(&mut h, 200);
        if streaming {
            h.extend_from_slice(b"content-type: text/event-stream\r\ncache-control: no-cache\r\n");
            if !raw {
                h.extend_from_slice(b"transfer-encoding: chunked\r\n");
            }
        } else {
            h.extend_from_slice(b"content-type: application/json\r\n");
        }
        header_line(&mut h, b"x-smg-routed-worker-id", worker_url.as_bytes());
        Stamp { request_id: &ctx.request_id, date, close, http10: ctx.http10 }.write(&mut h);
        Stream { head: h, head_sent: false, streaming, raw, close, bytes: 0, first_byte: None, body: None }
    }

    /// Writes SSE `events` (with the head first time); false when the client is gone.
    async fn send(&mut self, client: &mut Client, events: &[u8]) -> bool {
        if !self.streaming || events.is_empty() {
            return true;
        }
        let mut buf = Vec::with_capacity(events.len() + 16 + if self.head_sent { 0 } else { self.head.len() + 2 });
        if !self.head_sent {
            buf.extend_from_slice(&self.head);
            buf.extend_from_slice(b"\r\n");
            self.head_sent = true;
            self.first_byte = Some(std::time::Instant::now());
        }
        if self.raw {
            buf.extend_from_slice(events);
        } else {
            put_chunk(&mut buf, events);
        }
        write(&mut client.stream, buf, &mut self.bytes).await
    }

    fn whole(&mut self, body: Vec<u8>) {
        self.body = Some(body);
    }

    /// Ends the response (the last chunk, or the JSON body) and tells `finish` about it.
    async fn finish(mut self, client: &mut Client, ctx: &mut RequestCtx, usage: Usage, end: RelayEnd) -> Outcome {
        ctx.status = 200;
        let mut buf = Vec::new();
        if let Some(body) = self.body.take() {
            buf.extend_from_slice(&self.head);
            buf.extend_from_slice(b"content-length: ");
            smg_wire::num::put_dec(&mut buf, body.len() as u64);
            buf.extend_from_slice(b"\r\n\r\n");
            buf.extend_from_slice(&body);
            self.first_byte = Some(std::time::Instant::now());
        } else if self.streaming && !self.raw && self.head_sent {
            buf.extend_from_slice(b"0\r\n\r\n");
        }
        let ok = buf.is_empty() || write(&mut client.stream, buf, &mut self.bytes).await;
        let end = if ok { end } else { RelayEnd::ClientGone };
        let stats = RelayStats {
            first_byte: self.first_byte,
            bytes: self.bytes,
            close_delimited: self.raw || self.close,
            usage: UsageScan { on: true, prompt: Some(usage.prompt), completion: Some(usage.completion) },
            ..RelayStats::default()
        };
        Outcome::Relayed { end, stats }
    }
}

fn put_chunk(out: &mut Vec<u8>, data: &[u8]) {
    let mut n = Vec::with_capacity(8);
    put_hex_width(&mut n, data.len() as u64, 8);
    let start = n.iter().position(|&b| b != b'0').unwrap_or(n.len() - 1);
    out.extend_from_slice(&n[start..]);
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
}

async fn write(stream: &mut TcpStream, buf: Vec<u8>, bytes: &mut u64) -> bool {
    let len = buf.len() as u64;
    let (res, _) = write_all(stream, buf).await;
    if res.is_ok() {
        *bytes += len;
    }
    res.is_ok()
}
