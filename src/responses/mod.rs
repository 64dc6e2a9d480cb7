//! The Responses API served by the gateway (on gRPC workers, which keep no state): a turn
//! becomes a chat request (`turn.rs`) run through the one upstream loop, its answer becomes a
//! response object or the Responses event stream (`answer.rs`, `events.rs`), and the turn is
//! stored (`store/`) so the next one can chain off it by `previous_response_id` or a
//! conversation (`conversations.rs`).

pub(crate) mod answer;
pub(crate) mod events;
pub mod mcp;
pub(crate) mod plan;
pub(crate) mod provider_turn;
// A turn's own work, for the bench (bench/responses.rs).
#[doc(hidden)]
pub mod own_work;
pub mod store;
// Public for the benches (bench/responses.rs).
pub mod turn;

use sonic_rs::Value;

/// A JSON object with its keys in the order given: sonic-rs's `insert` does not keep the
/// order, and a chat template that prints a tool (`tojson`) shows it, as users see the
/// objects they read.
pub(crate) fn ordered(pairs: &[(&str, &Value)]) -> Value {
    let mut s = String::with_capacity(64 * pairs.len());
    s.push('{');
    for (i, (k, v)) in pairs.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        s.push_str(&sonic_rs::to_string(k).unwrap_or_default());
        s.push(':');
        s.push_str(&sonic_rs::to_string(v).unwrap_or_default());
    }
    s.push('}');
    sonic_rs::from_str(&s).unwrap_or_default()
}
