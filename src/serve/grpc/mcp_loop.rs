//! The MCP tool loop of a Responses turn (the relay's part): after each generation, the
//! calls the model made of MCP tools run on their servers (through the MCP thread), and
//! the model is asked again with their outputs, on the same worker, until it answers
//! without them. Bounded by `max_tool_calls` (else 10 calls; past it the response is
//! `incomplete` for `max_tool_calls`) and by the request's deadline, which every generation
//! and every call is held to. A call of a function the client runs ends the loop: the
//! client gets it, as does a call that waits for the client's approval (`require_approval:
//! "always"`: an `mcp_approval_request` item; the answer comes with the next turn). Streamed, each call is `mcp_call` events (src/responses/events.rs);
//! otherwise the items collect here.

use std::time::Duration;

use sonic_rs::{JsonValueTrait, Value};

use crate::responses::answer::{approval_request_item, mcp_call_item, output_of_chat, Ending, Usage};
use crate::responses::events::{Events, PendingCall};
use crate::responses::mcp::Called;
use crate::responses::plan::{McpPlan, TurnPlan};
use crate::responses::turn::new_id;
use crate::serve::ctx::RequestCtx;
use crate::shard::Shard;

/// A generation's answer: a stream's last events, the whole chat body, or a non-streamed
/// Responses turn's output items (taken from the assembler).
pub(super) enum Answered {
    Events(Vec<u8>),
    Body(Vec<u8>),
    Items(Vec<Value>, Ending, Usage),
}

impl Answered {
    /// A not-streamed answer's items, how it ended and its usage (a chat body read back).
    pub(super) fn items(self) -> Option<(Vec<Value>, Ending, Usage)> {
        match self {
            Answered::Items(items, ending, usage) => Some((items, ending, usage)),
            Answered::Body(body) => {
                let chat: Value = sonic_rs::from_slice(&body).unwrap_or_default();
                let (items, ending) = output_of_chat(&chat);
                Some((items, ending, Usage::of_chat(chat.get("usage"))))
            }
            Answered::Events(_) => None,
        }
    }
}

/// What follows a generation.
pub(super) enum Round {
    /// Generate again, with this chat.
    Again(Value),
    Done,
}

pub(super) struct Loop<'a> {
    plan: &'a TurnPlan,
    mcp: &'a McpPlan,
    calls: usize,
    /// Not streamed: the output so far (the listings first).
    items: Vec<Value>,
    usage: Usage,
    ending: Option<Ending>,
    /// Not streamed: the last generation's items are in `items` already.
    taken: bool,
}

// === impl Loop ===

impl<'a> Loop<'a> {
    pub(super) fn new(plan: &'a TurnPlan, mcp: &'a McpPlan) -> Self {
        let mut items = mcp.listings.clone();
        items.extend(mcp.answered.iter().cloned());
        Loop { plan, mcp, calls: 0, items, usage: Usage::default(), ending: None, taken: false }
    }

    /// A stream opens with the servers' listings.
    pub(super) fn open(&self, events: &mut Events, out: &mut Vec<u8>) {
        events.mcp(self.mcp.labels(), &self.mcp.listings, out);
        events.items(&self.mcp.answered, out);
    }

    /// After a generation: runs its MCP calls; what to send is appended to `out`.
    pub(super) async fn round(
        &mut self,
        shard: &Shard,
        ctx: &RequestCtx,
        answer: &mut Answered,
        events: Option<&mut Events>,
        out: &mut Vec<u8>,
    ) -> Round {
        match (&*answer, events) {
            (Answered::Events(tail), Some(ev)) => {
                ev.feed(tail, out);
                let (pending, plain) = ev.round(out);
                if pending.is_empty() {
                    return Round::Done;
                }
                for call in &pending {
                    let result = self.run(shard, ctx, call).await;
                    ev.mcp_done(call, &result, out);
                }
                if let Some(e) = self.ending {
                    ev.set_ending(e);
                }
                if plain || self.ending.is_some() {
                    return Round::Done;
                }
                Round::Again(self.plan.next_chat(ev.output(), true))
            }
            (Answered::Events(_), None) => Round::Done,
            (_, _) => {
                // Taken: the turn's end reads the items gathered here.
                let taken = std::mem::replace(answer, Answered::Items(Vec::new(), Ending::Completed, Usage::default()));
                let Some((items, ending, used)) = taken.items() else { return Round::Done };
                self.usage.add(used);
                self.taken = true;
                let mut ran = false;
                let mut plain = false;
                for item in items {
                    let name = item.get("name").and_then(|n| n.as_str()).unwrap_or("");
                    let is_call = item.get("type").and_then(|t| t.as_str()) == Some("function_call");
                    match self.mcp.server_of(name) {
                        // It waits for the client's approval: asked for, and the turn ends.
                        Some((server, _)) if is_call && self.mcp.needs_approval(name) => {
                            let arguments = item.get("arguments").and_then(|a| a.as_str()).unwrap_or("");
                            self.items.push(approval_request_item(&new_id("mcpr"), &server.label, name, arguments));
                            plain = true;
                        }
                        Some((server, _)) if is_call => {
                            let arguments = item.get("arguments").and_then(|a| a.as_str()).unwrap_or("").to_string();
                            let call = PendingCall {
                                index: self.items.len(),
                                id: new_id("mcp"),
                                label: server.label.clone(),
                                name: name.to_string(),
                                arguments,
                            };
                            let result = self.run(shard, ctx, &call).await;
                            self.items.push(mcp_call_item(
                                &call.id,
                                &call.label,
                                &call.name,
                                &call.arguments,
                                Some(&result),
                            ));
                            ran = true;
                        }
                        _ => {
                            plain |= is_call;
                            self.items.push(item);
                        }
                    }
                }
                if self.ending.is_none() {
                    self.ending = (!ran || plain).then_some(ending);
                }
                match self.ending {
                    Some(_) => Round::Done,
                    None => Round::Again(self.plan.next_chat(&self.items, false)),
                }
            }
        }
    }

    /// Runs one call within the request's deadline; past `max_tool_calls` it is not run.
    async fn run(&mut self, shard: &Shard, ctx: &RequestCtx, call: &PendingCall) -> Result<String, String> {
        if self.calls >= self.mcp.max_calls {
            self.ending = Some(Ending::Incomplete("max_tool_calls"));
            return Err(format!("not run: the turn's tool-call limit ({}) was reached", self.mcp.max_calls));
        }
        self.calls += 1;
        let Some((server, session)) = self.mcp.server_of(&call.name) else {
            return Err(format!("no MCP server offers '{}'", call.name));
        };
        let arguments: Value = match call.arguments.trim() {
            "" => Value::new_object(),
            a => match sonic_rs::from_str(a) {
                Ok(v) => v,
                Err(e) => return Err(format!("the arguments are not JSON: {e}")),
            },
        };
        let started = ctx.timings.upstream_started.unwrap_or(ctx.timings.started);
        let left = (started + shard.cfg().request_timeout).saturating_duration_since(crate::clock::now());
        if left.is_zero() {
            return Err("not run: the request's deadline passed".into());
        }
        let within = left.min(Duration::from_secs(300));
        match shard.mcp().call(server.clone(), session.clone(), call.name.clone(), arguments, within).await {
            Called::Output(o) => Ok(o),
            Called::Failed(e) => Err(e),
        }
    }

    /// Not streamed: the turn's output (the last generation's items added unless a round
    /// took them), how it ended, and its usage.
    pub(super) fn finish(mut self, answer: Answered) -> (Vec<Value>, Ending, Usage) {
        if !self.taken {
            if let Some((items, ending, used)) = answer.items() {
                self.usage.add(used);
                self.items.extend(items);
                self.ending.get_or_insert(ending);
            }
        }
        (self.items, self.ending.unwrap_or(Ending::Completed), self.usage)
    }
}
