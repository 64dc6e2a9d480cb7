//! Why a request cannot go to a gRPC engine as it is (the request builders' one error type,
//! shared by chat, completions, `/generate`, embeddings, Decisions and the Harmony renderer).

/// Why a request cannot go to the engine as it is: its status, the contract's error code and
/// the message; serve/ answers it in the API's error envelope. (Its own type, not the API's:
/// this floor sits below the API.)
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub status: u16,
    pub code: &'static str,
    pub message: String,
}

impl Refusal {
    pub fn new(status: u16, code: &'static str, message: impl Into<String>) -> Self {
        Refusal { status, code, message: message.into() }
    }

    pub(crate) fn internal(code: &'static str, message: impl std::fmt::Display) -> Self {
        Refusal::new(500, code, message.to_string())
    }
}
