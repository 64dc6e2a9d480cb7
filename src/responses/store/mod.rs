//! Where stored responses and conversations live (`--history-backend`): one storage thread
//! per process owns the backend, and shards ask it by message (`History::ask`), never
//! touching the records themselves. Memory is the default; `none` serves without storing;
//! `redis` and `postgres` let every replica chain off any other's responses.
//!
//! Records are opaque JSON to the backends: a response keeps its input and output items and
//! the object `GET /v1/responses/{id}` answers; a conversation its metadata; an item its JSON.
//! What the records mean (chaining, tenants, metadata merges) is decided by the caller
//! (src/responses/), so every backend stores the same facts the same way.

mod memory;
mod postgres_store;
mod redis_store;
mod thread;

use std::time::Duration;

use serde::{Deserialize, Serialize};

pub(crate) use memory::Memory;
pub use memory::MemoryLimits;
pub(crate) use thread::{start, unix_now};

/// A stored response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct StoredResponse {
    pub id: String,
    /// The tenant that created it (None: stored without a tenant identity, readable by all).
    pub tenant: Option<String>,
    pub previous: Option<String>,
    pub conversation: Option<String>,
    /// Unix seconds.
    pub created_at: u64,
    /// The input items, each a JSON object with its id.
    pub input: Vec<String>,
    /// The output items, each a JSON object with its id.
    pub output: Vec<String>,
    /// The response object, as `GET /v1/responses/{id}` answers it.
    pub body: String,
    /// `--storage-context-headers`: (context key, the request header's value).
    pub context: Vec<(String, String)>,
}

/// A conversation's own record (its items are kept apart).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Conversation {
    pub id: String,
    pub tenant: Option<String>,
    /// Unix seconds.
    pub created_at: u64,
    /// A JSON object, or None.
    pub metadata: Option<String>,
}

/// An item of a conversation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Item {
    pub id: String,
    /// The item as listed: a JSON object with its id.
    pub json: String,
    /// Unix seconds.
    pub created_at: u64,
}

/// What a shard asks the storage thread.
#[derive(Debug, Clone)]
pub(crate) enum Op {
    PutResponse(Box<StoredResponse>),
    GetResponse(String),
    /// The response and every one before it by `previous`, oldest first; None when `id` or
    /// one it names is not stored.
    Chain(String),
    DeleteResponse(String),
    /// Creates or replaces the conversation's record.
    PutConversation(Conversation),
    GetConversation(String),
    /// The conversation and its items.
    DeleteConversation(String),
    /// Appends items to a conversation, in order.
    AppendItems {
        conversation: String,
        items: Vec<Item>,
    },
    /// Up to `limit` items, ascending or not, after the item `after` (exclusive).
    ListItems {
        conversation: String,
        after: Option<String>,
        limit: usize,
        ascending: bool,
    },
    GetItem {
        conversation: String,
        item: String,
    },
    DeleteItem {
        conversation: String,
        item: String,
    },
}

/// The storage thread's answer.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Reply {
    Done,
    /// A delete: whether there was something to delete.
    Deleted(bool),
    Response(Option<Box<StoredResponse>>),
    Chain(Option<Vec<StoredResponse>>),
    Conversation(Option<Conversation>),
    Items(Vec<Item>),
    Item(Option<Item>),
}

/// The backend could not answer: the caller's `503 storage_unavailable`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Unavailable(pub String);

/// A chain longer than this is refused (a loop of `previous` ids, or a runaway client).
pub(crate) const MAX_CHAIN: usize = 1000;

/// `--history-backend` and its settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backend {
    Memory(MemoryLimits),
    /// Serves, stores nothing.
    None,
    Redis {
        url: String,
        retention_days: i64,
    },
    Postgres {
        url: String,
    },
}

/// A message to the storage thread.
pub(crate) struct Ask {
    pub op: Op,
    pub reply: flume::Sender<Result<Reply, Unavailable>>,
}

/// A shard's way to the storage thread.
#[derive(Clone)]
pub struct History {
    tx: flume::Sender<Ask>,
    /// Each call's bound (`--redis-op-timeout-secs` / `--postgres-op-timeout-secs`; memory
    /// answers at once).
    within: Duration,
    /// `--history-backend none`.
    pub stores: bool,
}

// === impl History ===

impl History {
    pub(crate) fn new(tx: flume::Sender<Ask>, within: Duration, stores: bool) -> Self {
        History { tx, within, stores }
    }

    /// Asks the storage thread; Err when it does not answer within the bound.
    pub(crate) async fn ask(&self, op: Op) -> Result<Reply, Unavailable> {
        let (reply, rx) = flume::bounded(1);
        if self.tx.send(Ask { op, reply }).is_err() {
            return Err(Unavailable("the storage thread is gone".into()));
        }
        monoio::select! {
            r = rx.recv_async() => r.unwrap_or_else(|_| Err(Unavailable("the storage thread dropped the call".into()))),
            _ = crate::io::sleep(self.within) => Err(Unavailable("the history store did not answer in time".into())),
        }
    }
}
