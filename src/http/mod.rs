//! HTTP/1.1 on our own framing: request heads, bodies, the connection driver, the upstream
//! pool and the response relay.

pub mod chunked;
pub mod head;
pub mod relay;
pub mod response;
pub mod server;
pub mod upstream;
