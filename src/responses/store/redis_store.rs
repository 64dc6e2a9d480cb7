//! `--history-backend redis`: stored responses and conversations in a Redis that every
//! gateway replica shares, so any replica chains off any other's responses. Answers every
//! [`Op`] as [`Memory`](super::memory::Memory) does; the bounds are Redis' own (`--redis-retention-days`
//! as a TTL on every key written, -1 keeping them), not the memory backend's counts.
//!
//! Keys (an id is the rest of the key, after a fixed part that names what it is, so no id
//! can reach another record's key):
//! - `smg:history:response:<id>`: a hash, `record` (the [`StoredResponse`](super::record::StoredResponse) as JSON) and
//!   `previous` (its `previous` id, absent when None), so the chain script walks the links
//!   without parsing records.
//! - `smg:history:conversation:<id>`: the [`Conversation`](super::record::Conversation) as JSON.
//! - `smg:history:conversation-order:<id>`: a sorted set of its item ids, each scored by its
//!   position (1, 2, ... in the order they were added).
//! - `smg:history:conversation-items:<id>`: a hash, item id to the [`Item`](super::record::Item) as JSON.
//!
//! A conversation's three keys are written together by one script or MULTI, and expire
//! together: the retention counts from the conversation's last use (a write, or reading it),
//! as memory's does. An item belongs to its conversation: the same item id in two
//! conversations is two records (memory shares one), and an id appended again keeps its first
//! position with the newer record (memory lists it twice).
//!
//! Runs on the history control thread (a current-thread tokio runtime), never on a shard.
//! Calls share one multiplexed connection; one that fails or does not answer within the bound
//! is dropped, and the next call connects anew.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, RedisError, Script};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::sync::Mutex;

use super::record::{Op, Remote, Reply, Unavailable, MAX_CHAIN};

/// Prefix of every key this backend writes.
pub(crate) const KEY_PREFIX: &str = "smg:history:";

/// The chain, newest first, or nil when a link is missing or the chain is longer than the
/// bound. ARGV: the response keys' prefix, the newest id, the bound. Reads keys it derives
/// (standalone Redis only, as the budgets' scripts).
const CHAIN_LUA: &str = r#"
local out, id, max = {}, ARGV[2], tonumber(ARGV[3])
while id do
  if #out >= max then return false end
  local v = redis.call('HMGET', ARGV[1] .. id, 'record', 'previous')
  if not v[1] then return false end
  out[#out + 1] = v[1]
  id = v[2]
end
return out
"#;

/// The conversation's keys get the retention (ARGV[1], seconds; 0 keeps them).
const TOUCH_LUA: &str = r#"
local function touch(ttl)
  for _, k in ipairs(KEYS) do
    if ttl > 0 then redis.call('EXPIRE', k, ttl) else redis.call('PERSIST', k) end
  end
end
"#;

/// KEYS: conversation, order, items. ARGV: ttl, then (id, item JSON) pairs. Nothing when the
/// conversation is not stored.
const APPEND_LUA: &str = r#"
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local last = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
local seq = 0
if last[2] then seq = tonumber(last[2]) end
for i = 2, #ARGV, 2 do
  if not redis.call('ZSCORE', KEYS[2], ARGV[i]) then
    seq = seq + 1
    redis.call('ZADD', KEYS[2], seq, ARGV[i])
  end
  redis.call('HSET', KEYS[3], ARGV[i], ARGV[i + 1])
end
touch(tonumber(ARGV[1]))
return 1
"#;

/// KEYS: conversation, order, items. ARGV: ttl, the record. Creates or replaces the record;
/// the items stay.
const PUT_CONVERSATION_LUA: &str = r#"
redis.call('SET', KEYS[1], ARGV[2])
touch(tonumber(ARGV[1]))
return 1
"#;

/// KEYS: conversation, order, items. ARGV: ttl. The record, its use renewing the retention.
const GET_CONVERSATION_LUA: &str = r#"
local v = redis.call('GET', KEYS[1])
if v then touch(tonumber(ARGV[1])) end
return v
"#;

/// KEYS: conversation, order, items. ARGV: '1' with a cursor, the cursor, the limit, '1'
/// ascending. Item JSONs; an unknown cursor lists nothing.
const LIST_LUA: &str = r#"
if redis.call('EXISTS', KEYS[1]) == 0 then return {} end
local up = ARGV[4] == '1'
local lo, hi = '-inf', '+inf'
if ARGV[1] == '1' then
  local s = redis.call('ZSCORE', KEYS[2], ARGV[2])
  if not s then return {} end
  if up then lo = '(' .. s else hi = '(' .. s end
end
local ids
if up then
  ids = redis.call('ZRANGEBYSCORE', KEYS[2], lo, hi, 'LIMIT', 0, ARGV[3])
else
  ids = redis.call('ZREVRANGEBYSCORE', KEYS[2], hi, lo, 'LIMIT', 0, ARGV[3])
end
local out = {}
for _, id in ipairs(ids) do
  local v = redis.call('HGET', KEYS[3], id)
  if v then out[#out + 1] = v end
end
return out
"#;

/// KEYS: conversation, order, items. ARGV: the item id. 1 when it was linked to the
/// conversation (and is now gone).
const DELETE_ITEM_LUA: &str = r#"
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
if redis.call('ZREM', KEYS[2], ARGV[1]) == 0 then return 0 end
redis.call('HDEL', KEYS[3], ARGV[1])
return 1
"#;

struct Scripts {
    chain: Script,
    append: Script,
    put_conversation: Script,
    get_conversation: Script,
    list: Script,
    delete_item: Script,
}

/// The shared connection, and how many times one was made (so a failed call drops only the
/// connection it used, never a newer one).
#[derive(Default)]
struct Slot {
    generation: u64,
    con: Option<MultiplexedConnection>,
}

/// `--history-backend redis`.
pub(crate) struct RedisHistory {
    client: Client,
    slot: Mutex<Slot>,
    /// Seconds every written key lives; 0 keeps them.
    ttl: u64,
    /// Bound on connecting and on each call.
    within: Duration,
    scripts: Scripts,
}

// === impl RedisHistory ===

impl RedisHistory {
    /// Connects (and checks the server answers) within `within`. `url` is
    /// `redis://[:password@]host:port[/db]`; `retention_days` at least 1, or -1 to keep
    /// records until deleted.
    pub(crate) async fn connect(url: &str, retention_days: i64, within: Duration) -> Result<RedisHistory, String> {
        // The URL may carry a password: not in the error.
        let client = Client::open(url).map_err(|e| format!("--history-backend redis: the URL: {e}"))?;
        let ttl = if retention_days >= 1 { (retention_days as u64).saturating_mul(86_400) } else { 0 };
        let with_touch = |s: &str| Script::new(&format!("{TOUCH_LUA}{s}"));
        let scripts = Scripts {
            chain: Script::new(CHAIN_LUA),
            append: with_touch(APPEND_LUA),
            put_conversation: with_touch(PUT_CONVERSATION_LUA),
            get_conversation: with_touch(GET_CONVERSATION_LUA),
            list: Script::new(LIST_LUA),
            delete_item: Script::new(DELETE_ITEM_LUA),
        };
        let store = RedisHistory { client, slot: Mutex::new(Slot::default()), ttl, within, scripts };
        let (_, mut con) = store.connection().await.map_err(|Unavailable(e)| format!("--history-backend {e}"))?;
        let pong: Result<String, String> = bounded(within, redis::cmd("PING").query_async(&mut con)).await;
        pong.map_err(|e| format!("--history-backend {e}"))?;
        Ok(store)
    }

    /// The shared connection, made anew when there is none.
    async fn connection(&self) -> Result<(u64, MultiplexedConnection), Unavailable> {
        let mut slot = self.slot.lock().await;
        if let Some(con) = &slot.con {
            return Ok((slot.generation, con.clone()));
        }
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.within))
            .set_response_timeout(Some(self.within));
        let con = bounded(self.within, self.client.get_multiplexed_async_connection_with_config(&config))
            .await
            .map_err(Unavailable)?;
        slot.generation += 1;
        slot.con = Some(con.clone());
        Ok((slot.generation, con))
    }

    /// Drops connection `generation` (if it is still the shared one).
    async fn drop_connection(&self, generation: u64) {
        let mut slot = self.slot.lock().await;
        if slot.generation == generation {
            slot.con = None;
        }
    }

    async fn call(&self, op: Op) -> Result<Reply, Unavailable> {
        let (generation, mut con) =
            tokio::time::timeout(self.within, self.connection()).await.map_err(|_| late(self.within))??;
        match tokio::time::timeout(self.within, self.run(&mut con, op)).await {
            Ok(Ok(reply)) => Ok(reply),
            Ok(Err(Failure::Redis(e))) => {
                // A server's error reply (a script's, a key of another type) leaves the
                // connection sound; anything else (I/O, a timeout, a broken reply) drops it.
                if e.is_io_error() || e.is_unrecoverable_error() {
                    self.drop_connection(generation).await;
                }
                Err(Unavailable(format!("redis: {e}")))
            }
            Ok(Err(Failure::Record(e))) => Err(Unavailable(e)),
            Err(_) => {
                self.drop_connection(generation).await;
                Err(late(self.within))
            }
        }
    }

    fn conversation_keys(id: &str) -> [String; 3] {
        [
            format!("{KEY_PREFIX}conversation:{id}"),
            format!("{KEY_PREFIX}conversation-order:{id}"),
            format!("{KEY_PREFIX}conversation-items:{id}"),
        ]
    }

    async fn run(&self, con: &mut MultiplexedConnection, op: Op) -> Result<Reply, Failure> {
        let response_key = |id: &str| format!("{KEY_PREFIX}response:{id}");
        Ok(match op {
            Op::Flush => Reply::Done,
            Op::PutResponse(r) => {
                let key = response_key(&r.id);
                let mut pipe = redis::pipe();
                pipe.atomic().cmd("DEL").arg(&key).ignore();
                pipe.cmd("HSET").arg(&key).arg("record").arg(encode(&*r)?);
                if let Some(previous) = &r.previous {
                    pipe.arg("previous").arg(previous);
                }
                pipe.ignore();
                if self.ttl > 0 {
                    pipe.cmd("EXPIRE").arg(&key).arg(self.ttl).ignore();
                }
                let () = pipe.query_async(con).await?;
                Reply::Done
            }
            Op::GetResponse(id) => {
                let record: Option<String> =
                    redis::cmd("HGET").arg(response_key(&id)).arg("record").query_async(con).await?;
                Reply::Response(record.map(|r| decode(&r)).transpose()?)
            }
            Op::Chain(id) => {
                let mut call = self.scripts.chain.prepare_invoke();
                call.arg(response_key("")).arg(id).arg(MAX_CHAIN);
                let records: Option<Vec<String>> = call.invoke_async(con).await?;
                Reply::Chain(match records {
                    Some(records) => Some(records.iter().rev().map(|r| decode(r)).collect::<Result<_, _>>()?),
                    None => None,
                })
            }
            Op::DeleteResponse(id) => {
                let n: i64 = redis::cmd("DEL").arg(response_key(&id)).query_async(con).await?;
                Reply::Deleted(n > 0)
            }
            Op::PutConversation(c) => {
                let mut call = self.scripts.put_conversation.prepare_invoke();
                call.key(&Self::conversation_keys(&c.id)).arg(self.ttl).arg(encode(&c)?);
                let _: i64 = call.invoke_async(con).await?;
                Reply::Done
            }
            Op::GetConversation(id) => {
                let mut call = self.scripts.get_conversation.prepare_invoke();
                call.key(&Self::conversation_keys(&id)).arg(self.ttl);
                let record: Option<String> = call.invoke_async(con).await?;
                Reply::Conversation(record.map(|r| decode(&r)).transpose()?)
            }
            Op::DeleteConversation(id) => {
                let [record, order, items] = Self::conversation_keys(&id);
                let (n, _): (i64, i64) = redis::pipe()
                    .atomic()
                    .cmd("DEL")
                    .arg(record)
                    .cmd("DEL")
                    .arg(order)
                    .arg(items)
                    .query_async(con)
                    .await?;
                Reply::Deleted(n > 0)
            }
            Op::AppendItems { conversation, items } => {
                if items.is_empty() {
                    return Ok(Reply::Done);
                }
                let mut call = self.scripts.append.prepare_invoke();
                call.key(&Self::conversation_keys(&conversation)).arg(self.ttl);
                for item in &items {
                    call.arg(&item.id).arg(encode(item)?);
                }
                let _: i64 = call.invoke_async(con).await?;
                Reply::Done
            }
            Op::ListItems { conversation, after, limit, ascending } => {
                if limit == 0 {
                    return Ok(Reply::Items(Vec::new()));
                }
                let mut call = self.scripts.list.prepare_invoke();
                call.key(&Self::conversation_keys(&conversation))
                    .arg(if after.is_some() { "1" } else { "0" })
                    .arg(after.unwrap_or_default())
                    .arg(limit.min(i64::MAX as usize))
                    .arg(if ascending { "1" } else { "0" });
                let records: Vec<String> = call.invoke_async(con).await?;
                Reply::Items(records.iter().map(|r| decode(r)).collect::<Result<_, _>>()?)
            }
            Op::GetItem { conversation, item } => {
                let [record, order, items] = Self::conversation_keys(&conversation);
                let (exists, position, record): (bool, Option<f64>, Option<String>) = redis::pipe()
                    .atomic()
                    .cmd("EXISTS")
                    .arg(record)
                    .cmd("ZSCORE")
                    .arg(order)
                    .arg(&item)
                    .cmd("HGET")
                    .arg(items)
                    .arg(&item)
                    .query_async(con)
                    .await?;
                let linked = exists && position.is_some();
                Reply::Item(if linked { record.map(|r| decode(&r)).transpose()? } else { None })
            }
            Op::DeleteItem { conversation, item } => {
                let mut call = self.scripts.delete_item.prepare_invoke();
                call.key(&Self::conversation_keys(&conversation)).arg(item);
                let n: i64 = call.invoke_async(con).await?;
                Reply::Deleted(n > 0)
            }
        })
    }
}

impl Remote for RedisHistory {
    fn apply(&self, op: Op, _now: u64) -> Pin<Box<dyn Future<Output = Result<Reply, Unavailable>> + Send + '_>> {
        Box::pin(self.call(op))
    }
}

/// Why a call failed: Redis, or a record that does not read back.
enum Failure {
    Redis(RedisError),
    Record(String),
}

impl From<RedisError> for Failure {
    fn from(e: RedisError) -> Self {
        Failure::Redis(e)
    }
}

fn encode<T: Serialize>(record: &T) -> Result<String, Failure> {
    sonic_rs::to_string(record).map_err(|e| Failure::Record(format!("redis: a record did not encode: {e}")))
}

fn decode<T: DeserializeOwned>(record: &str) -> Result<T, Failure> {
    sonic_rs::from_str(record).map_err(|e| Failure::Record(format!("redis: a stored record does not read: {e}")))
}

fn late(within: Duration) -> Unavailable {
    Unavailable(format!("redis: no answer within {within:?}"))
}

async fn bounded<T>(within: Duration, f: impl Future<Output = redis::RedisResult<T>>) -> Result<T, String> {
    match tokio::time::timeout(within, f).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(format!("redis: {e}")),
        Err(_) => Err(format!("redis: no answer within {within:?}")),
    }
}
