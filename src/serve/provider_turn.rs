//! Phase: relay, for a Responses turn on a cloud provider that keeps no state for the
//! gateway (src/responses/provider_turn.rs): the provider's 2xx answer read as it comes
//! (reshaped.rs), its response object patched to say what the client asked and what was
//! kept, and kept in the history store before the client is told it is. A non-streamed
//! answer is read whole (up to `--max-payload-size`); a streamed one is written event by
//! event, the store written before the event that ends it (`response.completed` /
//! `.incomplete`) goes out. Any other answer of the provider's is relayed as it came
//! (upstream.rs).

use super::ctx::RequestCtx;
use super::reshaped::{Reshape, Shape};
use crate::responses::provider_turn::{Answer, Ends, ProviderTurn};
use crate::shard::Shard;

/// How the relay (reshaped.rs) writes the provider's answer to `turn`, and what keeps it.
pub(super) fn reshape(turn: &ProviderTurn) -> (Shape<'static>, Keeping<'_>) {
    // A Responses answer does not name its worker (SMG's rule).
    (Shape { streaming: turn.stream, named: "" }, Keeping { turn, usage: (0, 0) })
}

/// The provider's answer patched, and kept before the client hears it is.
pub(super) struct Keeping<'a> {
    turn: &'a ProviderTurn,
    usage: (u64, u64),
}

impl Reshape for Keeping<'_> {
    async fn event(&mut self, shard: &Shard, ctx: &RequestCtx, e: &[u8], out: &mut Vec<u8>) {
        let turn = self.turn;
        match (ProviderTurn::ends(e), ProviderTurn::event_object(e)) {
            (Some(Ends::Kept), Some(r)) => {
                let answer = turn.answer(&e[r.clone()]);
                self.usage = answer.usage;
                out.extend_from_slice(&e[..r.start]);
                out.extend_from_slice(&kept(shard, ctx, turn, &e[r.clone()], answer).await);
                out.extend_from_slice(&e[r.end..]);
            }
            (Some(_), _) => turn.patch_event(e, false, out),
            (None, _) => turn.patch_event(e, turn.store, out),
        }
    }

    async fn whole(&mut self, shard: &Shard, ctx: &RequestCtx, body: Vec<u8>) -> Vec<u8> {
        let answer = self.turn.answer(&body);
        self.usage = answer.usage;
        kept(shard, ctx, self.turn, &body, answer).await
    }

    fn usage(&self) -> (u64, u64) {
        self.usage
    }
}

/// Keeps the provider's response `object` (read as `answer`; the turn appended to its
/// conversation): the object as the client gets it, saying it is stored only when it is.
async fn kept(shard: &Shard, ctx: &RequestCtx, turn: &ProviderTurn, object: &[u8], answer: Answer) -> Vec<u8> {
    let Some(ops) = answer.ops else {
        crate::warn!("request {}: the provider's response is not a JSON object with an id (or nests past 128 levels); not stored", ctx.id_str());
        return turn.patched(object, false);
    };
    for op in ops {
        if let Err(e) = shard.history().write(op).await {
            crate::warn!("request {}: the provider's response not stored: {}", ctx.id_str(), e.0);
            return turn.patched(object, false);
        }
    }
    answer.text
}
