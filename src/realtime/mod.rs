//! The Realtime API's WebSocket transport (openai-compatible-api.md, "Realtime API"): the
//! handshakes on both sides, and a relay that passes frames through verbatim while reading
//! only their heads. The phases that use it are in `serve::realtime`.

pub mod handshake;
pub mod query;
pub mod relay;
pub mod scan;
