//! Phase: relay, for a pair's SGLang `/generate` answer asked with `return_logprob`: the
//! decode's answer with the prefill's prompt log-probabilities in front of its own
//! (src/pair/logprobs.rs), written by the gateway as it reads it (reshaped.rs), a streamed
//! answer event by event. Every other pair answer is relayed as any worker's (upstream.rs).

use super::ctx::{Picked, RequestCtx};
use super::pair::Merge;
use super::reshaped::{Reshape, Shape};
use crate::contract::json::{self, Kind};
use crate::pair::logprobs::{merge, merge_event};
use crate::shard::Shard;

/// How the relay (reshaped.rs) writes `picked`'s answer, and the merge that makes it.
pub(super) fn reshape<'a>(picked: &'a Picked, wanted: &'a Merge) -> (Shape<'a>, Merging<'a>) {
    // `/generate` is not read by the contract: the body said whether it streams.
    let shape = Shape { streaming: wanted.streamed, named: &picked.worker().url.url };
    (shape, Merging { items: &wanted.items, usage: (0, 0) })
}

/// The prefill's prompt items merged into each answer, and the engine's counts (for a tenant
/// budget: the last event's, streamed).
pub(super) struct Merging<'a> {
    items: &'a [u8],
    usage: (u64, u64),
}

impl Reshape for Merging<'_> {
    async fn event(&mut self, _: &Shard, _: &RequestCtx, e: &[u8], out: &mut Vec<u8>) {
        self.usage = counts(e.strip_prefix(b"data: ").unwrap_or(e)).unwrap_or(self.usage);
        merge_event(e, self.items, out);
    }

    async fn whole(&mut self, _: &Shard, _: &RequestCtx, whole: Vec<u8>) -> Vec<u8> {
        self.usage = counts(&whole).unwrap_or(self.usage);
        let mut merged = Vec::with_capacity(whole.len() + self.items.len() + 1);
        if merge(&whole, self.items, &mut merged) {
            merged
        } else {
            whole
        }
    }

    fn usage(&self) -> (u64, u64) {
        self.usage
    }
}

/// `meta_info.prompt_tokens` and `completion_tokens` of one answer or event.
fn counts(doc: &[u8]) -> Option<(u64, u64)> {
    let doc = json::parse(doc.trim_ascii()).ok()?;
    if doc.kind(0) != Kind::Object {
        return None;
    }
    let meta = doc.get(0, "meta_info")?;
    let n = |k: &str| doc.get(meta, k).filter(|&v| doc.kind(v) == Kind::Number).map(|v| doc.number(v) as u64);
    Some((n("prompt_tokens")?, n("completion_tokens").unwrap_or(0)))
}
