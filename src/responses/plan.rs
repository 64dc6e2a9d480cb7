//! What the gRPC relay needs to answer a Responses turn and store it: the response's shell
//! (id, echoed fields), this turn's input items, and where the record goes.

use sonic_rs::{JsonValueTrait, Value};

use super::answer::Shell;
use super::store::{Item, Op, StoredResponse};

#[derive(Debug)]
pub(crate) struct TurnPlan {
    pub shell: Shell,
    /// This turn's input items, stored shape.
    pub input: Vec<Value>,
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
    pub(crate) fn writes(&self, object: &Value, output: &[Value]) -> Vec<Op> {
        let json = |v: &Value| sonic_rs::to_string(v).unwrap_or_default();
        let mut ops = Vec::new();
        if self.store {
            ops.push(Op::PutResponse(Box::new(StoredResponse {
                id: self.shell.id.clone(),
                tenant: self.tenant.clone(),
                previous: self.previous.clone(),
                conversation: self.conversation.clone(),
                created_at: self.shell.created_at,
                input: self.input.iter().map(json).collect(),
                output: output.iter().map(json).collect(),
                body: json(object),
                context: self.context.clone(),
            })));
        }
        if let Some(c) = &self.conversation {
            let items = self
                .input
                .iter()
                .chain(output.iter())
                .map(|v| Item {
                    id: v.get("id").and_then(|i| i.as_str()).unwrap_or("").to_string(),
                    json: json(v),
                    created_at: self.shell.created_at,
                })
                .collect();
            ops.push(Op::AppendItems { conversation: c.clone(), items });
        }
        ops
    }
}
