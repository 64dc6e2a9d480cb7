//! SGLang's native `/generate` answer, written from a gRPC engine's messages: what an SGLang
//! HTTP server answers, so a client moves between the two without noticing.
//!
//! One object per sample: `text`, `output_ids`, and `meta_info` (`id`, `finish_reason`,
//! `prompt_tokens`, `completion_tokens`, `cached_tokens`, and with `return_logprob` the
//! output tokens' `[logprob, id, null]` triples, their alternatives when `top_logprobs_num`
//! asks, and the prompt's from `logprob_start_len` as the engine sent them: on a stream's
//! first event of each sample). A request with one sample answers the object, a batch or `n > 1`
//! an array of them in sample order. Streamed, every event carries the sample's whole text so
//! far (SGLang's default), the new token ids, and its `index`; `finish_reason` is null until
//! the sample's last event; `data: [DONE]` ends the stream.

use smg_proto::scheduler::generate_complete::MatchedStop;
use smg_wire::json::put_str;
use smg_wire::num::put_dec;

use super::logprobs::Entry;

/// A prompt token's log-probability (none for the first) and id.
pub type InputEntry = (Option<f32>, u32);

/// Why a sample ended, as `meta_info.finish_reason` says it.
#[derive(Debug, Clone, PartialEq)]
pub enum Finish<'a> {
    /// A stop token or string (`matched`), or the model's end.
    Stop(Option<Matched<'a>>),
    Length(u64),
    Abort,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Matched<'a> {
    Token(u32),
    Text(&'a str),
}

impl<'a> Matched<'a> {
    pub fn of(m: &'a MatchedStop) -> Self {
        match m {
            MatchedStop::MatchedTokenId(t) => Matched::Token(*t),
            MatchedStop::MatchedStopStr(s) => Matched::Text(s),
        }
    }
}

/// One sample's object (or event).
pub struct Sample<'a> {
    pub id: &'a str,
    pub text: &'a str,
    pub output_ids: &'a [u32],
    /// None while a stream goes on.
    pub finish: Option<Finish<'a>>,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub cached_tokens: u64,
    /// `return_logprob`: the output tokens' entries, with this many alternatives each.
    pub logprobs: Option<(&'a [Entry], u32)>,
    /// `return_logprob` with `logprob_start_len`: the prompt's tokens from there, each with its
    /// log-probability (the first prompt token has none).
    pub input_logprobs: Option<&'a [InputEntry]>,
    /// A stream event's sample index.
    pub index: Option<u32>,
}

fn put_triple(out: &mut Vec<u8>, logprob: Option<f32>, id: u32) {
    use std::io::Write;
    out.push(b'[');
    match logprob.filter(|l| l.is_finite()) {
        Some(l) => {
            let _ = write!(out, "{l}");
        }
        None => out.extend_from_slice(b"null"),
    }
    out.push(b',');
    put_dec(out, u64::from(id));
    out.extend_from_slice(b",null]");
}

fn put_finish(out: &mut Vec<u8>, f: &Option<Finish<'_>>) {
    match f {
        None => out.extend_from_slice(b"null"),
        Some(Finish::Stop(m)) => {
            out.extend_from_slice(b"{\"type\":\"stop\",\"matched\":");
            match m {
                None => out.extend_from_slice(b"null"),
                Some(Matched::Token(t)) => put_dec(out, u64::from(*t)),
                Some(Matched::Text(s)) => put_str(out, s),
            }
            out.push(b'}');
        }
        Some(Finish::Length(n)) => {
            out.extend_from_slice(b"{\"type\":\"length\",\"length\":");
            put_dec(out, *n);
            out.push(b'}');
        }
        Some(Finish::Abort) => out.extend_from_slice(b"{\"type\":\"abort\"}"),
    }
}

/// The sample's JSON object.
pub fn put_sample(out: &mut Vec<u8>, s: &Sample<'_>) {
    out.extend_from_slice(b"{\"text\":");
    put_str(out, s.text);
    out.extend_from_slice(b",\"output_ids\":[");
    for (i, id) in s.output_ids.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        put_dec(out, u64::from(*id));
    }
    out.extend_from_slice(b"],\"meta_info\":{\"id\":");
    put_str(out, s.id);
    out.extend_from_slice(b",\"finish_reason\":");
    put_finish(out, &s.finish);
    for (k, v) in [
        (&b",\"prompt_tokens\":"[..], s.prompt_tokens),
        (b",\"completion_tokens\":", s.completion_tokens),
        (b",\"cached_tokens\":", s.cached_tokens),
    ] {
        out.extend_from_slice(k);
        put_dec(out, v);
    }
    if let Some(input) = s.input_logprobs {
        out.extend_from_slice(b",\"input_token_logprobs\":[");
        for (i, (lp, id)) in input.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            put_triple(out, *lp, *id);
        }
        out.push(b']');
    }
    if let Some((entries, top)) = s.logprobs {
        out.extend_from_slice(b",\"output_token_logprobs\":[");
        for (i, e) in entries.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            put_triple(out, Some(e.logprob), e.id);
        }
        out.push(b']');
        if top > 0 {
            out.extend_from_slice(b",\"output_top_logprobs\":[");
            for (i, e) in entries.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                out.push(b'[');
                for (j, (id, lp)) in e.top.iter().take(top as usize).enumerate() {
                    if j > 0 {
                        out.push(b',');
                    }
                    put_triple(out, Some(*lp), *id);
                }
                out.push(b']');
            }
            out.push(b']');
        }
    }
    out.push(b'}');
    if let Some(i) = s.index {
        out.extend_from_slice(b",\"index\":");
        put_dec(out, u64::from(i));
    }
    out.push(b'}');
}

/// The whole body: the object of a single sample, else the array of them.
pub fn full(samples: &[Sample<'_>]) -> Vec<u8> {
    let mut out = Vec::with_capacity(samples.iter().map(|s| s.text.len() + 8 * s.output_ids.len() + 160).sum());
    if let [one] = samples {
        put_sample(&mut out, one);
        return out;
    }
    out.push(b'[');
    for (i, s) in samples.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        put_sample(&mut out, s);
    }
    out.push(b']');
    out
}

/// One SSE event.
pub fn event(out: &mut Vec<u8>, s: &Sample<'_>) {
    out.extend_from_slice(b"data: ");
    put_sample(out, s);
    out.extend_from_slice(b"\n\n");
}

#[cfg(test)]
mod tests {
    use sonic_rs::{JsonValueTrait, Value};

    use super::*;

    fn sample<'a>(finish: Option<Finish<'a>>, logprobs: Option<(&'a [Entry], u32)>) -> Sample<'a> {
        Sample {
            id: "gnt-1",
            text: "Hello \"world\"",
            output_ids: &[5, 6],
            finish,
            prompt_tokens: 3,
            completion_tokens: 2,
            cached_tokens: 1,
            logprobs,
            input_logprobs: None,
            index: None,
        }
    }

    #[test]
    fn a_sample_is_sglangs_object() {
        let one = full(&[sample(Some(Finish::Stop(Some(Matched::Token(2)))), None)]);
        let v: Value = sonic_rs::from_slice(&one).unwrap();
        assert_eq!(v["text"].as_str(), Some("Hello \"world\""));
        assert_eq!(v["output_ids"][1].as_u64(), Some(6));
        let m = &v["meta_info"];
        assert_eq!(m["id"].as_str(), Some("gnt-1"));
        assert_eq!(
            (m["finish_reason"]["type"].as_str(), m["finish_reason"]["matched"].as_u64()),
            (Some("stop"), Some(2))
        );
        assert_eq!(
            (m["prompt_tokens"].as_u64(), m["completion_tokens"].as_u64(), m["cached_tokens"].as_u64()),
            (Some(3), Some(2), Some(1))
        );
        assert!(m.get("output_token_logprobs").is_none());
        let two =
            full(&[sample(Some(Finish::Length(2)), None), sample(Some(Finish::Stop(Some(Matched::Text("\n")))), None)]);
        let v: Value = sonic_rs::from_slice(&two).unwrap();
        assert_eq!(v[0]["meta_info"]["finish_reason"]["length"].as_u64(), Some(2));
        assert_eq!(v[1]["meta_info"]["finish_reason"]["matched"].as_str(), Some("\n"));
    }

    #[test]
    fn logprobs_are_triples_and_events_carry_their_index() {
        let entries = [
            Entry { id: 5, logprob: -0.5, top: vec![(5, -0.5), (9, -1.25)] },
            Entry { id: 6, logprob: f32::NEG_INFINITY, top: vec![] },
        ];
        let mut s = sample(None, Some((&entries, 2)));
        s.index = Some(1);
        let mut out = Vec::new();
        event(&mut out, &s);
        assert!(out.starts_with(b"data: {") && out.ends_with(b"}\n\n"));
        let v: Value = sonic_rs::from_slice(&out[6..out.len() - 2]).unwrap();
        assert!(v["meta_info"]["finish_reason"].is_null());
        assert_eq!(v["index"].as_u64(), Some(1));
        let lp = &v["meta_info"]["output_token_logprobs"];
        assert_eq!((lp[0][0].as_f64(), lp[0][1].as_u64()), (Some(-0.5), Some(5)));
        assert!(lp[0][2].is_null() && lp[1][0].is_null(), "no text; -inf has no JSON number");
        assert_eq!(v["meta_info"]["output_top_logprobs"][0][1][1].as_u64(), Some(9));
    }
}
