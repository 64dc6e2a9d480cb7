//! System One reply → Decisions response, exactly as the contract's Response table says:
//! answers in question order with their `name` (or `null`), a choice's `value` token as
//! the client sent it (`true` stays distinct from `"true"`), `choice` = the most probable
//! value (the first on a tie), `score` = Σ i·pᵢ over the levels in request order, and a
//! `usage` with no output tokens and both cache counters 0 (unreported). Probabilities are
//! copied as the worker spelled them. Anything that does not fit is `None` (→ 502).

use super::request::Plan;
use crate::contract::decisions::{put_verdict, QuestionKind};
use crate::contract::json::{self, Doc, Kind};
use smg_wire::json::put_str;
use smg_wire::num::put_dec;

/// The Decisions body for a 2xx System One `reply`, with the input tokens it reports, or
/// None when it cannot be mapped.
pub fn map_reply(reply: &[u8], plan: &Plan) -> Option<(Vec<u8>, u64)> {
    let doc = json::parse(reply).ok()?;
    let answers = doc.get_some(0, "answers").filter(|&a| doc.kind(a) == Kind::Object)?;
    let usage = doc.get_some(0, "usage")?;
    let input_tokens = doc.get_some(usage, "input_tokens").filter(|&t| doc.kind(t) == Kind::Number)?;
    let tokens: u64 = std::str::from_utf8(doc.raw(input_tokens)).ok()?.parse().ok()?;
    let mut out = Vec::with_capacity(128 + 96 * plan.questions.len());
    out.extend_from_slice(b"{\"model\":");
    put_str(&mut out, &plan.model);
    out.extend_from_slice(b",\"answers\":[");
    let mut id = Vec::with_capacity(4);
    for (i, q) in plan.questions.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        id.clear();
        put_dec(&mut id, i as u64);
        let a = doc.members(answers).find(|&(k, _)| *doc.key(k) == id[..]).map(|(_, v)| v)?;
        let kind = doc.get_some(a, "type")?;
        let (wire, name) = match q.kind {
            QuestionKind::Predicate => ("noul", "predicate"),
            QuestionKind::Choice => ("choice", "choice"),
            QuestionKind::Score => ("score", "score"),
        };
        if doc.kind(kind) != Kind::String || !doc.str_is(kind, wire) {
            return None;
        }
        out.extend_from_slice(b"{\"type\":\"");
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b"\",\"name\":");
        out.extend_from_slice(&q.name);
        match q.kind {
            QuestionKind::Predicate => {
                let p = probability(&doc, doc.get_some(a, "noul")?)?;
                out.extend_from_slice(b",\"probability\":");
                out.extend_from_slice(doc.raw(p));
            }
            QuestionKind::Choice | QuestionKind::Score => {
                let probs = doc.get_some(a, "probabilities").filter(|&p| doc.kind(p) == Kind::Object)?;
                let confidence = probability(&doc, doc.get_some(a, "confidence")?)?;
                let mut found = Vec::with_capacity(q.values.len());
                for j in 0..q.values.len() {
                    let p = match q.kind {
                        QuestionKind::Choice => doc.get(probs, &q.keys[j]),
                        _ => doc.get(probs, &j.to_string()),
                    };
                    found.push(probability(&doc, p?)?);
                }
                let ps: Vec<f64> = found.iter().map(|&p| doc.number(p)).collect();
                let raw = |out: &mut Vec<u8>, v: usize| out.extend_from_slice(doc.raw(v));
                put_verdict(&mut out, q.kind, &q.values, &ps, |o, j| raw(o, found[j]), |o, _| raw(o, confidence));
            }
        }
        out.push(b'}');
    }
    out.extend_from_slice(b"],\"usage\":{\"input_tokens\":");
    put_dec(&mut out, tokens);
    out.extend_from_slice(b",\"output_tokens\":0,\"total_tokens\":");
    put_dec(&mut out, tokens);
    out.extend_from_slice(
        b",\"input_tokens_details\":{\"cached_tokens\":0,\"cache_write_tokens\":0},\"output_tokens_details\":{\"reasoning_tokens\":0}}}",
    );
    Some((out, tokens))
}

/// A number in 0–1 (finite), kept as its tape index so its spelling is copied.
fn probability(doc: &Doc<'_>, v: usize) -> Option<usize> {
    if doc.kind(v) != Kind::Number {
        return None;
    }
    let p = doc.number(v);
    (p.is_finite() && (0.0..=1.0).contains(&p)).then_some(v)
}
