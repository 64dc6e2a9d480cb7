//! Chat Completions, Completions and `/generate` on a gRPC worker: the attempt and the relay
//! the one upstream loop (serve/forward.rs) takes when the picked worker is `grpc://`. The
//! contract already validated the body; here it is parsed once, rendered and tokenized with
//! the worker's model (src/grpc/request.rs), sent as Generate calls on the shard's h2
//! connection, and answered with JSON or SSE that src/grpc/assemble.rs assembles from the
//! engine's messages (detokenizing incrementally, matching stop strings on the decoded text);
//! this file only reads calls and writes bytes.
//!
//! Decisions (src/grpc/decisions.rs: one prefill-only Generate call per question) and
//! embeddings (src/grpc/embeddings.rs: one Embed call per input) are answered whole in the
//! attempt: nothing streams, so the relay only hands the body to `finish`.
//!
//! Until the first engine message nothing is written to the client: an engine refusal is a
//! worker-side error (`start_generation_failed` with the engine's status mapped), retried
//! on another worker, HTTP or gRPC, when that status is retryable. After it, a failure is the
//! contract's stream error event then `[DONE]`. A client that leaves mid-generation gets
//! its engine requests aborted at once (Abort RPC, and the stream reset).

use std::rc::Rc;
use std::sync::Arc;

use sonic_rs::JsonValueMutTrait;

use smg_proto::paths::sglang_scheduler as path;
use smg_proto::scheduler::{generate_response, EmbedResponse, GenerateResponse};
use smg_wire::num::put_hex_width;

mod calls;
mod mcp_loop;
mod pair;

use mcp_loop::Answered;

use calls::{abort_all, start, Started, Target};

use super::client::Client;
use super::ctx::{Picked, RequestCtx};
use super::error::{Failure, WorkerCause, WorkerError};
use super::finish::{announce_close, Outcome};
use super::upstream::AttemptError;
use crate::api::{ApiError, EndpointSpec};
use crate::contract::Endpoint;
use crate::grpc::assemble::{Answer, Assembler, Step};
use crate::grpc::conn::{Call, Limits};
use crate::grpc::decisions::{self, Questions, Scoring};
use crate::grpc::embeddings::{self, Embeddings};
use crate::grpc::model::GrpcModel;
use crate::grpc::output::PassThrough;
use crate::grpc::reply::Meta;
use crate::grpc::request::{self, Kind, Prepared};
use crate::grpc::wire::{self, Code, Status};
use crate::http::assembled::Assembled;
use crate::http::head::RequestHead;
use crate::http::relay::RelayEnd;
use crate::http::respond::Stamp;
use crate::io::peer_closed;
use crate::responses::answer::{output_of_parts, usage_of, Ending};
use crate::responses::events::Events;
use crate::responses::plan::TurnPlan;
use crate::shard::Shard;
use crate::workers::admin::AdminReply;
use crate::workers::breaker::Verdict;
use crate::workers::WorkerId;

/// The request as gRPC workers take it: its body parsed once, and prepared (rendered and
/// tokenized) once per model, so another worker of the same model reuses it.
pub struct GrpcRequest {
    route: Route,
    id_prefix: &'static str,
    /// A Responses turn: the chat answer is reshaped into the response and stored.
    turn: Option<TurnPlan>,
}

/// What the engine is asked to do.
// One per request, held in its future: boxing the common variant would cost every chat
// request an allocation to save the rare Decisions request a few hundred bytes.
#[allow(clippy::large_enum_variant)]
enum Route {
    /// Chat Completions, Completions or `/generate`: generation, assembled into the OpenAI
    /// answer (SGLang's native one for `/generate`).
    Generate { kind: Kind, doc: sonic_rs::Value, prepared: Option<(Arc<GrpcModel>, Prepared)> },
    /// Decisions: every question's labels scored, nothing generated (src/grpc/decisions.rs).
    Score { questions: Questions, prepared: Option<(Arc<GrpcModel>, Scoring)> },
    /// Embeddings: one Embed call per input (src/grpc/embeddings.rs).
    Embed { req: Embeddings, prepared: Option<(Arc<GrpcModel>, Vec<Vec<u32>>)> },
}

impl GrpcRequest {
    /// The body (validated by the contract) as gRPC workers take it, for `model` (the
    /// canonical name the answer carries): Chat Completions, Completions, `/generate`,
    /// Decisions and embeddings.
    pub fn new(spec: &EndpointSpec, body: &[u8], model: Option<&str>) -> Result<Self, Failure> {
        let refused = |r: crate::grpc::refusal::Refusal| Failure::Rejected(ApiError::new(r.status, r.code, r.message));
        let route = match spec.schema {
            Some(Endpoint::Decisions) => {
                let questions = decisions::read(body, model.unwrap_or("")).map_err(refused)?;
                Route::Score { questions, prepared: None }
            }
            _ if spec.path == EMBEDDINGS => {
                Route::Embed { req: embeddings::read(body, model.unwrap_or("")).map_err(refused)?, prepared: None }
            }
            _ => {
                // Pick gives gRPC workers no other route (serve/pick.rs).
                let Some(kind) = kind_of(spec) else {
                    let msg = format!("No available workers: gRPC workers do not serve {}", spec.path);
                    return Err(Failure::Rejected(ApiError::new(503, "no_available_workers", msg)));
                };
                let doc = sonic_rs::from_slice(body)
                    .map_err(|e| Failure::Rejected(ApiError::bad_request(format!("request body: {e}"))))?;
                Route::Generate { kind, doc, prepared: None }
            }
        };
        Ok(GrpcRequest { route, id_prefix: spec.id_prefix, turn: None })
    }

    /// A Responses turn, as the chat request `chat` (src/responses/turn.rs).
    pub fn turn(chat: sonic_rs::Value, plan: TurnPlan) -> Self {
        let route = Route::Generate { kind: Kind::Chat, doc: chat, prepared: None };
        GrpcRequest { route, id_prefix: "resp_", turn: Some(plan) }
    }

    /// The first engine request's prompt, once prepared: what a text policy routes on.
    pub fn tokens(&self) -> Option<&[u32]> {
        match &self.route {
            Route::Generate { prepared, .. } => {
                prepared.as_ref().and_then(|(_, p)| p.prompts.first()).map(Vec::as_slice)
            }
            Route::Score { prepared, .. } => {
                prepared.as_ref().and_then(|(_, s)| s.prompts.first()).map(|p| p.ids.as_slice())
            }
            Route::Embed { prepared, .. } => prepared.as_ref().and_then(|(_, p)| p.first()).map(Vec::as_slice),
        }
    }

    /// Prepared for `model` (kept when it is the model already prepared for).
    fn prepare(&mut self, model: &Arc<GrpcModel>) -> Result<(), ApiError> {
        let refused = |r: crate::grpc::refusal::Refusal| ApiError::new(r.status, r.code, r.message);
        let fresh = |m: Option<&Arc<GrpcModel>>| !m.is_some_and(|m| Arc::ptr_eq(m, model));
        match &mut self.route {
            Route::Generate { kind, doc, prepared } => {
                if fresh(prepared.as_ref().map(|(m, _)| m)) {
                    *prepared = Some((Arc::clone(model), request::prepare(*kind, doc, model).map_err(refused)?));
                }
            }
            Route::Score { questions, prepared } => {
                if fresh(prepared.as_ref().map(|(m, _)| m)) {
                    *prepared = Some((Arc::clone(model), questions.prepare(model).map_err(refused)?));
                }
            }
            Route::Embed { req, prepared } => {
                if fresh(prepared.as_ref().map(|(m, _)| m)) {
                    *prepared = Some((Arc::clone(model), req.prepare(model).map_err(refused)?));
                }
            }
        }
        Ok(())
    }
}

/// The embeddings route, the one gRPC workers take without a contract schema.
pub const EMBEDDINGS: &str = "/v1/embeddings";

/// SGLang's native generation route.
pub const GENERATE: &str = "/generate";

fn kind_of(spec: &EndpointSpec) -> Option<Kind> {
    match spec.schema {
        Some(Endpoint::ChatCompletions) => Some(Kind::Chat),
        Some(Endpoint::Completions) => Some(Kind::Completions),
        _ if spec.path == GENERATE => Some(Kind::Generate),
        _ => None,
    }
}

/// With `cache_aware` or `prefix_hash` and a gRPC worker serving the model, renders and
/// tokenizes with that worker's model before pick. None when nothing calls for it or it
/// fails (the request is then prepared after pick and refused there).
pub fn early(shard: &Shard, spec: &EndpointSpec, ctx: &RequestCtx, body: &[u8]) -> Option<GrpcRequest> {
    if !shard.cfg().routing.policy.uses_text() {
        return None;
    }
    if kind_of(spec).is_none() && spec.schema != Some(Endpoint::Decisions) && spec.path != EMBEDDINGS {
        return None;
    }
    let snap = shard.snapshot();
    let serves = |w: &&crate::workers::Worker| ctx.model.is_none() || w.model == ctx.model;
    let model = snap.workers.iter().filter(serves).find(|w| w.healthy).and_then(|w| w.meta.grpc.clone())?;
    let mut req = GrpcRequest::new(spec, body, ctx.model.as_deref()).ok()?;
    req.prepare(&model).ok()?;
    Some(req)
}

/// An attempt that the engine took: generation started (the calls and their first
/// messages), or a whole answer made (Decisions, embeddings).
pub struct Begun(Began);

enum Began {
    Generating {
        target: Target,
        started: Started,
        id: String,
    },
    /// Answered whole by the engine (Decisions scored, inputs embedded): the body, with the
    /// input tokens it counts.
    Whole {
        worker: WorkerId,
        body: Vec<u8>,
        input_tokens: u64,
    },
}

/// Phase: attempt, on a gRPC worker (picked). Prepares the request for the worker's model,
/// sends its engine requests on the shard's h2 connection and waits for each one's first
/// message, watching the client. Nothing reaches the client here: an engine refusal is a
/// worker-side error the retry edge reads like any other.
pub async fn attempt(
    shard: &Rc<Shard>,
    client: &Client,
    ctx: &mut RequestCtx,
    picked: &Picked,
    req: &mut GrpcRequest,
) -> Result<Begun, AttemptError> {
    let worker = picked.worker();
    let Some(model) = worker.meta.grpc.clone() else {
        return Err(AttemptError::Failed(Failure::Rejected(ApiError::no_available_workers(ctx.model.as_deref()))));
    };
    let (wid, addr, dp_rank) = (worker.id, worker.url.addr, worker.meta.dp_rank);
    let (url, authority) = (worker.url.url.clone(), worker.url.authority.clone());
    req.prepare(&model).map_err(|e| AttemptError::Failed(Failure::Rejected(e)))?;
    // A new engine request id per attempt: a failed one may still be known to its engine.
    let id = response_id(shard, req.id_prefix);
    let pair = picked.prefill().is_some();
    let engine_failed = |s: Status| {
        if s.message.starts_with("transport") || s.message.starts_with("connect") {
            shard.grpc().forget(wid);
        }
        // A pair's decode says so (`decode_worker_failed_to_start`).
        let cause = if pair { WorkerCause::PairEngine { status: s, prefill: false } } else { WorkerCause::Engine(s) };
        AttemptError::Failed(Failure::Worker(WorkerError::new(cause, false)))
    };
    let send = shard.grpc().ready(wid, addr).await.map_err(engine_failed)?;
    let mut target = Target { id: wid, dp_rank, url, authority, send };
    let limits = Limits {
        deadline: Some(ctx.timings.upstream_started.unwrap_or(ctx.timings.started) + shard.cfg().request_timeout),
        idle: Some(shard.cfg().upstream_read_timeout),
        max_message: Some(shard.cfg().grpc_max_message),
    };
    match &req.route {
        Route::Generate { prepared, .. } => {
            let (_, prep) = prepared.as_ref().expect("prepared");
            if let Some(prefill) = picked.prefill() {
                // Boxed, as forward.rs boxes the HTTP pair's: a one-worker request does not carry it.
                let slot = ctx.prefill_slot.take();
                let (target, started) =
                    Box::pin(pair::attempt(shard, client, prefill, target, prep, &id, limits, slot)).await?;
                return Ok(Begun(Began::Generating { target, started, id }));
            }
            match start(&mut target, client, prep, &id, limits, None).await {
                Ok(Some(started)) => Ok(Begun(Began::Generating { target, started, id })),
                Ok(None) => Err(AttemptError::ClientGone),
                Err(s) => Err(engine_failed(s)),
            }
        }
        Route::Score { questions, prepared } => {
            let (_, scoring) = prepared.as_ref().expect("prepared");
            match score(&mut target, client, scoring, &id, limits).await {
                Ok(Some(rows)) => {
                    let Some(rows) = rows else {
                        let e = ApiError::invalid_decisions_response();
                        return Err(AttemptError::Failed(Failure::Rejected(e)));
                    };
                    let (body, input_tokens) = decisions::answer(questions, &rows);
                    Ok(Begun(Began::Whole { worker: wid, body, input_tokens }))
                }
                Ok(None) => Err(AttemptError::ClientGone),
                Err(s) => Err(engine_failed(s)),
            }
        }
        Route::Embed { req, prepared } => {
            let (_, inputs) = prepared.as_ref().expect("prepared");
            match embed(&mut target, client, inputs, &id, limits).await {
                Ok(Some(vectors)) => match embeddings::answer(req, &vectors) {
                    Ok((body, input_tokens)) => Ok(Begun(Began::Whole { worker: wid, body, input_tokens })),
                    Err(r) => Err(AttemptError::Failed(Failure::Rejected(ApiError::new(r.status, r.code, r.message)))),
                },
                Ok(None) => Err(AttemptError::ClientGone),
                Err(s) => Err(engine_failed(s)),
            }
        }
    }
}

/// Sends one Embed call per input and reads each one's vector, watching the client.
/// Ok(None): the client left (an Embed call has nothing to abort: it is dropped).
async fn embed(
    target: &mut Target,
    client: &Client,
    inputs: &[Vec<u32>],
    id: &str,
    limits: Limits,
) -> Result<Option<Vec<EmbedResponse>>, Status> {
    let mut calls = Vec::with_capacity(inputs.len());
    for (i, ids) in inputs.iter().enumerate() {
        let req = embeddings::engine_request(ids, format!("{id}-{i}"), target.dp_rank);
        let mut send = target.send.clone().ready().await.map_err(wire::transport)?;
        let mut call = Call::start(&mut send, &target.authority, path::EMBED, &req).await?;
        call.limit(limits);
        calls.push(call);
    }
    let mut vectors = Vec::with_capacity(calls.len());
    for call in &mut calls {
        let msg = monoio::select! {
            m = call.next::<EmbedResponse>() => m,
            closed = peer_closed(&client.stream) => {
                if closed {
                    return Ok(None);
                }
                call.next::<EmbedResponse>().await
            }
        };
        match msg {
            Some(Ok(v)) => vectors.push(v),
            Some(Err(s)) => return Err(s),
            None => return Err(Status::new(Code::INTERNAL, "the engine ended the call without a message")),
        }
    }
    Ok(Some(vectors))
}

/// Sends one scoring call per question and reads each one's answer, watching the client.
/// Ok(None): the client left (the calls were aborted); Ok(Some(None)): the engine answered,
/// but not with one usable row of label log-probabilities per question.
async fn score(
    target: &mut Target,
    client: &Client,
    scoring: &Scoring,
    id: &str,
    limits: Limits,
) -> Result<Option<Option<Vec<decisions::Row>>>, Status> {
    let mut calls = Vec::with_capacity(scoring.prompts.len());
    for (i, prompt) in scoring.prompts.iter().enumerate() {
        let rid = format!("{id}-{i}");
        let req = decisions::engine_request(prompt, rid.clone(), target.dp_rank);
        let mut send = target.send.clone().ready().await.map_err(wire::transport)?;
        let mut call = Call::start(&mut send, &target.authority, path::GENERATE, &req).await?;
        call.limit(limits);
        calls.push((rid, call));
    }
    let mut rows = Vec::with_capacity(calls.len());
    let mut usable = true;
    for (i, (_, call)) in calls.iter_mut().enumerate() {
        let msg = monoio::select! {
            m = call.next::<GenerateResponse>() => m,
            closed = peer_closed(&client.stream) => {
                if closed {
                    abort_all(target, calls.iter().map(|(r, _)| r.clone()));
                    return Ok(None);
                }
                call.next::<GenerateResponse>().await
            }
        };
        let complete = match msg {
            Some(Ok(GenerateResponse { response: Some(generate_response::Response::Complete(c)), .. })) => c,
            Some(Ok(_)) => {
                usable = false;
                continue;
            }
            Some(Err(s)) => return Err(s),
            None => return Err(Status::new(Code::INTERNAL, "the engine ended the call without a message")),
        };
        match decisions::row(&scoring.prompts[i], &complete) {
            Some(r) if usable => rows.push(r),
            _ => usable = false,
        }
    }
    Ok(Some(usable.then_some(rows)))
}

/// Phase: relay, from a gRPC attempt that began generating: the gateway assembles the
/// OpenAI answer from the engine's messages. Err: the engine failed before a byte reached
/// the client (not judged yet: the retry edge does).
pub async fn relay(
    shard: &Rc<Shard>,
    client: &mut Client,
    head: &RequestHead,
    ctx: &mut RequestCtx,
    req: &GrpcRequest,
    begun: Begun,
) -> Result<Outcome, WorkerError> {
    match (begun.0, &req.route) {
        (Began::Generating { target, started, id }, Route::Generate { kind, prepared: Some((model, prep)), .. }) => {
            let turn = req.turn.as_ref();
            respond(shard, client, head, ctx, *kind, model, prep, &id, target, started, turn).await
        }
        (Began::Whole { worker, body, input_tokens }, _) => {
            ctx.judge(worker, Verdict::Success);
            // A tenant budget is trued up to the prompts the engine read (no output tokens).
            ctx.used_tokens = Some(input_tokens);
            Ok(Outcome::Control(AdminReply {
                status: 200,
                content_type: "application/json",
                body,
                location: None,
                api_error: None,
            }))
        }
        (Began::Generating { .. }, _) => unreachable!("a generation began for a prepared generation request"),
    }
}

/// `chatcmpl-` / `cmpl-` and 24 hex digits: the response id, and the engine request id.
fn response_id(shard: &Shard, prefix: &str) -> String {
    let mut id = Vec::with_capacity(prefix.len() + 24);
    id.extend_from_slice(prefix.as_bytes());
    put_hex_width(&mut id, shard.next_random(), 16);
    put_hex_width(&mut id, shard.next_random(), 8);
    String::from_utf8(id).unwrap_or_default()
}

/// From the first engine messages to the response's end: each generation's messages go to
/// the assembler (src/grpc/assemble.rs) and what comes out is written, watching the client
/// and aborting the engine requests it no longer needs. A Responses turn with MCP tools
/// runs the calls the model makes and generates again, on the same worker, until the model
/// answers without them (`mcp_loop.rs`).
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
    mut target: Target,
    started: Started,
    turn: Option<&TurnPlan>,
) -> Result<Outcome, WorkerError> {
    let date = shard.date();
    let stamp = Stamp { request_id: &ctx.request_id, date: &date, close: false, http10: ctx.http10 };
    // A Responses answer does not name its worker (SMG's rule).
    let named = if turn.is_some() { "" } else { target.url.as_str() };
    let mut out = Assembled::new(prep.stream, announce_close(ctx, Some(head)), named, stamp);
    let mut shape = Shape { events: turn.map(|t| Events::new(t.shell.clone())), scratch: Vec::new() };
    let mut mcp = turn.and_then(|t| t.mcp.as_ref().map(|m| mcp_loop::Loop::new(t, m)));
    if let (Some(l), Some(events)) = (mcp.as_ref(), shape.events.as_mut()) {
        let mut opening = Vec::new();
        l.open(events, &mut opening);
        if !out.send(&mut client.stream, &opening).await {
            return Ok(Outcome::ClientGone);
        }
    }
    let mut usage = crate::grpc::reply::Usage::default();
    let mut next: Option<(Prepared, String)> = None;
    let mut started = started;
    loop {
        let (p, rid) = next.as_ref().map_or((prep, id), |(p, r)| (p, r.as_str()));
        let items = turn.is_some() && !p.stream;
        let (generated, used) =
            generate(client, ctx, kind, model, p, rid, &target, started, &mut out, &mut shape, items).await;
        usage.prompt += used.prompt;
        usage.completion += used.completion;
        usage.cached += used.cached;
        usage.reasoning += used.reasoning;
        let answer = match generated {
            Generated::Gone => {
                ctx.judge(target.id, Verdict::Success);
                return Ok(Outcome::ClientGone);
            }
            Generated::Failed(s, _) if !out.head_sent() => {
                // Nothing reached the client: the retry edge judges it and may go elsewhere.
                return Err(WorkerError::new(WorkerCause::Generation(s), false));
            }
            Generated::Failed(_, why) => {
                ctx.judge(target.id, Verdict::Failure);
                if let Some(events) = shape.events.as_mut() {
                    // `response.failed`, not stored.
                    let mut last = Vec::new();
                    let (object, _, _) = events.end(&mut last);
                    events.completed(object, &mut last);
                    out.send(&mut client.stream, &last).await;
                }
                return Ok(end(out, client, ctx, usage, RelayEnd::Worker { why, sent: true }).await);
            }
            Generated::Done(answer) => answer,
        };
        let mut answer = answer;
        // The MCP loop: the calls run, and the model asked again with their outputs.
        if let (Some(l), Some(turn)) = (mcp.as_mut(), turn) {
            let mut sent = Vec::new();
            let again = l.round(shard, ctx, &mut answer, shape.events.as_mut(), &mut sent).await;
            if !out.send(&mut client.stream, &sent).await {
                return Ok(Outcome::ClientGone);
            }
            match again {
                mcp_loop::Round::Again(chat) => {
                    let prepared = request::prepare(Kind::Chat, &chat, model).map_err(|r| {
                        let s = Status::new(Code::INVALID_ARGUMENT, r.message);
                        WorkerError::new(WorkerCause::Generation(s), out.head_sent())
                    });
                    let prepared = match prepared {
                        Ok(p) => p,
                        Err(e) if !out.head_sent() => return Err(e),
                        Err(_) => {
                            return Ok(
                                end(out, client, ctx, usage, RelayEnd::Worker { why: "MCP loop", sent: true }).await
                            )
                        }
                    };
                    let rid = response_id(shard, "resp_");
                    let limits = Limits {
                        deadline: Some(
                            ctx.timings.upstream_started.unwrap_or(ctx.timings.started) + shard.cfg().request_timeout,
                        ),
                        idle: Some(shard.cfg().upstream_read_timeout),
                        max_message: Some(shard.cfg().grpc_max_message),
                    };
                    match start(&mut target, client, &prepared, &rid, limits, None).await {
                        Ok(Some(s)) => {
                            started = s;
                            next = Some((prepared, rid));
                            continue;
                        }
                        Ok(None) => {
                            ctx.judge(target.id, Verdict::Success);
                            return Ok(Outcome::ClientGone);
                        }
                        Err(s) if !out.head_sent() => return Err(WorkerError::new(WorkerCause::Generation(s), false)),
                        Err(_) => {
                            ctx.judge(target.id, Verdict::Failure);
                            return Ok(end(
                                out,
                                client,
                                ctx,
                                usage,
                                RelayEnd::Worker { why: "gRPC stream failed", sent: true },
                            )
                            .await);
                        }
                    }
                }
                mcp_loop::Round::Done => {}
            }
            // The round read the stream's last events already.
            let answer = match answer {
                Answered::Events(_) => Answered::Events(Vec::new()),
                body => body,
            };
            return finish_turn(shard, client, ctx, turn, answer, mcp, &mut shape, out, usage, &target).await;
        }
        ctx.judge(target.id, Verdict::Success);
        match (answer, turn) {
            (Answered::Events(tail), None) => {
                if !out.send(&mut client.stream, &tail).await {
                    return Ok(Outcome::ClientGone);
                }
            }
            (Answered::Body(body), None) => out.whole(body),
            (Answered::Items(..), None) => unreachable!("items are taken for a Responses turn only"),
            (answer, Some(turn)) => {
                return finish_turn(shard, client, ctx, turn, answer, None, &mut shape, out, usage, &target).await;
            }
        }
        return Ok(end(out, client, ctx, usage, RelayEnd::Done { reusable: false }).await);
    }
}

/// How one generation ended.
enum Generated {
    /// The client left (the engine requests were aborted).
    Gone,
    /// The engine failed (after `head_sent`, the contract's error events were written).
    Failed(Status, &'static str),
    Done(Answered),
}

/// One generation: the engine's messages assembled and written (a stream's) as they come.
#[allow(clippy::too_many_arguments)]
async fn generate(
    client: &mut Client,
    ctx: &RequestCtx,
    kind: Kind,
    model: &GrpcModel,
    prep: &Prepared,
    id: &str,
    target: &Target,
    started: Started,
    out: &mut Assembled,
    shape: &mut Shape,
    items: bool,
) -> (Generated, crate::grpc::reply::Usage) {
    let created = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let model_name = ctx.model.clone().unwrap_or_default();
    let meta = Meta { kind, id, created, model: &model_name };
    let deepseek = matches!(ctx.profile, crate::contract::Profile::DeepSeek { .. });
    // Text passes as it is unless the model has a parser this request uses.
    let plan = &prep.output;
    let mut asm = Assembler::new(prep, &model.tokenizer, meta, deepseek, |_| {
        if plan.parses() {
            plan.parser()
        } else {
            Box::new(PassThrough)
        }
    });
    let mut failure: Option<Status> = None;
    let mut gone = false;
    let mut watch = true;
    for (p, (rid, mut call, first)) in started.calls.into_iter().enumerate() {
        let mut next = first;
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
                                abort_all(target, std::iter::once(rid.clone()));
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
            match asm.on_message(p, msg) {
                Step::Next => {}
                Step::Abort => {
                    abort_all(target, std::iter::once(rid.clone()));
                    break;
                }
                Step::Failed(s) => {
                    failure = Some(s);
                    break;
                }
            }
            // The events of messages that arrived together go out in one write, not one write
            // per token.
            if !asm.pending().is_empty() && !call.has_message() {
                if !out.send(&mut client.stream, shape.of(asm.pending())).await {
                    gone = true;
                    abort_all(target, std::iter::once(rid.clone()));
                    break;
                }
                asm.sent();
            }
        }
        if !gone && !asm.pending().is_empty() {
            if !out.send(&mut client.stream, shape.of(asm.pending())).await {
                gone = true;
            }
            asm.sent();
        }
        if gone || failure.is_some() {
            break;
        }
    }
    let usage = asm.usage();
    if gone {
        return (Generated::Gone, usage);
    }
    // A non-streamed Responses turn takes its items from the assembler, not a chat body.
    if failure.is_none() && items {
        return match asm.take_first() {
            Ok((text, reasoning, calls, finish)) => {
                let (output, ending) = output_of_parts(&text, &reasoning, &calls, &finish);
                (Generated::Done(Answered::Items(output, ending, usage_of(&usage))), usage)
            }
            Err(s) => (Generated::Failed(s, "gRPC stream incomplete"), usage),
        };
    }
    let ended = match failure {
        Some(s) => Err((s, "gRPC stream failed")),
        // Err: the engine ended a call before finishing every sample.
        None => asm.finish().map_err(|s| (s, "gRPC stream incomplete")),
    };
    match ended {
        Ok(Answer::Events) => (Generated::Done(Answered::Events(asm.pending().to_vec())), usage),
        Ok(Answer::Body(body)) => (Generated::Done(Answered::Body(body)), usage),
        Err((s, why)) => {
            if out.head_sent() {
                asm.fail(&s);
                out.send(&mut client.stream, shape.of(asm.pending())).await;
            }
            (Generated::Failed(s, why), usage)
        }
    }
}

/// The end of a Responses turn: the final object made (from the last generation's chat
/// body, or the event stream), stored, and its body or last event written.
#[allow(clippy::too_many_arguments)]
async fn finish_turn(
    shard: &Shard,
    client: &mut Client,
    ctx: &mut RequestCtx,
    turn: &TurnPlan,
    answer: Answered,
    mcp: Option<mcp_loop::Loop<'_>>,
    shape: &mut Shape,
    mut out: Assembled,
    usage: crate::grpc::reply::Usage,
    target: &Target,
) -> Result<Outcome, WorkerError> {
    ctx.judge(target.id, Verdict::Success);
    match answer {
        Answered::Events(tail) => {
            let Some(events) = shape.events.as_mut() else { unreachable!("a streamed turn has its event stream") };
            let mut last = Vec::new();
            events.feed(&tail, &mut last);
            let (mut object, output, _) = events.end(&mut last);
            let output: Vec<String> = output.iter().map(|v| sonic_rs::to_string(v).unwrap_or_default()).collect();
            if !store(shard, ctx, turn, &sonic_rs::to_string(&object).unwrap_or_default(), &output).await {
                unstored(&mut object);
            }
            events.completed(object, &mut last);
            if !out.send(&mut client.stream, &last).await {
                return Ok(Outcome::ClientGone);
            }
        }
        answer => {
            let (output, ending, used) = match mcp {
                Some(l) => l.finish(answer),
                None => answer.items().unwrap_or((Vec::new(), Ending::Completed, Default::default())),
            };
            let output: Vec<String> = output.iter().map(|v| sonic_rs::to_string(v).unwrap_or_default()).collect();
            let mut body = turn.shell.object_json(Some(ending), &output, Some(used));
            if !store(shard, ctx, turn, &body, &output).await {
                let mut object: sonic_rs::Value = sonic_rs::from_str(&body).unwrap_or_default();
                unstored(&mut object);
                body = sonic_rs::to_string(&object).unwrap_or_default();
            }
            out.whole(body.into_bytes());
        }
    }
    Ok(end(out, client, ctx, usage, RelayEnd::Done { reusable: false }).await)
}

/// A Responses turn's stream: the chat events the assembler writes, reshaped.
struct Shape {
    events: Option<Events>,
    scratch: Vec<u8>,
}

impl Shape {
    /// The bytes to write for the assembler's `chat` events.
    fn of<'a>(&'a mut self, chat: &'a [u8]) -> &'a [u8] {
        match self.events.as_mut() {
            None => chat,
            Some(e) => {
                self.scratch.clear();
                e.feed(chat, &mut self.scratch);
                &self.scratch
            }
        }
    }
}

/// Stores a finished turn (`object`: the response's JSON) before its last event or its body
/// goes out. False when it could not be: the answer then says `store: false`, since a
/// response reported stored is one that was.
async fn store(shard: &Shard, ctx: &RequestCtx, turn: &TurnPlan, object: &str, output: &[String]) -> bool {
    for op in turn.writes(object, output) {
        if let Err(e) = shard.history().write(op).await {
            crate::warn!("request {}: response {} not stored: {}", ctx.id_str(), turn.shell.id, e.0);
            return false;
        }
    }
    true
}

/// The object as answered after a store that failed.
fn unstored(object: &mut sonic_rs::Value) {
    if let Some(o) = object.as_object_mut() {
        o.insert("store", false);
    }
}

/// Ends the assembled response and tells `finish` how it went.
async fn end(
    out: Assembled,
    client: &mut Client,
    ctx: &mut RequestCtx,
    usage: crate::grpc::reply::Usage,
    end: RelayEnd,
) -> Outcome {
    ctx.status = 200;
    let (end, stats) = out.finish(&mut client.stream, end, usage.prompt, usage.completion, Some(usage.cached)).await;
    Outcome::Relayed { end, stats }
}
