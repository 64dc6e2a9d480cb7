//! A non-streamed Responses turn's own work, sans I/O, in one call: what the bench weighs
//! (bench/responses.rs), kept beside the parts it calls so it does what the relay does.

use sonic_rs::Value;

use super::answer::{output_of_parts, Shell, Usage};
use super::plan::TurnPlan;
use super::store::Op;
use super::turn::{new_id, Turn};

/// A non-streamed turn's own work, sans I/O, as the gRPC relay does it: the body read, the
/// chat built, the shell made, the answer `text` made the output and the response object,
/// and the writes that store it. For the bench (bench/responses.rs), which weighs it against
/// what a chat turn of the same size does in its place (the body parsed).
pub fn turn_work(body: &[u8], text: &str) -> (Value, String, Vec<Op>) {
    let turn = Turn::read(body).unwrap_or_else(|e| panic!("{}", e.message));
    let chat = turn.chat(&[], &[], false);
    let plan = TurnPlan {
        shell: Shell::new(&turn, new_id("resp"), 1, &turn.model),
        previous: None,
        conversation: None,
        store: turn.store,
        tenant: None,
        context: Vec::new(),
        mcp: None,
        prior: Vec::new(),
        turn,
    };
    let (output, ending) = output_of_parts(text, "", &[], "stop");
    let output: Vec<String> = output.iter().map(|v| sonic_rs::to_string(v).unwrap_or_default()).collect();
    let usage = Usage { input: 300, cached: 0, output: 60, reasoning: 0 };
    let body = plan.shell.object_json(Some(ending), &output, Some(usage));
    let ops = plan.writes(&body, &output);
    (chat, body, ops)
}
