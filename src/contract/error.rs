//! The two validation-failure envelopes of the contract's Error Responses and their bodies.

use std::fmt;

/// A request the contract rejects with `400` before routing. Neither variant carries
/// `X-SMG-Error-Code`: the contract reserves that header for the standard envelope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ContractError {
    /// Not JSON, not the request schema, or no `Content-Type: application/json`:
    /// `code` is the string `"json_parse_error"`.
    JsonParse(String),
    /// A field range, cross-field or provider-profile rule: `code` is the number `400`.
    Invalid(String),
}

// === impl ContractError ===

impl ContractError {
    pub fn status(&self) -> u16 {
        400
    }

    pub fn message(&self) -> &str {
        match self {
            ContractError::JsonParse(m) | ContractError::Invalid(m) => m,
        }
    }

    /// The exact response body, e.g.
    /// `{"error":{"message":"…","type":"invalid_request_error","code":400}}`.
    pub fn body(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.message().len() + 96);
        out.extend_from_slice(b"{\"error\":{\"message\":");
        smg_wire::json::put_str(&mut out, self.message());
        out.extend_from_slice(b",\"type\":\"invalid_request_error\",\"code\":");
        match self {
            ContractError::JsonParse(_) => out.extend_from_slice(b"\"json_parse_error\""),
            ContractError::Invalid(_) => out.extend_from_slice(b"400"),
        }
        out.extend_from_slice(b"}}");
        out
    }

    /// A schema mismatch: `Invalid JSON data: …` (SMG's wording for body-to-type failures).
    pub fn data(detail: impl fmt::Display) -> Self {
        ContractError::JsonParse(format!("Invalid JSON data: {detail}"))
    }

    /// A cross-field or profile rule, reported against the whole request (`__all__: …`), the
    /// way SMG's schema-level validators render.
    pub fn rule(detail: impl fmt::Display) -> Self {
        ContractError::Invalid(format!("__all__: {detail}"))
    }

    /// A single-field range rule.
    pub fn field(detail: impl Into<String>) -> Self {
        ContractError::Invalid(detail.into())
    }
}

impl fmt::Display for ContractError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.message())
    }
}

impl std::error::Error for ContractError {}
