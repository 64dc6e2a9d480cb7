//! What a prefill/decode pair's legs are sent, as byte splices over the client's body (the
//! socket side is serve/pair.rs). Two engines, two ways to hand the KV cache over:
//!
//! - SGLang ([`bootstrap`]): both legs get the same body at the same time, naming the
//!   prefill's bootstrap server and a room the two engines meet in.
//! - vLLM with a NIXL-style connector ([`nixl`]): the prefill goes first, asked for one
//!   token and tagged to keep its KV for a remote decode; the decode then gets the client's
//!   body with the `kv_transfer_params` the prefill answered.

pub mod bootstrap;
pub mod nixl;

/// The request routes a pair serves: they differ in which field makes a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PairRoute {
    Chat,
    Completions,
    /// SGLang's native `/generate`.
    Generate,
}

/// A body a leg cannot be given (not a JSON object): 400, before anything is sent.
#[derive(Debug, PartialEq, Eq)]
pub struct Unsplicable(pub String);
