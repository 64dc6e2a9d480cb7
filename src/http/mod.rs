//! HTTP/1.1 on our own framing, as bytes only: request heads and bodies, worker response
//! heads, the relay between them, the upstream pool, and the responses the gateway writes.
//! Nothing here knows about shards, routes or the API contract.

/// Chunked coding lives in the shared `smg-wire` crate (the load tools use it too).
pub use smg_wire::chunked;
pub mod assembled;
pub mod body;
pub mod date;
pub mod head;
pub mod held_body;
pub mod hop;
pub mod multipart;
pub mod pool;
pub mod relay;
pub mod respond;
pub mod response_head;
pub mod usage;
