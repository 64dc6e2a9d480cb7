//! `/v1/decisions` on SGLang HTTP workers: the request translated to SGLang's System One
//! API (`POST /v1/systemone`, SGLang 0.5.21's `SystemOneRequest`) and its reply mapped back
//! to the Decisions shape. Other workers get the client's body as sent; nothing here runs.
//!
//! System One keys questions (and choices) by name in JSON objects, while Decisions names
//! need not be unique and choice values may be `true` and `"true"` side by side; so the
//! translation keys questions by their index (`"0"`, `"1"`, …), keys choices by their value's
//! text (a repeat gets ` (2)`, ` (3)`, … appended), and keeps a [`Plan`] to map every answer
//! back by position. Text evidence becomes the `state` string (parts joined by a blank
//! line); a score level is sent as its label, or `label: description`.

mod reply;
mod request;

pub use reply::map_reply;
pub use request::{translate, Plan, Unsupported};

/// The SGLang route the translation targets.
pub const SYSTEMONE_PATH: &[u8] = b"/v1/systemone";
