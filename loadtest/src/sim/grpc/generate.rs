//! The Generate call: admission into the batch, then output tokens on the timing model's
//! schedule, as `GenerateStreamChunk`s (streaming) and one `GenerateComplete` per sample.
//!
//! Output: whole-word tokens of the simulated tokenizer, picked from the request id, sample
//! index and position (so a request's text is reproducible and samples differ). Length: the
//! request's max_new_tokens when given (finish "length"), else the worker's --output-tokens,
//! the last of which is the model's stop token (finish "stop", matched_token_id: the first
//! stop_token_ids entry, else `<|im_end|>`). A stop_token_ids entry drawn earlier ends that
//! sample there. Stop tokens are counted in completion_tokens but not sent as output.
//!
//! With return_logprob each token carries a log-probability and top_logprobs_num alternatives
//! (`logprob_at`, `alternative_at`: reproducible, the sampled token ranked first), in its
//! chunk when streaming and in GenerateComplete otherwise. `token_ids_logprob` gets each
//! GenerateComplete one row of those ids' raw log-probabilities per output position, or one
//! row when nothing is generated (`max_new_tokens: 0`, prefill-only scoring, as Decisions on
//! gRPC workers send it), from `token_id_logprob`. With `logprob_start_len` ≥ 0 the prompt's
//! log-probabilities from there come too (`token_id_logprob` after the token before), on each
//! sample's first chunk and in GenerateComplete.
//!
//! Faults: --fail-rate answers the status --fail-status maps to, or `custom_params.sim_error`
//! ("RESOURCE_EXHAUSTED", "unavailable", "3"...) names one per request; --hang-rate never
//! answers; --truncate-rate ends the stream with INTERNAL after some tokens.
//!
//! `custom_params.sim_spec_draft` / `sim_spec_accepted` (numbers) are reported per sample as
//! speculative decoding's draft and accepted tokens.
//!
//! `custom_params.sim_huge_tokens: N` sends, before anything else, one stream chunk of N
//! token ids of 4 bytes each on the wire (a message of about 4·N bytes; the ids are not in
//! the tokenizer): gateway tests get an engine message larger than they allow.
//!
//! `custom_params.sim_output` (a string) replaces the words with that text's bytes, one byte
//! token each, then the stop token: gateway tests get multi-byte characters and stop strings
//! split across tokens on purpose; `custom_params.sim_echo_prompt: true` answers with the
//! prompt's own token ids (tests read back what the gateway rendered). Without either,
//! `--reasoning-markup` / `--tool-call-markup` write the answer in a model family's markup
//! (`markup`; after a tool result, a sentence quoting it instead of a call); a model whose name holds `gpt-oss` answers in Harmony (its reasoning, then a
//! call of `get_weather` when the prompt declares it, else a final answer).
//!
//! The prompt's prefix-cache lookup publishes what it stored and evicted as a KV event batch
//! (`Worker::cache_prompt`, sim/kv_events.rs) before the request is admitted.
//!
//! A PD worker (`--pd-role`, protocol in pd/mod.rs, params read by `disagg`): a prefill answers
//! one token (finish "length") once its prompt's prefill time is spent, when it also finishes
//! the call's room on its bootstrap listener; a decode waits for the room's KV before its call
//! answers anything (INTERNAL `KV transfer failed: ...` when it never comes), then generates
//! with no prefill cost and no prompt log-probabilities.

use std::rc::Rc;

use bytes::{Bytes, BytesMut};
use h2::server::SendResponse;
use h2::{RecvStream, SendStream};
use monoio::time::Instant;
use smg_proto::scheduler::generate_complete::MatchedStop;
use smg_proto::scheduler::{
    generate_response, GenerateComplete, GenerateRequest, GenerateStreamChunk, InputLogProbs, InputTokenLogProb,
    OutputLogProbs, TopLogProbs,
};

use crate::sim::faults::{self, Fault};
use crate::sim::grpc::disagg::{self, Received};
use crate::sim::grpc::stream::{gone, response, End};
use crate::sim::grpc::wire::{self, reject, Code, Status};
use crate::sim::grpc::{llama, markup};
use crate::sim::pd::Handoff;
use crate::sim::render::put_json_str;
use crate::sim::timing;
use crate::sim::tokenizer::{self, CONTEXT_LENGTH};
use crate::sim::worker::{bump, Worker};
use crate::sync::Event;

/// What one request will do, decided before it is admitted.
struct Plan {
    prompt_tokens: u32,
    cached_tokens: u32,
    samples: u32,
    /// Tokens per sample, the stop token included when the sample ends on one.
    length: u32,
    /// The stop token the natural end emits; None when the length limit ends the sample.
    natural_stop: Option<u32>,
    stop_ids: Vec<u32>,
    keep_stop: bool,
    truncate_after: Option<u32>,
    hang: bool,
    /// `custom_params.sim_output` as byte tokens.
    forced: Option<Vec<u32>>,
    /// `custom_params.sim_spec_draft` / `sim_spec_accepted`, per sample.
    spec: (u32, u32),
    /// `custom_params.sim_huge_tokens`.
    huge: u32,
    /// The prompt's last token: what the first position's `token_ids_logprob` row follows.
    last_prompt_id: u32,
    /// `return_logprob` with `logprob_start_len` ≥ 0: the prompt's log-probabilities from there.
    input_logprobs: Option<InputLogProbs>,
    /// A PD worker's part: the room a prefill finishes, or the KV a decode waits for.
    handoff: Handoff,
}

pub async fn run(w: &Rc<Worker>, mut body: RecvStream, mut respond: SendResponse<Bytes>) {
    let req: GenerateRequest = match wire::read_request(&mut body).await {
        Ok(r) => r,
        Err(s) => return reject(respond, &s),
    };
    *w.grpc_state.last_generate.borrow_mut() = describe(&req);
    let engine = match w.grpc.as_ref().and_then(|g| g.llama) {
        Some(addr) => Engine::Llama(addr),
        None => match disagg::handoff(w.pd.as_ref().map(|p| p.role), &req).and_then(|h| plan(w, &req, h)) {
            Ok(p) => Engine::Sim(p),
            Err(s) => {
                bump(&w.stats.failed, 1);
                return reject(respond, &s);
            }
        },
    };
    let abort = w.grpc_state.register(&req.request_id);
    let mut aborted = false;
    if let Engine::Sim(Plan { handoff: Handoff::Decode(legs), .. }) = &engine {
        // A decode takes the request into its batch only once the KV is here; without it the
        // request is not generated, and the call fails before its first message.
        match disagg::receive(w, legs, &abort, &mut respond).await {
            Received::Ready => {}
            Received::Aborted => aborted = true,
            Received::Gone => {
                w.grpc_state.unregister(&req.request_id);
                return bump(&w.grpc_state.cancelled, 1);
            }
            Received::Failed(msg) => {
                w.grpc_state.unregister(&req.request_id);
                return reject(respond, &Status::new(Code::INTERNAL, msg));
            }
        }
    }
    let Ok(mut send) = respond.send_response(wire::response_head(), false) else {
        return w.grpc_state.unregister(&req.request_id);
    };
    let outcome = match &engine {
        Engine::Sim(plan) if aborted => finish_all(&req, plan, &mut samples(plan), "abort", &mut send),
        Engine::Sim(plan) => generate(w, &req, plan, &abort, &mut send).await,
        Engine::Llama(addr) => llama::generate(*addr, &req, &abort, &mut send).await,
    };
    w.grpc_state.unregister(&req.request_id);
    match outcome {
        Ok(()) => {
            let _ = send.send_trailers(wire::trailers(None));
            bump(&w.stats.completed, 1);
        }
        Err(End::Failed(s)) => {
            let _ = send.send_trailers(wire::trailers(Some(&s)));
        }
        Err(End::Gone) => bump(&w.grpc_state.cancelled, 1),
    }
    if w.reached_die_after() && !w.died.is_fired() {
        w.die();
    }
}

/// Who samples a call's tokens.
enum Engine {
    /// The simulator, on its timing model.
    Sim(Plan),
    /// A real model on the llama.cpp server at this address (`--llama-url`).
    Llama(std::net::SocketAddr),
}

/// What a wait was ended by.
enum Wake {
    Due,
    Aborted,
}

/// Validates the request, draws its fault, and looks its prompt up in the prefix cache.
fn plan(w: &Worker, req: &GenerateRequest, handoff: Handoff) -> Result<Plan, Status> {
    let ids = req.tokenized.as_ref().map(|t| t.input_ids.as_slice()).unwrap_or(&[]);
    if ids.is_empty() {
        return Err(Status::new(Code::INVALID_ARGUMENT, "the request has no input_ids"));
    }
    if ids.len() as u64 >= CONTEXT_LENGTH as u64 {
        let msg =
            format!("the input ({} tokens) is longer than the model's context length ({CONTEXT_LENGTH})", ids.len());
        return Err(Status::new(Code::INVALID_ARGUMENT, msg));
    }
    if let Some(rank) = req.data_parallel_rank {
        let ranks = &w.stats.dp_rank_requests;
        match usize::try_from(rank).ok().and_then(|r| ranks.get(r)) {
            Some(c) => bump(c, 1),
            None => {
                let msg = format!("data_parallel_rank {rank} out of range (dp_size {})", ranks.len());
                return Err(Status::new(Code::INVALID_ARGUMENT, msg));
            }
        }
    }
    let sp = req.sampling_params.clone().unwrap_or_default();
    if let Some(code) = requested_error(&sp) {
        return Err(Status::new(code, "simulated engine error (custom_params.sim_error)"));
    }
    let mut truncate_after = None;
    let mut hang = false;
    match faults::draw(&w.faults.get(), &w.rng) {
        Fault::Fail { status } => return Err(Status::new(wire::code_for_http(status), "simulated engine failure")),
        Fault::Hang => hang = true,
        Fault::Truncate { after_tokens } => truncate_after = Some(after_tokens),
        Fault::None => {}
    }
    let t = w.timing.get();
    let forced = requested_output(&sp)
        .or_else(|| echo_prompt(&sp).then(|| ids.to_vec()))
        .or_else(|| w.grpc.as_ref().and_then(|g| markup::answer(&g.markup, &req.request_id, ids)))
        .or_else(|| markup::is_harmony_model(&w.model).then(|| markup::harmony_answer(&req.request_id, ids)));
    let stop_id = sp.stop_token_ids.first().copied().unwrap_or(tokenizer::IM_END_ID);
    let (length, natural_stop) = match (&forced, sp.max_new_tokens) {
        // A prefill server answers with the first token only; the decode server generates the rest.
        _ if matches!(handoff, Handoff::Prefill(_)) => (1, None),
        (Some(f), Some(m)) if m as usize <= f.len() => (m, None),
        (Some(f), _) => (f.len() as u32 + 1, Some(stop_id)),
        (None, m) => match m {
            Some(0) => (0, None),
            Some(m) => (timing::output_tokens(&t, Some(m as u64)).0, None),
            None => (timing::output_tokens(&t, None).0, Some(stop_id)),
        },
    };
    let truncate_after = truncate_after.map(|a| a.unwrap_or(length / 2).min(length));
    bump(&w.stats.inference, 1);
    let key = crate::sim::prefix_cache::ids_key(ids, w.cache.borrow().bytes_per_token());
    let cache = w.cache_prompt(&key, Some(ids));
    bump(&w.stats.prompt_tokens, ids.len() as u64);
    bump(&w.stats.cached_tokens, cache.cached_tokens);
    Ok(Plan {
        prompt_tokens: ids.len() as u32,
        cached_tokens: (cache.cached_tokens as u32).min(ids.len() as u32),
        samples: sp.n.max(1),
        length,
        natural_stop,
        stop_ids: sp.stop_token_ids.clone(),
        keep_stop: sp.no_stop_trim,
        truncate_after,
        hang,
        forced,
        spec: (number_param(&sp, "sim_spec_draft"), number_param(&sp, "sim_spec_accepted")),
        huge: number_param(&sp, "sim_huge_tokens"),
        last_prompt_id: ids[ids.len() - 1],
        // A decode server computes no prompt log-probabilities (the prefill did the prompt).
        input_logprobs: if matches!(handoff, Handoff::Decode(_)) { None } else { input_logprobs(req, ids) },
        handoff,
    })
}

/// `custom_params.sim_output`: the text to answer with, as one byte token per byte.
fn requested_output(sp: &smg_proto::scheduler::SamplingParams) -> Option<Vec<u32>> {
    use prost_types::value::Kind;
    match sp.custom_params.as_ref()?.fields.get("sim_output")?.kind.as_ref()? {
        // Harmony's special tokens are their own ids (a gpt-oss answer's structure).
        Kind::StringValue(s) => Some(tokenizer::encode_harmony(s)),
        _ => None,
    }
}

/// A non-negative number from `custom_params` (0 when absent).
fn number_param(sp: &smg_proto::scheduler::SamplingParams, name: &str) -> u32 {
    use prost_types::value::Kind;
    match sp.custom_params.as_ref().and_then(|c| c.fields.get(name)).and_then(|v| v.kind.as_ref()) {
        Some(Kind::NumberValue(n)) if *n >= 0.0 => *n as u32,
        _ => 0,
    }
}

/// `custom_params.sim_echo_prompt`: answer with the prompt's token ids.
fn echo_prompt(sp: &smg_proto::scheduler::SamplingParams) -> bool {
    use prost_types::value::Kind;
    let v = sp.custom_params.as_ref().and_then(|c| c.fields.get("sim_echo_prompt"));
    matches!(v.and_then(|v| v.kind.as_ref()), Some(Kind::BoolValue(true)))
}

/// `custom_params.sim_error`: a per-request engine error for gateway tests.
fn requested_error(sp: &smg_proto::scheduler::SamplingParams) -> Option<Code> {
    use prost_types::value::Kind;
    let v = sp.custom_params.as_ref()?.fields.get("sim_error")?;
    match v.kind.as_ref()? {
        Kind::StringValue(s) => Code::parse(s),
        Kind::NumberValue(n) => Code::parse(&(*n as u32).to_string()),
        _ => None,
    }
}

/// Token `k` of sample `index`: a whole word (with a leading space after the first), fixed by
/// the request id, index and position.
pub fn token_at(request_seed: u64, index: u32, k: u32) -> u32 {
    let mut x = request_seed ^ ((index as u64) << 32 | k as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    // splitmix64's finalizer: neighbouring positions give unrelated words.
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^= x >> 31;
    let n = tokenizer::word_ids().len() as u64;
    tokenizer::word((x % n) as usize, k > 0)
}

pub fn seed_of(request_id: &str) -> u64 {
    // FNV-1a: stable across runs and platforms, unlike std's randomly keyed hasher.
    request_id.bytes().fold(0xCBF2_9CE4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x0100_0000_01B3))
}

/// The log-probability the simulated model gives token `k` of sample `index`.
pub fn logprob_at(request_seed: u64, index: u32, k: u32) -> f32 {
    let x = (request_seed ^ (k as u64).wrapping_mul(31) ^ (index as u64) << 20) % 997;
    -(x as f32) / 400.0
}

/// The `rank`-th alternative (1 and up) to `token` at a position: another word, less likely.
pub fn alternative_at(request_seed: u64, index: u32, k: u32, token: u32, rank: u32) -> (u32, f32) {
    let mut alt = token_at(request_seed ^ rank as u64, index, k);
    let mut salt = 0;
    while alt == token {
        salt += 1;
        alt = token_at(request_seed ^ rank as u64 ^ salt << 40, index, k);
    }
    (alt, logprob_at(request_seed, index, k) - 0.75 * rank as f32)
}

/// `token`'s log-probability entry (one position) as OutputLogProbs, `top` alternatives with it.
fn logprobs_for(request_seed: u64, index: u32, k: u32, token: u32, top: u32, out: &mut OutputLogProbs) {
    let lp = logprob_at(request_seed, index, k);
    out.token_logprobs.push(lp);
    out.token_ids.push(token);
    if top > 0 {
        let mut t = TopLogProbs { values: vec![lp], token_ids: vec![token] };
        for rank in 1..top {
            let (id, v) = alternative_at(request_seed, index, k, token, rank);
            t.token_ids.push(id);
            t.values.push(v);
        }
        out.top_logprobs.push(t);
    }
}

/// The raw log-probability the simulated model gives token `id` right after token `context`
/// (a `token_ids_logprob` entry): reproducible, in [-4, 0], unrelated for neighbouring ids.
pub fn token_id_logprob(context: u32, id: u32) -> f32 {
    let mut x = (u64::from(context) << 32 | u64::from(id)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 29)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^= x >> 32;
    -((x % 1000) as f32) / 250.0
}

/// `token_ids_logprob` rows: one per output position (one for a prefill-only call), each
/// holding the requested ids after the token before that position.
fn token_id_rows(req: &GenerateRequest, plan: &Plan, output: &[u32]) -> Vec<TopLogProbs> {
    let positions = output.len().max(1);
    (0..positions)
        .map(|k| {
            let context = if k == 0 { plan.last_prompt_id } else { output[k - 1] };
            TopLogProbs {
                values: req.token_ids_logprob.iter().map(|&id| token_id_logprob(context, id)).collect(),
                token_ids: req.token_ids_logprob.clone(),
            }
        })
        .collect()
}

/// The prompt's log-probabilities from `logprob_start_len` (none when it is negative): each
/// token's is `token_id_logprob` after the token before it; the first prompt token has none.
fn input_logprobs(req: &GenerateRequest, ids: &[u32]) -> Option<InputLogProbs> {
    let start = usize::try_from(req.logprob_start_len).ok().filter(|_| req.return_logprob)?.min(ids.len());
    Some(InputLogProbs {
        token_logprobs: (start..ids.len())
            .map(|k| InputTokenLogProb { value: (k > 0).then(|| token_id_logprob(ids[k - 1], ids[k])) })
            .collect(),
        token_ids: ids[start..].to_vec(),
        top_logprobs: Vec::new(),
    })
}

/// One sample's progress.
struct Sample {
    output: Vec<u32>,
    /// Log-probabilities of `output` (when asked for).
    logprobs: OutputLogProbs,
    /// Tokens generated, stop token included.
    generated: u32,
    finished: Option<(&'static str, Option<u32>)>,
}

async fn generate(
    w: &Rc<Worker>,
    req: &GenerateRequest,
    plan: &Plan,
    abort: &Event,
    send: &mut SendStream<Bytes>,
) -> Result<(), End> {
    if plan.hang {
        bump(&w.stats.hung, 1);
        wait(None, abort, send).await?;
        return Err(End::Failed(Status::new(Code::ABORTED, "aborted while hanging")));
    }
    let held = plan.prompt_tokens as u64 + plan.length as u64 * plan.samples as u64;
    let permit = monoio::select! {
        p = w.gate.admit(held) => p,
        _ = abort.wait() => return finish_all(req, plan, &mut samples(plan), "abort", send),
        _ = gone(send) => return Err(End::Gone),
    };
    if plan.huge > 0 {
        // The smallest id whose varint takes 4 bytes, repeated.
        let chunk = GenerateStreamChunk { token_ids: vec![1 << 21; plan.huge as usize], ..Default::default() };
        let msg = wire::frame(&response(req, generate_response::Response::Chunk(chunk)));
        send.send_data(msg, false).map_err(|_| End::Gone)?;
    }
    let admitted = Instant::now();
    bump(&w.stats.used_tokens, held);
    let result = decode(w, req, plan, abort, send, admitted).await;
    w.stats.used_tokens.set(w.stats.used_tokens.get() - held);
    drop(permit);
    result
}

fn samples(plan: &Plan) -> Vec<Sample> {
    (0..plan.samples)
        .map(|_| Sample { output: Vec::new(), logprobs: OutputLogProbs::default(), generated: 0, finished: None })
        .collect()
}

async fn decode(
    w: &Rc<Worker>,
    req: &GenerateRequest,
    plan: &Plan,
    abort: &Event,
    send: &mut SendStream<Bytes>,
    admitted: Instant,
) -> Result<(), End> {
    let t = w.timing.get();
    let sched = match plan.handoff {
        // The KV came from the prefill server: no prefill here, the first token is one step away.
        Handoff::Decode(_) => timing::decode_schedule(&t, w.running(), w.max_running),
        _ => timing::schedule(&t, (plan.prompt_tokens - plan.cached_tokens) as u64, w.running(), w.max_running),
    };
    let dynamic = t.itl_batch_factor > 0.0;
    let seed = seed_of(&req.request_id);
    let mut samples = samples(plan);
    let mut out = BytesMut::new();
    let mut due = admitted + sched.first_token;
    for k in 0..plan.length {
        if k > 0 {
            due += if dynamic { timing::itl(&t, w.running(), w.max_running) } else { sched.itl };
        }
        if plan.truncate_after == Some(k) {
            bump(&w.stats.truncated, 1);
            flush(&mut out, send)?;
            return Err(End::Failed(Status::new(Code::INTERNAL, "simulated mid-stream engine failure")));
        }
        if !sched.is_instant() && due > Instant::now() {
            flush(&mut out, send)?;
            if let Wake::Aborted = wait(Some(due), abort, send).await? {
                return finish_all(req, plan, &mut samples, "abort", send);
            }
        } else if abort.is_fired() {
            flush(&mut out, send)?;
            return finish_all(req, plan, &mut samples, "abort", send);
        }
        if let (0, rooms @ [_, ..], Some(pd)) = (k, plan.handoff.finishes(), w.pd.as_ref()) {
            // The prompt's KV exists once its first token is due: from then on the decode may take it.
            for room in rooms {
                pd.rooms.finish(*room);
            }
        }
        for (i, s) in samples.iter_mut().enumerate().filter(|(_, s)| s.finished.is_none()) {
            let natural_end = k + 1 == plan.length && plan.natural_stop.is_some();
            let tok = if natural_end {
                plan.natural_stop.unwrap_or(tokenizer::IM_END_ID)
            } else {
                match plan.forced.as_ref().and_then(|f| f.get(k as usize)) {
                    Some(&b) => b,
                    None => token_at(seed, i as u32, k),
                }
            };
            s.generated += 1;
            bump(&w.stats.output_tokens, 1);
            let is_stop = natural_end || plan.stop_ids.contains(&tok);
            if is_stop {
                s.finished = Some(("stop", Some(tok)));
                if !plan.keep_stop {
                    continue;
                }
            }
            s.output.push(tok);
            let top = req.top_logprobs_num.max(0) as u32;
            if req.return_logprob && !req.stream {
                logprobs_for(seed, i as u32, k, tok, top, &mut s.logprobs);
            }
            if req.stream {
                let output_logprobs = req.return_logprob.then(|| {
                    let mut lp = OutputLogProbs::default();
                    logprobs_for(seed, i as u32, k, tok, top, &mut lp);
                    lp
                });
                let chunk = GenerateStreamChunk {
                    token_ids: vec![tok],
                    prompt_tokens: plan.prompt_tokens,
                    completion_tokens: s.generated,
                    cached_tokens: plan.cached_tokens,
                    index: i as u32,
                    output_logprobs,
                    // A sample's first chunk.
                    input_logprobs: if k == 0 { plan.input_logprobs.clone() } else { None },
                    ..Default::default()
                };
                out.extend_from_slice(&wire::frame(&response(req, generate_response::Response::Chunk(chunk))));
            }
        }
        if samples.iter().all(|s| s.finished.is_some()) {
            break;
        }
    }
    if plan.truncate_after == Some(plan.length) {
        bump(&w.stats.truncated, 1);
        flush(&mut out, send)?;
        return Err(End::Failed(Status::new(Code::INTERNAL, "simulated mid-stream engine failure")));
    }
    flush(&mut out, send)?;
    finish_all(req, plan, &mut samples, "length", send)
}

/// Sends one GenerateComplete per sample; `reason` for samples not finished yet.
fn finish_all(
    req: &GenerateRequest,
    plan: &Plan,
    samples: &mut [Sample],
    reason: &'static str,
    send: &mut SendStream<Bytes>,
) -> Result<(), End> {
    let mut out = BytesMut::new();
    for (i, s) in samples.iter_mut().enumerate() {
        let (finish_reason, matched) = s.finished.unwrap_or((reason, None));
        // Streaming sent them with each token.
        let mut output_logprobs = (req.return_logprob && !req.stream).then(|| std::mem::take(&mut s.logprobs));
        if req.return_logprob && !req.token_ids_logprob.is_empty() {
            output_logprobs.get_or_insert_with(Default::default).token_ids_logprobs =
                token_id_rows(req, plan, &s.output);
        }
        let complete = GenerateComplete {
            output_logprobs,
            output_ids: std::mem::take(&mut s.output),
            finish_reason: finish_reason.into(),
            prompt_tokens: plan.prompt_tokens,
            completion_tokens: s.generated,
            cached_tokens: plan.cached_tokens,
            matched_stop: matched.map(MatchedStop::MatchedTokenId),
            input_logprobs: plan.input_logprobs.clone(),
            // As SGLang: a non-streaming call's Completes all say index 0 (they come in
            // sample order); a stream's name their sample.
            index: if req.stream { i as u32 } else { 0 },
            spec_draft_tokens: plan.spec.0,
            spec_accepted_tokens: plan.spec.1,
            ..Default::default()
        };
        out.extend_from_slice(&wire::frame(&response(req, generate_response::Response::Complete(complete))));
    }
    flush(&mut out, send)
}

/// Hands the messages gathered so far to h2 (one DATA frame for all of them).
fn flush(out: &mut BytesMut, send: &mut SendStream<Bytes>) -> Result<(), End> {
    if out.is_empty() {
        return Ok(());
    }
    send.send_data(out.split().freeze(), false).map_err(|_| End::Gone)
}

/// Waits for `deadline` (None: forever) unless an Abort or the client's going away comes first.
async fn wait(deadline: Option<Instant>, abort: &Event, send: &mut SendStream<Bytes>) -> Result<Wake, End> {
    let sleep = async {
        match deadline {
            Some(d) => monoio::time::sleep_until(d).await,
            None => std::future::pending().await,
        }
    };
    monoio::select! {
        _ = sleep => Ok(Wake::Due),
        _ = abort.wait() => Ok(Wake::Aborted),
        _ = gone(send) => Err(End::Gone),
    }
}

/// The request's parameters as JSON, for /sim/stats "last_generate".
fn describe(req: &GenerateRequest) -> String {
    let sp = req.sampling_params.clone().unwrap_or_default();
    let q = |s: &str| {
        let mut v = Vec::new();
        put_json_str(&mut v, s);
        String::from_utf8(v).unwrap_or_default()
    };
    let ids = req.tokenized.as_ref().map(|t| t.input_ids.len()).unwrap_or(0);
    let stop: Vec<String> = sp.stop.iter().map(|s| q(s)).collect();
    let stop_ids: Vec<String> = sp.stop_token_ids.iter().map(|i| i.to_string()).collect();
    let constraint = match &sp.constraint {
        Some(smg_proto::scheduler::sampling_params::Constraint::Regex(_)) => "\"regex\"",
        Some(smg_proto::scheduler::sampling_params::Constraint::JsonSchema(_)) => "\"json_schema\"",
        Some(smg_proto::scheduler::sampling_params::Constraint::EbnfGrammar(_)) => "\"ebnf_grammar\"",
        Some(smg_proto::scheduler::sampling_params::Constraint::StructuralTag(_)) => "\"structural_tag\"",
        None => "null",
    };
    let opt = |v: Option<String>| v.unwrap_or_else(|| "null".into());
    // The constraint's own text, so gateway tests read what the engine was told to hold.
    let constraint_text = match &sp.constraint {
        Some(
            smg_proto::scheduler::sampling_params::Constraint::Regex(t)
            | smg_proto::scheduler::sampling_params::Constraint::JsonSchema(t)
            | smg_proto::scheduler::sampling_params::Constraint::EbnfGrammar(t)
            | smg_proto::scheduler::sampling_params::Constraint::StructuralTag(t),
        ) => q(t),
        None => "null".into(),
    };
    format!(
        "{{\"request_id\":{},\"input_tokens\":{ids},\"stream\":{},\"n\":{},\"max_new_tokens\":{},\"temperature\":{},\"top_p\":{},\"top_k\":{},\"min_p\":{},\"frequency_penalty\":{},\"presence_penalty\":{},\"repetition_penalty\":{},\"stop\":[{}],\"stop_token_ids\":[{}],\"skip_special_tokens\":{},\"spaces_between_special_tokens\":{},\"ignore_eos\":{},\"no_stop_trim\":{},\"min_new_tokens\":{},\"constraint\":{constraint},\"constraint_text\":{constraint_text},\"return_logprob\":{},\"top_logprobs_num\":{},\"logprob_start_len\":{},\"token_ids_logprob\":[{}],\"data_parallel_rank\":{},\"require_reasoning\":{}}}",
        q(&req.request_id),
        req.stream,
        sp.n,
        opt(sp.max_new_tokens.map(|v| v.to_string())),
        sp.temperature,
        sp.top_p,
        sp.top_k,
        sp.min_p,
        sp.frequency_penalty,
        sp.presence_penalty,
        sp.repetition_penalty,
        stop.join(","),
        stop_ids.join(","),
        sp.skip_special_tokens,
        sp.spaces_between_special_tokens,
        sp.ignore_eos,
        sp.no_stop_trim,
        sp.min_new_tokens,
        req.return_logprob,
        req.top_logprobs_num,
        req.logprob_start_len,
        req.token_ids_logprob.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(","),
        opt(req.data_parallel_rank.map(|v| v.to_string())),
        req.require_reasoning,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_words_and_reproducible() {
        let s = seed_of("req-1");
        let a: Vec<u32> = (0..8).map(|k| token_at(s, 0, k)).collect();
        let b: Vec<u32> = (0..8).map(|k| token_at(s, 1, k)).collect();
        assert_eq!(a, (0..8).map(|k| token_at(seed_of("req-1"), 0, k)).collect::<Vec<_>>());
        assert_ne!(a, b);
        assert!(a[1..].iter().all(|t| tokenizer::word_ids().contains(t)));
        assert!(!tokenizer::token_text(a[0]).starts_with(' '));
    }

    #[test]
    fn cache_key_has_one_token_per_id() {
        assert_eq!(crate::sim::prefix_cache::ids_key(&[1, 2], 4), vec![1, 0, 0, 0, 2, 0, 0, 0]);
        assert_eq!(crate::sim::prefix_cache::ids_key(&[1, 2], 2).len(), 4);
    }
}
