//! What the history store keeps and is asked (its records, the operations on them, the
//! answers), shared by every backend and the shards that ask.

use std::future::Future;
use std::pin::Pin;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// A stored response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredResponse {
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
pub struct Conversation {
    pub id: String,
    pub tenant: Option<String>,
    /// Unix seconds.
    pub created_at: u64,
    /// A JSON object, or None.
    pub metadata: Option<String>,
}

/// An item of a conversation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Item {
    pub id: String,
    /// The item as listed: a JSON object with its id.
    pub json: String,
    /// Unix seconds.
    pub created_at: u64,
}

/// What a shard asks the storage thread.
#[derive(Debug, Clone)]
pub enum Op {
    /// Nothing but what every call does first: the memory store applies the writes sent so
    /// far (`History::write`).
    Flush,
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
pub enum Reply {
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
pub struct Unavailable(pub String);

/// A chain longer than this is refused (a loop of `previous` ids, or a runaway client).
pub const MAX_CHAIN: usize = 1000;

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

/// SMG's defaults: 10,000 responses, 100,000 items, a day.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryLimits {
    pub max_responses: usize,
    pub max_items: usize,
    /// 0 keeps a record until a count bound drops it.
    pub retention_secs: u64,
}

impl Default for MemoryLimits {
    fn default() -> Self {
        MemoryLimits { max_responses: 10_000, max_items: 100_000, retention_secs: 86_400 }
    }
}

/// A backend across the network: every call is its own task.
pub(crate) trait Remote: Send + Sync + 'static {
    fn apply(&self, op: Op, now: u64) -> Pin<Box<dyn Future<Output = Result<Reply, Unavailable>> + Send + '_>>;
}

/// Unix seconds: the records' `created_at` and the memory bounds' clock.
#[allow(clippy::disallowed_methods)] // Wall-clock time is what a record's timestamp is.
pub fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}
