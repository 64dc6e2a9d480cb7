//! Phase: inspect. Validates the body against the endpoint's schema where the contract
//! models one (and plans its splices on the original bytes); elsewhere reads only `model`,
//! from the JSON body (`session.model` for realtime client secrets) or, for transcriptions
//! and realtime calls, from the multipart form (or a calls offer's query).

use sonic_rs::JsonValueTrait;

use super::ctx::RequestCtx;
use super::error::Failure;
use crate::api::{realtime, transcriptions, EndpointSpec};
use crate::contract;
use crate::http::body::Body;
use crate::http::head::RequestHead;
use crate::shard::Shard;

/// The body to forward: the one received, or its rewrite when the contract edits it.
pub fn inspect(
    shard: &Shard,
    spec: &EndpointSpec,
    head: &RequestHead,
    buf: &[u8],
    body: Body,
    ctx: &mut RequestCtx,
) -> Result<Body, Failure> {
    let received = body.bytes(buf);
    ctx.bytes_in = received.len() as u64;
    let Some(schema) = spec.schema else {
        if spec.path == transcriptions::PATH {
            return transcription(shard, head, buf, body, ctx);
        }
        if spec.path == realtime::CALLS {
            let query_model = crate::realtime::query::param(&buf[head.target.clone()], b"model");
            let model = realtime::calls_model(head.header(buf, "content-type"), received, query_model.as_deref())
                .map_err(Failure::Rejected)?;
            let aliases = &shard.cfg().aliases;
            let canonical = (!aliases.is_empty()).then(|| aliases.resolve(&model)).flatten();
            ctx.model = Some(canonical.map_or(model, str::to_owned));
            return Ok(body);
        }
        // Nothing recursive reads a body nested deeper than the contract's scanner allows.
        if let Err(e) = crate::bounded_json::check(received) {
            let msg = format!("JSON syntax error: Failed to parse the request body as JSON: {e}");
            return Err(Failure::Invalid(contract::ContractError::JsonParse(msg)));
        }
        let (model, alias) = lazy_model(received, realtime::model_path(spec.path), &shard.cfg().aliases);
        ctx.model = model;
        // An alias is spliced over the `model` string, as the modeled endpoints do.
        return Ok(match alias {
            Some(edit) => Body::Owned(contract::apply(received, &[edit])),
            None => body,
        });
    };
    let ins =
        contract::inspect(schema, received, head.content_type_json, &shard.cfg().aliases).map_err(Failure::Invalid)?;
    if let Some(w) = ins.warnings.first() {
        crate::warn!("request {}: {w}", ctx.id_str());
    }
    ctx.model = Some(ins.model);
    ctx.streaming = ins.stream;
    ctx.max_output = ins.max_output;
    ctx.choices = ins.choices;
    ctx.profile = ins.profile;
    // Splices on the original bytes; no edits means no copy.
    if ins.edits.is_empty() {
        Ok(body)
    } else {
        Ok(Body::Owned(contract::apply(received, &ins.edits)))
    }
}

/// A transcription form: checked as it streams through the multipart reader (a plain-text
/// `400` when the contract refuses it), routed on its `model` field. An alias is spliced
/// over that field's value; otherwise the form goes on byte for byte.
fn transcription(
    shard: &Shard,
    head: &RequestHead,
    buf: &[u8],
    body: Body,
    ctx: &mut RequestCtx,
) -> Result<Body, Failure> {
    let received = body.bytes(buf);
    let form = transcriptions::validate(head.header(buf, "content-type"), received).map_err(Failure::Form)?;
    ctx.streaming = form.stream;
    let aliases = &shard.cfg().aliases;
    let canonical = (!aliases.is_empty()).then(|| aliases.resolve(&form.model)).flatten();
    let Some(canonical) = canonical else {
        ctx.model = Some(form.model);
        return Ok(body);
    };
    let at = form.model_at;
    let edit = contract::Splice { start: at.start, end: at.end, text: canonical.as_bytes().to_vec() };
    let rewritten = Body::Owned(contract::apply(received, &[edit]));
    ctx.model = Some(canonical.to_owned());
    Ok(rewritten)
}

/// For endpoints without a modeled schema: only `model`, with a lazy get (DESIGN.md measured
/// ~0.2 µs when it comes early in the body) on a body known to be shallow enough for it
/// (`bounded_json`), resolved through `--model-alias`; an alias
/// comes back with the splice that puts the canonical id in its place. The relay needs no
/// `stream` flag because it forwards whatever framing the worker answers with.
fn lazy_model(body: &[u8], at: &[&str], aliases: &contract::Aliases) -> (Option<String>, Option<contract::Splice>) {
    let Ok(v) = sonic_rs::get(body, at) else { return (None, None) };
    let Some(name) = v.as_str() else { return (None, None) };
    let Some(canonical) = (!aliases.is_empty()).then(|| aliases.resolve(name)).flatten() else {
        return (Some(name.to_owned()), None);
    };
    // Where the raw string token sits in the body (the lazy value borrows it).
    let raw = v.as_raw_str().as_bytes();
    let start = (raw.as_ptr() as usize).wrapping_sub(body.as_ptr() as usize);
    let edit = (start + raw.len() <= body.len() && body.get(start..start + raw.len()) == Some(raw)).then(|| {
        let mut text = Vec::with_capacity(canonical.len() + 2);
        smg_wire::json::put_str(&mut text, canonical);
        contract::Splice { start, end: start + raw.len(), text }
    });
    (Some(canonical.to_owned()), edit)
}
