//! HTTP/1.1 on our own framing: request heads, bodies, the connection driver, the upstream
//! pool and the response relay.

/// Chunked coding lives in the shared `smg-wire` crate (the load tools use it too).
pub use smg_wire::chunked;
pub mod head;
pub mod relay;
pub mod response;
pub mod server;
pub mod upstream;
