//! In-process contract tests: the golden rule table, rewrites, properties and hostile input.

mod golden;
mod hostile;
mod props;
mod rewrites;

use super::{apply, inspect, Aliases, ContractError, Endpoint, Inspection};

/// Inspect a chat body with no aliases.
fn chat(body: &str) -> Result<Inspection, ContractError> {
    inspect(Endpoint::ChatCompletions, body.as_bytes(), true, &Aliases::default())
}

/// The forwarded body for an accepted chat request.
fn forwarded(body: &str, aliases: &Aliases) -> String {
    let insp = inspect(Endpoint::ChatCompletions, body.as_bytes(), true, aliases).expect("accepted");
    String::from_utf8(apply(body.as_bytes(), &insp.edits)).expect("utf-8")
}

/// The golden `code: 400` envelope.
fn invalid(message: &str) -> String {
    format!(r#"{{"error":{{"message":"{message}","type":"invalid_request_error","code":400}}}}"#)
}

/// The golden `json_parse_error` envelope.
fn parse_error(message: &str) -> String {
    format!(r#"{{"error":{{"message":"{message}","type":"invalid_request_error","code":"json_parse_error"}}}}"#)
}
