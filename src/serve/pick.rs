//! Phase: pick. Chooses a healthy worker that serves the model, by the shard's own policy
//! state. The body is scanned only when the policy routes on text (or pins by `rid`), and
//! not for text at all when a valid `X-SMG-Routing-Tokens` hint already says it.

use std::rc::Rc;

use super::ctx::{Chosen, Picked, RequestCtx};
use super::error::Failure;
use crate::api::{ApiError, EndpointSpec};
use crate::contract;
use crate::http::head::RequestHead;
use crate::routing::{first_routing_key, parse_routing_tokens, scan_body, RouteError, RouteInput, RoutingSignal};
use crate::shard::{LoadGuard, LocalSnapshot, Shard};
use crate::workers::snapshot::{Role, Runtime, Worker};
use crate::workers::{Candidates, WorkerId};

/// Decisions go to regular HTTP workers of any engine (SGLang's through the System One
/// translation, any other byte for byte to its own `/v1/decisions`) and to SGLang gRPC
/// workers (scored through the engine: serve/grpc.rs); external APIs do not serve them.
fn decisions_eligible(w: &Worker) -> bool {
    match w.url.grpc {
        true => w.meta.runtime == Runtime::Sglang,
        false => w.meta.runtime != Runtime::External,
    }
}

/// Whether `w` can serve the route: every worker serves chat, completions and `/generate`
/// ([`served_by_all`]; on gRPC workers the gateway renders the prompt and assembles the
/// answer); gRPC workers serve embeddings when their model embeds; Decisions go where
/// [`decisions_eligible`] says; every other route is forwarded as sent, so it needs an HTTP
/// worker. In a fleet where a model has both kinds, such a request goes to an HTTP worker.
fn serves(spec: &EndpointSpec, w: &Worker) -> bool {
    match spec.schema {
        // The gateway's Responses turns run as chats on gRPC workers.
        _ if spec.turn => w.url.grpc && w.meta.role == Role::Regular,
        _ if served_by_all(spec) => true,
        // A pair serves generation only (chat, completions, `/generate`), as in SMG.
        _ if w.meta.role != Role::Regular => false,
        Some(contract::Endpoint::Decisions) => decisions_eligible(w),
        // An embedding model's gRPC workers embed (the Embed RPC); a generation model's do not.
        _ if spec.path == super::grpc::EMBEDDINGS => !w.meta.grpc.as_ref().is_some_and(|m| m.is_generation),
        _ => !w.url.grpc,
    }
}

/// Every worker serves the route (chat, completions, and SGLang's `/generate`, which the
/// gateway speaks to gRPC workers too: grpc/native.rs): no worker list need be scanned.
fn served_by_all(spec: &EndpointSpec) -> bool {
    matches!(spec.schema, Some(contract::Endpoint::ChatCompletions | contract::Endpoint::Completions))
        || spec.path == super::grpc::GENERATE
}

/// The model has workers, but none of them can serve this route (only gRPC workers, or
/// only prefill/decode pairs (`pairs`), for a route they do not take): the contract's code
/// for it.
fn unservable(spec: &EndpointSpec, model: &str, pairs: bool) -> ApiError {
    match spec.schema {
        Some(contract::Endpoint::Decisions) => ApiError::decisions_not_supported(model),
        _ if pairs => ApiError::new(
            501,
            "not_implemented",
            format!("Model '{model}' is served by prefill/decode pairs, which do not serve {}", spec.path),
        ),
        _ if spec.path == crate::api::transcriptions::PATH => ApiError::new(
            400,
            "audio_transcription_model_not_supported",
            format!("Model '{model}' is served by gRPC workers only, which do not transcribe it"),
        ),
        _ => ApiError::new(
            503,
            "no_available_workers",
            format!("No available workers for model '{model}': its gRPC workers do not serve {}", spec.path),
        ),
    }
}

/// Picks a worker for `ctx` unless one is already chosen. `avoid`: workers that failed this
/// request already; they are passed over while any other candidate is left.
// The phases' shared state, passed as the other phases take it.
#[allow(clippy::too_many_arguments)]
pub fn pick_worker(
    shard: &Rc<Shard>,
    spec: &EndpointSpec,
    head: &RequestHead,
    buf: &[u8],
    body: &[u8],
    ctx: &mut RequestCtx,
    avoid: &[WorkerId],
    tokens: Option<&[u32]>,
) -> Result<Picked, Failure> {
    // The retry edge comes back here. A retry after a stale pooled socket goes to the same
    // worker on a fresh connection (the worker did nothing wrong): it is still chosen. A
    // retry after a worker failure cleared the choice and selects again.
    if let Some(c) = &ctx.chosen {
        return Ok(c.picked.clone());
    }
    // A new choice: what an earlier attempt predicted was for another worker.
    ctx.kv_predicted = None;
    if spec.realtime {
        return pick_realtime(shard, head, buf, ctx, avoid);
    }
    let snap = shard.snapshot();
    let model = ctx.model.as_deref();
    let by_all = served_by_all(spec);
    if !by_all && !matches!(snap.candidates(model), Candidates::UnknownModel) {
        let of_model = |w: &Worker| model.is_none_or(|m| w.model.as_deref() == Some(m));
        if !snap.workers.iter().any(|w| of_model(w) && serves(spec, w)) {
            let pairs = snap.workers.iter().any(|w| of_model(w) && w.meta.role != Role::Regular);
            return Err(unservable(spec, model.unwrap_or(""), pairs).into());
        }
    }
    let all = match snap.candidates(model) {
        Candidates::UnknownModel => return Err(ApiError::model_not_found(model.unwrap_or("")).into()),
        Candidates::AllDown => return Err(ApiError::no_available_workers(model).into()),
        Candidates::Overloaded(_) if shard.cfg().overload_shed => {
            let secs = shard.cfg().load_interval.as_secs();
            return Err(ApiError::overload_shed(model, secs).into());
        }
        Candidates::Overloaded(list) => {
            // SMG's fallback without --worker-overload-shed: the least loaded of them.
            let fits = |p: &usize| serves(spec, &snap.workers[*p]);
            let least = list.iter().copied().filter(fits).min_by_key(|&p| snap.workers[p].engine_load.unwrap_or(0));
            let Some(pos) = least else { return Err(ApiError::no_available_workers(model).into()) };
            let now = crate::clock::now();
            let input = RouteInput { model: model.unwrap_or(""), ..RouteInput::default() };
            let prefill = pick_prefill(shard, &snap, pos, &input, avoid, now)?;
            ctx.timings.upstream_started = Some(now);
            return Ok(chosen(shard, ctx, Picked::new(snap.clone(), pos, prefill.as_ref().map(|p| p.0)), prefill));
        }
        Candidates::Healthy(list) => list,
    };
    let eligible: Vec<usize>;
    let all = if by_all || all.iter().all(|&p| serves(spec, &snap.workers[p])) {
        all
    } else {
        eligible = all.iter().copied().filter(|&p| serves(spec, &snap.workers[p])).collect();
        if eligible.is_empty() {
            return Err(ApiError::no_available_workers(model).into());
        }
        &eligible
    };
    let spared: Vec<usize>;
    let positions = if avoid.is_empty() {
        all
    } else {
        spared = all.iter().copied().filter(|&p| !avoid.contains(&snap.workers[p].id)).collect();
        if spared.is_empty() {
            all
        } else {
            &spared
        }
    };
    let cfg = &shard.cfg().routing;
    let header = |name: &str| head.header(buf, name).and_then(|v| std::str::from_utf8(v).ok());
    // The gateway's own token ids (gRPC workers) are what the engine will see: they win over
    // a routing hint, which the contract reads on the HTTP path only.
    // Nor is it read in PD mode (the contract's rule).
    let hint = if tokens.is_some() || snap.has_pairs() {
        None
    } else {
        head.header(buf, "x-smg-routing-tokens").and_then(parse_routing_tokens)
    };
    // An HTTP worker that sends KV-cache events is matched on the ids its engine will compute
    // (`--tokenizer-path`); only the decision reads them, the body goes as it came.
    let engine_ids = match (tokens, &hint, spec.text) {
        (None, None, Some(source)) => shard.prompt_ids(source, body, &snap, positions),
        _ => None,
    };
    let tokens = tokens.or(hint.as_deref()).or(engine_ids.as_deref());
    let wants_text = cfg.policy.uses_text() && tokens.is_none();
    let fields = if wants_text || cfg.routing_key_override { spec.text.and_then(|k| scan_body(k, body)) } else { None };
    let (text, body_tokens) = match fields.as_ref().and_then(|f| f.signal.as_ref()) {
        Some(RoutingSignal::Text(t)) => (Some(t.as_str()), None),
        Some(RoutingSignal::Tokens(t)) => (None, Some(t.as_slice())),
        None => (None, None),
    };
    let input = RouteInput {
        model: model.unwrap_or(""),
        text,
        tokens: tokens.or(body_tokens),
        namespace: fields.as_ref().and_then(|f| f.namespace.as_deref()),
        routing_key: first_routing_key(&cfg.routing_key_headers, |n| head.header(buf, n)),
        target_worker: header("x-smg-target-worker"),
        authorization: header("authorization"),
        forwarded_for: header("x-forwarded-for"),
        cookie: header("cookie"),
        rid: if cfg.routing_key_override { fields.as_ref().and_then(|f| f.rid.as_deref()) } else { None },
    };
    // One clock read serves the router and the start of the upstream exchange
    // (`--request-timeout-secs` counts from here: queue and body time are not the worker's).
    let now = crate::clock::now();
    ctx.timings.upstream_started = Some(now);
    match shard.pick(&input, &snap, positions, now) {
        Ok(choice) => {
            let pos = positions[choice.index];
            let prefill = pick_prefill(shard, &snap, pos, &input, avoid, now)?;
            // A pair's prefill worker holds the cache; the metric reads single workers only.
            ctx.kv_predicted = choice.cached.filter(|_| prefill.is_none()).map(|c| c as u64);
            Ok(chosen(shard, ctx, Picked::new(snap.clone(), pos, prefill.as_ref().map(|p| p.0)), prefill))
        }
        Err(RouteError::NoWorker) => Err(ApiError::no_available_workers(model).into()),
    }
}

/// The request's choice, kept in the context with its counts on the workers' loads.
fn chosen(shard: &Rc<Shard>, ctx: &mut RequestCtx, picked: Picked, prefill: Option<(usize, LoadGuard)>) -> Picked {
    let load = shard.hold_load(picked.worker().id);
    let prefill_load = prefill.map(|p| p.1);
    ctx.chosen = Some(Chosen { picked: picked.clone(), _load: load, _prefill_load: prefill_load });
    picked
}

/// For a decode worker (at `pos`), its prefill leg: a routable prefill worker of the same
/// model, by the prefill policy (passing over those in `avoid` while others are left), with
/// its count on the worker's load. None for any other worker. No prefill worker up: 503
/// `no_available_workers`, as for a model with no worker up.
fn pick_prefill(
    shard: &Rc<Shard>,
    snap: &LocalSnapshot,
    pos: usize,
    input: &RouteInput<'_>,
    avoid: &[WorkerId],
    now: std::time::Instant,
) -> Result<Option<(usize, LoadGuard)>, Failure> {
    let decode = &snap.workers[pos];
    if decode.meta.role != Role::Decode {
        return Ok(None);
    }
    let model = decode.model.as_deref().unwrap_or("");
    // A pair speaks one protocol: an HTTP decode takes an HTTP prefill, a gRPC one a gRPC one.
    let same: Vec<usize> = snap
        .prefill_candidates(model)
        .iter()
        .copied()
        .filter(|&p| snap.workers[p].url.grpc == decode.url.grpc)
        .collect();
    let spared: Vec<usize>;
    let positions = if avoid.is_empty() || same.iter().all(|&p| avoid.contains(&snap.workers[p].id)) {
        &same
    } else {
        spared = same.iter().copied().filter(|&p| !avoid.contains(&snap.workers[p].id)).collect();
        &spared
    };
    let no_prefill = || {
        Failure::from(ApiError::new(
            503,
            "no_available_workers",
            format!("No available prefill workers for model '{model}': all are unhealthy or their circuit breakers are open"),
        ))
    };
    if positions.is_empty() {
        return Err(no_prefill());
    }
    match shard.pick_prefill(input, snap, positions, now) {
        Ok(c) => Ok(Some((positions[c.index], shard.hold_load(snap.workers[positions[c.index]].id)))),
        Err(RouteError::NoWorker) => Err(no_prefill()),
    }
}

/// A worker that advertises the Realtime API (SMG's `realtime: "true"` label).
fn realtime_capable(w: &Worker) -> bool {
    w.meta.labels.iter().any(|(k, v)| k == "realtime" && v == "true")
}

/// Phase: pick, for the realtime routes, as SMG picks for them whatever the routing policy:
/// the least loaded healthy worker labeled `realtime: "true"` that serves the model (a
/// session is long: its load says more than any policy's key). No such worker at all: 404
/// `model_not_found`; only unhealthy ones: 503 `no_available_workers`. A request with no
/// `Authorization` for a worker with no key of its own is a 401 (SMG forwards one always).
pub fn pick_realtime(
    shard: &Rc<Shard>,
    head: &RequestHead,
    buf: &[u8],
    ctx: &mut RequestCtx,
    avoid: &[WorkerId],
) -> Result<Picked, Failure> {
    let snap = shard.snapshot();
    let model = ctx.model.as_deref().unwrap_or("");
    let mut any = false;
    let mut best: Option<(usize, (bool, usize))> = None;
    for (pos, w) in snap.workers.iter().enumerate() {
        if w.model.as_deref() != Some(model) || !realtime_capable(w) {
            continue;
        }
        any = true;
        if !w.healthy {
            continue;
        }
        let key = (avoid.contains(&w.id), shard.load_of(w.id));
        if best.is_none_or(|(_, b)| key < b) {
            best = Some((pos, key));
        }
    }
    if !any {
        return Err(ApiError::model_not_found(model).into());
    }
    let Some((pos, _)) = best else { return Err(ApiError::no_available_workers(Some(model)).into()) };
    if head.header(buf, "authorization").is_none() && snap.workers[pos].meta.api_key.is_none() {
        return Err(Failure::Unauthorized);
    }
    ctx.timings.upstream_started = Some(crate::clock::now());
    Ok(chosen(shard, ctx, Picked::new(snap.clone(), pos, None), None))
}
