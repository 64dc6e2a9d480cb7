//! Decisions → System One: the four refusals SGLang Decisions needs before dispatch, then
//! the System One body, written once with raw tokens of the client's body where they fit.

use crate::contract::decisions::{Decision, QuestionKind};
use crate::contract::json::Doc;
use smg_wire::json::put_str;

/// Why SGLang cannot serve a request (`400 unsupported_decisions_request`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unsupported(pub String);

/// What the reply mapping needs of the request, per question in order.
#[derive(Debug, Default)]
pub struct Plan {
    /// The canonical model, as the answer names it.
    pub model: String,
    pub questions: Vec<PlannedQuestion>,
}

#[derive(Debug)]
pub struct PlannedQuestion {
    pub kind: QuestionKind,
    /// The `name` token as sent, or `null`.
    pub name: Vec<u8>,
    /// Choice: the System One key of each choice. Score: empty.
    pub keys: Vec<String>,
    /// Choice: each `value` token as sent (`true` stays a boolean). Score: each `label` token.
    pub values: Vec<Vec<u8>>,
}

/// The System One body for `d` (whose model resolves to `model`) and its [`Plan`].
pub fn translate(d: &Decision<'_>, model: &str) -> Result<(Vec<u8>, Plan), Unsupported> {
    crate::contract::decisions::sglang_refusal(d).map_err(Unsupported)?;
    let doc = &d.doc;
    let mut out = Vec::with_capacity(doc.src.len() + 64 * d.questions.len() + 64);
    out.extend_from_slice(b"{\"model\":");
    put_str(&mut out, model);
    out.extend_from_slice(b",\"state\":");
    if let [one] = d.texts[..] {
        out.extend_from_slice(doc.raw(one));
    } else {
        let mut state = String::new();
        for (i, &t) in d.texts.iter().enumerate() {
            if i > 0 {
                state.push_str("\n\n");
            }
            state.push_str(&doc.str(t));
        }
        put_str(&mut out, &state);
    }
    out.extend_from_slice(b",\"questions\":{");
    let mut plan = Plan { model: model.to_owned(), questions: Vec::with_capacity(d.questions.len()) };
    for (i, q) in d.questions.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.push(b'"');
        smg_wire::num::put_dec(&mut out, i as u64);
        out.extend_from_slice(b"\":{\"type\":");
        out.extend_from_slice(match q.kind {
            QuestionKind::Predicate => b"\"noul\"",
            QuestionKind::Choice => b"\"choice\"",
            QuestionKind::Score => b"\"score\"",
        });
        out.extend_from_slice(b",\"instructions\":");
        out.extend_from_slice(doc.raw(q.instructions));
        let name = q.name.map_or_else(|| b"null".to_vec(), |n| doc.raw(n).to_vec());
        let mut planned = PlannedQuestion { kind: q.kind, name, keys: Vec::new(), values: Vec::new() };
        match q.kind {
            QuestionKind::Predicate => {}
            QuestionKind::Choice => {
                out.extend_from_slice(b",\"criteria\":{");
                for (j, o) in q.options.iter().enumerate() {
                    if j > 0 {
                        out.push(b',');
                    }
                    let key = choice_key(doc, o.value, &planned.keys);
                    put_str(&mut out, &key);
                    out.push(b':');
                    match o.description {
                        Some(desc) => out.extend_from_slice(doc.raw(desc)),
                        None => out.extend_from_slice(b"null"),
                    }
                    planned.keys.push(key);
                    planned.values.push(doc.raw(o.value).to_vec());
                }
                out.push(b'}');
            }
            QuestionKind::Score => {
                out.extend_from_slice(b",\"criteria\":[");
                for (j, o) in q.options.iter().enumerate() {
                    if j > 0 {
                        out.push(b',');
                    }
                    match o.description {
                        None => out.extend_from_slice(doc.raw(o.value)),
                        Some(desc) => put_str(&mut out, &format!("{}: {}", doc.str(o.value), doc.str(desc))),
                    }
                    planned.values.push(doc.raw(o.value).to_vec());
                }
                out.push(b']');
            }
        }
        out.push(b'}');
        plan.questions.push(planned);
    }
    out.extend_from_slice(b"}}");
    Ok((out, plan))
}

/// The value's text (`true` and `"true"` alike), made distinct within its question.
fn choice_key(doc: &Doc<'_>, v: usize, taken: &[String]) -> String {
    let base = match doc.kind(v) {
        crate::contract::json::Kind::Bool => if doc.node(v).flag { "true" } else { "false" }.to_owned(),
        _ => doc.str(v).into_owned(),
    };
    if !taken.contains(&base) {
        return base;
    }
    (2..).map(|n| format!("{base} ({n})")).find(|k| !taken.contains(k)).expect("a free key")
}
