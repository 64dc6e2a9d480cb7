//! What the gRPC relay needs to answer a Responses turn and store it: the response's shell
//! (id, echoed fields), this turn's input items, and where the record goes.

use sonic_rs::{JsonValueTrait, Value};

use super::answer::Shell;
use super::mcp::Server;
use super::store::{Item, Op, StoredResponse};
use super::turn::Turn;

/// A turn's MCP servers, their tools offered to the model, and the loop's bound.
#[derive(Debug)]
pub(crate) struct McpPlan {
    /// Each server, and the session its tools were listed in.
    pub servers: Vec<(Server, Option<String>)>,
    /// Per server: `require_approval: "always"` (each call waits for the client's
    /// `mcp_approval_response`, SMG's interactive mode; any other value runs calls at once).
    pub approval: Vec<bool>,
    /// Calls the client answered (approved and run, or refused) before this turn's first
    /// generation: `mcp_call` items that open the output after the listings.
    pub answered: Vec<Value>,
    /// Tool name → its server (index in `servers`).
    pub tools: Vec<(String, usize)>,
    /// The `mcp_list_tools` items that open the output.
    pub listings: Vec<Value>,
    /// The tools as chat tools.
    pub chat_tools: Vec<Value>,
    /// Most calls the loop runs (`max_tool_calls`, else the gateway's bound).
    pub max_calls: usize,
}

impl McpPlan {
    /// The server of the tool `name`, if it is an MCP tool.
    pub(crate) fn server_of(&self, name: &str) -> Option<&(Server, Option<String>)> {
        self.tools.iter().find(|(t, _)| t == name).map(|(_, i)| &self.servers[*i])
    }

    /// (tool name, server label, whether a call waits for approval) of every tool.
    pub(crate) fn labels(&self) -> Vec<(String, String, bool)> {
        self.tools.iter().map(|(t, i)| (t.clone(), self.servers[*i].0.label.clone(), self.approval[*i])).collect()
    }

    /// Whether a call of `name` waits for the client's approval.
    pub(crate) fn needs_approval(&self, name: &str) -> bool {
        self.tools.iter().find(|(t, _)| t == name).is_some_and(|(_, i)| self.approval[*i])
    }
}

#[derive(Debug)]
pub(crate) struct TurnPlan {
    /// The request, for each generation the MCP loop runs.
    pub turn: Turn,
    /// The history the turn follows (earlier items, oldest first).
    pub prior: Vec<Value>,
    pub mcp: Option<McpPlan>,
    pub shell: Shell,
    pub previous: Option<String>,
    pub conversation: Option<String>,
    /// `store` asked for, and a backend that stores.
    pub store: bool,
    pub tenant: Option<String>,
    pub context: Vec<(String, String)>,
}

// === impl TurnPlan ===

impl TurnPlan {
    /// The writes that store the finished turn: the response (when stored), and the
    /// turn's input and output items appended to its conversation.
    pub(crate) fn writes(&self, object: &str, output: &[String]) -> Vec<Op> {
        let mut ops = Vec::new();
        if self.store {
            ops.push(Op::PutResponse(Box::new(StoredResponse {
                id: self.shell.id.clone(),
                tenant: self.tenant.clone(),
                previous: self.previous.clone(),
                conversation: self.conversation.clone(),
                created_at: self.shell.created_at,
                input: self.turn.input_text.clone(),
                output: output.to_vec(),
                body: object.to_string(),
                context: self.context.clone(),
            })));
        }
        if let Some(c) = &self.conversation {
            let item =
                |json: String, v: Option<&Value>| Item { id: id_of(v, &json), json, created_at: self.shell.created_at };
            let items = self
                .turn
                .input
                .iter()
                .zip(&self.turn.input_text)
                .map(|(v, text)| item(text.clone(), Some(v)))
                .chain(output.iter().map(|o| item(o.clone(), None)))
                .collect();
            ops.push(Op::AppendItems { conversation: c.clone(), items });
        }
        ops
    }
}

// === impl TurnPlan ===

impl TurnPlan {
    /// The chat request of the MCP loop's next generation: the history, the input, and the
    /// output so far (its MCP calls with their outputs).
    pub(crate) fn next_chat(&self, output: &[Value], stream: bool) -> Value {
        // The answered calls of an approval are in `output` already (the loop's first items).
        let items = self.prior.iter().chain(self.turn.input.iter()).chain(output.iter());
        let tools = self.mcp.as_ref().map_or(&[][..], |m| &m.chat_tools[..]);
        self.turn.chat_after(items, tools, stream)
    }
}

/// An item's id: from its value, or read from its JSON.
fn id_of(v: Option<&Value>, json: &str) -> String {
    let id = match v {
        Some(v) => v.get("id").and_then(|i| i.as_str()).map(str::to_string),
        None => sonic_rs::get(json, ["id"]).ok().and_then(|i| i.as_str().map(str::to_string)),
    };
    id.unwrap_or_default()
}
