//! Where stored responses and conversations live (`--history-backend`): one storage thread
//! per process owns the backend, and shards ask it by message (`History::ask`), never
//! touching the records themselves. Memory is the default; `none` serves without storing;
//! `redis` and `postgres` let every replica chain off any other's responses.
//!
//! Records are opaque JSON to the backends: a response keeps its input and output items and
//! the object `GET /v1/responses/{id}` answers; a conversation its metadata; an item its JSON.
//! What the records mean (chaining, tenants, metadata merges) is decided by the caller
//! (src/responses/), so every backend stores the same facts the same way.

mod history;
mod memory;
mod postgres_store;
mod record;
mod redis_store;
mod thread;

pub use history::History;
pub use record::unix_now;
// Public for the benches (bench/responses.rs).
pub use memory::Memory;
pub use record::{Backend, MemoryLimits};
pub use record::{Conversation, Item, Op, Reply, StoredResponse, Unavailable, MAX_CHAIN};
pub use thread::start;
