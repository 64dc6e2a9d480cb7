//! What a prefill/decode pair's legs are sent, as byte splices over the client's body (the
//! socket side is serve/pair.rs). Two engines, two ways to hand the KV cache over:
//!
//! - SGLang ([`bootstrap`]): both legs get the same body at the same time, naming the
//!   prefill's bootstrap server and a room the two engines meet in.
//! - vLLM with a NIXL-style connector ([`nixl`]): the prefill goes first, asked for one
//!   token and tagged to keep its KV for a remote decode; the decode then gets the client's
//!   body with the `kv_transfer_params` the prefill answered.

pub mod bootstrap;
pub mod logprobs;
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

/// Where a decode engine reaches its prefill's bootstrap server: the prefill's authority
/// without its port (an IPv6 literal keeps its brackets).
pub fn bootstrap_host(authority: &str) -> &str {
    if authority.starts_with('[') {
        return authority.find(']').map_or(authority, |i| &authority[..=i]);
    }
    match authority.rsplit_once(':') {
        Some((host, port)) if port.bytes().all(|b| b.is_ascii_digit()) => host,
        _ => authority,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bootstrap_host_is_the_authority_without_its_port() {
        assert_eq!(bootstrap_host("10.0.0.5:30001"), "10.0.0.5");
        assert_eq!(bootstrap_host("prefill-0.svc"), "prefill-0.svc");
        assert_eq!(bootstrap_host("[::1]:8000"), "[::1]");
    }
}
