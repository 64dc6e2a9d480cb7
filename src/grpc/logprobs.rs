//! Token log-probabilities: the engine's `OutputLogProbs` (one entry per generated token,
//! with its top alternatives) written as OpenAI's two shapes — Chat Completions'
//! `{"content":[{"token","logprob","bytes","top_logprobs"}]}` and the legacy Completions'
//! `{"tokens","token_logprobs","top_logprobs","text_offset"}`.
//!
//! A token is shown as its own bytes (`bytes`) and their text (lossy where a byte-level
//! piece is part of a character), as OpenAI does; not through the stream's detokenizer,
//! which holds such pieces back.

use std::io::Write as _;

use smg_proto::scheduler::OutputLogProbs;
use smg_wire::json::put_str;
use smg_wire::num::put_dec;

use super::request::Kind;
use crate::tokenizer::Tokenizer;

/// One generated token's log-probability and its top alternatives.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub id: u32,
    pub logprob: f32,
    pub top: Vec<(u32, f32)>,
}

/// Entries for the first `n` positions of `lp` (the tokens the gateway kept of a message).
pub fn take(lp: &OutputLogProbs, n: usize, out: &mut Vec<Entry>) {
    for i in 0..n.min(lp.token_logprobs.len()) {
        let top = lp
            .top_logprobs
            .get(i)
            .map(|t| t.token_ids.iter().copied().zip(t.values.iter().copied()).collect())
            .unwrap_or_default();
        out.push(Entry { id: lp.token_ids.get(i).copied().unwrap_or(0), logprob: lp.token_logprobs[i], top });
    }
}

/// A JSON number for a log-probability: the shortest form that reads back the same f32;
/// −∞ (a token the sampler could not pick) as OpenAI's −9999.0, JSON having no infinity.
fn put_logprob(out: &mut Vec<u8>, v: f32) {
    if v.is_finite() {
        let _ = write!(out, "{v:?}");
    } else {
        out.extend_from_slice(b"-9999.0");
    }
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    out.push(b'[');
    for (i, &x) in b.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        put_dec(out, x as u64);
    }
    out.push(b']');
}

/// Where the text of the next entry starts, in characters of the choice's text so far (the
/// legacy `text_offset`); carried across a stream's chunks.
#[derive(Debug, Default, Clone, Copy)]
pub struct Offset(pub u64);

/// `entries` as the `logprobs` value of a choice of `kind`; `top` is how many alternatives
/// the client asked for (Completions shows `top_logprobs: null` for none).
pub fn put(out: &mut Vec<u8>, kind: Kind, tok: &Tokenizer, entries: &[Entry], top: u32, offset: &mut Offset) {
    match kind {
        Kind::Chat => put_chat(out, tok, entries),
        // `/generate`'s triples are written by native.rs.
        Kind::Completions | Kind::Generate => put_legacy(out, tok, entries, top, offset),
    }
}

fn put_chat(out: &mut Vec<u8>, tok: &Tokenizer, entries: &[Entry]) {
    if entries.is_empty() {
        out.extend_from_slice(b"{\"content\":null}");
        return;
    }
    let one = |out: &mut Vec<u8>, id: u32, lp: f32| {
        let bytes = tok.token_bytes(id);
        out.extend_from_slice(b"{\"token\":");
        put_str(out, &String::from_utf8_lossy(&bytes));
        out.extend_from_slice(b",\"logprob\":");
        put_logprob(out, lp);
        out.extend_from_slice(b",\"bytes\":");
        put_bytes(out, &bytes);
    };
    out.extend_from_slice(b"{\"content\":[");
    for (i, e) in entries.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        one(out, e.id, e.logprob);
        out.extend_from_slice(b",\"top_logprobs\":[");
        for (j, &(id, lp)) in e.top.iter().enumerate() {
            if j > 0 {
                out.push(b',');
            }
            one(out, id, lp);
            out.push(b'}');
        }
        out.extend_from_slice(b"]}");
    }
    out.extend_from_slice(b"]}");
}

fn put_legacy(out: &mut Vec<u8>, tok: &Tokenizer, entries: &[Entry], top: u32, offset: &mut Offset) {
    out.extend_from_slice(b"{\"tokens\":[");
    for (i, e) in entries.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        put_str(out, &String::from_utf8_lossy(&tok.token_bytes(e.id)));
    }
    out.extend_from_slice(b"],\"token_logprobs\":[");
    for (i, e) in entries.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        put_logprob(out, e.logprob);
    }
    out.extend_from_slice(b"],\"top_logprobs\":");
    if top == 0 {
        out.extend_from_slice(b"null");
    } else {
        out.push(b'[');
        for (i, e) in entries.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.push(b'{');
            let mut first = true;
            for &(id, lp) in &e.top {
                let bytes = tok.token_bytes(id);
                let text = String::from_utf8_lossy(&bytes);
                // Two alternatives with the same text are one key; the likelier is listed first.
                if e.top
                    .iter()
                    .take_while(|&&(other, _)| other != id)
                    .any(|&(other, _)| String::from_utf8_lossy(&tok.token_bytes(other)) == text)
                {
                    continue;
                }
                if !first {
                    out.push(b',');
                }
                first = false;
                put_str(out, &text);
                out.push(b':');
                put_logprob(out, lp);
            }
            out.push(b'}');
        }
        out.push(b']');
    }
    out.extend_from_slice(b",\"text_offset\":[");
    for (i, e) in entries.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        put_dec(out, offset.0);
        offset.0 += String::from_utf8_lossy(&tok.token_bytes(e.id)).chars().count() as u64;
    }
    out.extend_from_slice(b"]}");
}

#[cfg(test)]
mod tests {
    use super::*;
    use smg_proto::scheduler::TopLogProbs;

    #[test]
    fn numbers_round_trip_and_infinity_is_openais_floor() {
        let mut out = Vec::new();
        put_logprob(&mut out, -0.1);
        out.push(b' ');
        put_logprob(&mut out, f32::NEG_INFINITY);
        out.push(b' ');
        put_logprob(&mut out, 0.0);
        assert_eq!(String::from_utf8(out).unwrap(), "-0.1 -9999.0 0.0");
    }

    #[test]
    fn take_keeps_the_positions_asked_for() {
        let lp = OutputLogProbs {
            token_logprobs: vec![-0.5, -1.0, -2.0],
            token_ids: vec![7, 8, 9],
            top_logprobs: vec![TopLogProbs { values: vec![-0.5, -0.9], token_ids: vec![7, 3] }],
            token_ids_logprobs: vec![],
        };
        let mut out = Vec::new();
        take(&lp, 2, &mut out);
        assert_eq!(
            out,
            vec![
                Entry { id: 7, logprob: -0.5, top: vec![(7, -0.5), (3, -0.9)] },
                Entry { id: 8, logprob: -1.0, top: vec![] }
            ]
        );
        take(&lp, 10, &mut out);
        assert_eq!(out.len(), 5, "every position there is, after the two before");
    }
}
