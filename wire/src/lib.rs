//! HTTP/1.1 framing that httparse leaves out, shared by the gateway (`smg`) and the tools in
//! `loadtest/` so both sides of every benchmark speak from one implementation: the chunked
//! transfer coding and the few header values both interpret.

pub mod chunked;
pub mod header;

pub use chunked::{ChunkError, ChunkedDecoder};
