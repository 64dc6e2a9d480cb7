//! Wire encodings shared by the gateway (`smg`) and the tools in `loadtest/`, so both sides of
//! every benchmark speak from one implementation: the chunked transfer coding and the header
//! values httparse leaves to us, and JSON string literals, and WebSocket frames and handshakes.

// Unsafe code only where a comment proves it sound: each place has #[allow(unsafe_code)] and a SAFETY line.
#![deny(unsafe_code)]

pub mod chunked;
pub mod civil;
pub mod header;
pub mod json;
pub mod num;
pub mod provider;
pub mod ws;

pub use chunked::{ChunkError, ChunkedDecoder};
