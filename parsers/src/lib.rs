//! A model's output, as decoded text pieces, turned into what the OpenAI answer carries:
//! `content`, `reasoning_content` and `tool_calls`. Pure and incremental: a parser takes each
//! piece as the gateway releases it (a piece may end anywhere, inside a marker or a UTF-8
//! character's worth of text is never split: pieces are `&str`) and appends what that text
//! turned out to be to a [`Parsed`]. A parser holds back only what it cannot yet decide (half
//! a marker, an unfinished call) and gives it back at [`finish`](ToolParser::finish).
//!
//! Two kinds, composed by the caller: a [`ReasoningParser`] splits reasoning from the rest,
//! and the rest goes through a [`ToolParser`], which splits tool calls from content.
//!
//! The markup each family's model writes is a fact of that model (its chat template and
//! training): the parsers match it exactly.

#![deny(unsafe_code)]

pub mod harmony;
pub mod markup;
pub mod reasoning;
pub mod tools;

#[cfg(test)]
pub(crate) mod testing;

#[cfg(test)]
thread_local! {
    /// Bytes the token searches read on this thread: the measure of the linearity tests.
    pub(crate) static SCANNED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Counts `n` bytes read by a token search (tests only; nothing otherwise).
#[inline(always)]
pub(crate) fn scanned(_n: usize) {
    #[cfg(test)]
    SCANNED.with(|s| s.set(s.get() + _n));
}

/// What released text turned out to be. The caller clears it between pieces.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Parsed {
    /// The message's text (`content`).
    pub content: String,
    /// The model's reasoning (`reasoning_content`), without its markers.
    pub reasoning: String,
    /// Tool calls completed by this piece, in the order the model wrote them.
    pub calls: Vec<Call>,
}

impl Parsed {
    pub fn clear(&mut self) {
        self.content.clear();
        self.reasoning.clear();
        self.calls.clear();
    }

    pub fn is_empty(&self) -> bool {
        self.content.is_empty() && self.reasoning.is_empty() && self.calls.is_empty()
    }
}

/// One tool call, whole: a call is given out only once its markup closed and its arguments
/// are valid JSON, so nothing malformed ever reaches a client as a call (markup that is not a
/// valid call comes back as content).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    /// The function's name: one the request's tools declare.
    pub name: String,
    /// The arguments: a JSON object, as text.
    pub arguments: String,
}

/// Splits a model's reasoning from the rest of its output.
pub trait ReasoningParser: Send {
    /// Text the model released: reasoning goes to `out.reasoning`, the rest to `out.content`.
    fn push(&mut self, text: &str, out: &mut Parsed);
    /// The output ended: whatever is held back.
    fn finish(&mut self, out: &mut Parsed);
}

/// Splits a model's tool calls from its text.
pub trait ToolParser: Send {
    /// Text the model released (after reasoning was taken out): calls go to `out.calls`, text
    /// to `out.content`.
    fn push(&mut self, text: &str, out: &mut Parsed);
    /// The output ended: an unfinished call's markup comes back as content.
    fn finish(&mut self, out: &mut Parsed);
}

/// A function the request offers (`tools[i].function`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tool {
    pub name: String,
    /// Its parameters' JSON Schema `type` by name (`"string"`, `"integer"`, `"number"`,
    /// `"boolean"`, `"object"`, `"array"`), for markup whose values are bare text (Qwen3-Coder,
    /// GLM-4.5, MiniMax-M2, Step-3): a value whose parameter is not a string is read as JSON.
    pub params: Vec<(String, String)>,
}

/// The request's functions: the calls a parser may give out.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tools {
    /// Shared: each choice's parser holds the request's tools (a clone is a count).
    list: std::sync::Arc<[Tool]>,
    /// Calls of any name are read, their values typed as JSON where they parse (MiniMax's
    /// profile scans answers for calls even when the request offers no tools).
    any: bool,
}

impl Tools {
    pub fn new(list: Vec<Tool>) -> Self {
        Tools { list: list.into(), any: false }
    }

    /// Every name is declared, with no parameter types.
    pub fn any() -> Self {
        Tools { list: Vec::new().into(), any: true }
    }

    pub fn list(&self) -> &[Tool] {
        &self.list
    }

    /// The function called `name`, if the request offers it (or any name is read).
    pub fn get(&self, name: &str) -> Option<std::borrow::Cow<'_, Tool>> {
        match self.list.iter().find(|t| t.name == name) {
            Some(t) => Some(std::borrow::Cow::Borrowed(t)),
            None if self.any => Some(std::borrow::Cow::Owned(Tool { name: name.to_string(), params: Vec::new() })),
            None => None,
        }
    }

    pub fn declares(&self, name: &str) -> bool {
        self.any || self.list.iter().any(|t| t.name == name)
    }
}
