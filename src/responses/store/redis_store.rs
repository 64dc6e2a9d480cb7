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

/// What both remote backends' tests share: the servers' plumbing, and the suites every
/// remote backend must pass (the same answers as [`Memory`](super::memory::Memory), replicas sharing
/// one store, an outage).
#[cfg(test)]
pub(super) mod testkit {
    use std::future::Future;
    use std::process::Command;
    use std::time::Duration;

    use super::super::history::History;
    use super::super::memory::Memory;
    use super::super::record::{
        unix_now, Backend, Conversation, Item, MemoryLimits, Op, Reply, StoredResponse, Unavailable, MAX_CHAIN,
    };
    use super::super::thread::start;

    /// Each call's bound in the tests.
    pub(crate) const WITHIN: Duration = Duration::from_secs(2);
    /// How long a server may take to come up (PostgreSQL's crash recovery included).
    pub(crate) const BOOT: Duration = Duration::from_secs(60);

    /// Runs `f` on a shard's kind of runtime (monoio), as `History::ask` is used.
    pub(crate) fn block_on<F: Future>(f: F) -> F::Output {
        let mut rt =
            monoio::RuntimeBuilder::<monoio::FusionDriver>::new().enable_timer().build().expect("monoio runtime");
        rt.block_on(f)
    }

    pub(crate) fn free_port() -> u16 {
        std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
    }

    /// Polls `ready` every 10 ms for at most `within`; true once it held.
    pub(crate) async fn eventually(within: Duration, mut ready: impl FnMut() -> bool) -> bool {
        let until = crate::clock::now() + within;
        loop {
            if ready() {
                return true;
            }
            if crate::clock::now() >= until {
                return false;
            }
            crate::io::sleep(Duration::from_millis(10)).await;
        }
    }

    /// `kill -s <sig> -- <target>` (a negative target: a process group).
    pub(crate) fn signal(sig: &str, target: &str) {
        let _ = Command::new("kill").args(["-s", sig, "--", target]).status();
    }

    /// A server of the test's own, which the outage suite stops and brings back.
    pub(crate) trait Server {
        fn backend(&self) -> Backend;
        /// Whether records survive `kill` and `restart`.
        fn durable(&self) -> bool;
        /// Stops answering (SIGSTOP), connections held open.
        fn freeze(&self);
        fn thaw(&self);
        /// Gone: connections broken, new ones refused.
        fn kill(&mut self);
        /// Up again on the same port (after `kill`), once it answers.
        async fn restart(&mut self);
    }

    pub(crate) fn response(id: &str, previous: Option<&str>) -> Op {
        Op::PutResponse(Box::new(StoredResponse {
            id: id.into(),
            tenant: Some("tenant-a".into()),
            previous: previous.map(Into::into),
            conversation: Some("conv-x".into()),
            created_at: 1_700_000_000,
            input: vec![format!(r#"{{"id":"in-{id}","type":"message","content":"h\u00e9llo \"quoted\" ✓"}}"#)],
            output: vec![format!(r#"{{"id":"out-{id}","type":"message"}}"#), "{}".into()],
            body: format!(r#"{{"id":"{id}","object":"response"}}"#),
            context: vec![("user".into(), "u-1".into())],
        }))
    }

    fn conversation(id: &str, metadata: Option<&str>) -> Op {
        Op::PutConversation(Conversation {
            id: id.into(),
            tenant: Some("tenant-a".into()),
            created_at: 1_700_000_000,
            metadata: metadata.map(Into::into),
        })
    }

    fn append(conversation: &str, ids: &[&str]) -> Op {
        let items = ids
            .iter()
            .map(|i| Item {
                id: (*i).into(),
                json: format!(r#"{{"id":"{i}","type":"message"}}"#),
                created_at: 1_700_000_001,
            })
            .collect();
        Op::AppendItems { conversation: conversation.into(), items }
    }

    fn list(conversation: &str, after: Option<&str>, limit: usize, ascending: bool) -> Op {
        Op::ListItems { conversation: conversation.into(), after: after.map(Into::into), limit, ascending }
    }

    fn get_item(conversation: &str, item: &str) -> Op {
        Op::GetItem { conversation: conversation.into(), item: item.into() }
    }

    fn delete_item(conversation: &str, item: &str) -> Op {
        Op::DeleteItem { conversation: conversation.into(), item: item.into() }
    }

    /// The ids a chain or a list answered (None: no chain).
    pub(crate) fn ids(reply: &Reply) -> Option<Vec<String>> {
        match reply {
            Reply::Chain(c) => c.as_ref().map(|c| c.iter().map(|r| r.id.clone()).collect()),
            Reply::Items(i) => Some(i.iter().map(|i| i.id.clone()).collect()),
            r => panic!("not a chain or a list: {r:?}"),
        }
    }

    fn some(ids: &[&str]) -> Option<Vec<String>> {
        Some(ids.iter().map(|i| (*i).to_string()).collect())
    }

    /// The remote store and a [`Memory`], asked the same.
    struct Both<'a> {
        remote: &'a History,
        memory: Memory,
    }

    impl Both<'_> {
        /// The remote's answer, which must be memory's.
        async fn ask(&mut self, op: Op) -> Reply {
            let want = self.memory.apply(op.clone(), unix_now());
            let got = self.remote.ask(op.clone()).await.unwrap_or_else(|e| panic!("{op:?}: {e:?}"));
            assert_eq!(got, want, "{op:?}");
            got
        }
    }

    /// Every op, answered as memory answers it (memory.rs's tests, and more).
    pub(crate) async fn every_op_as_memory(h: &History) {
        let mut b = Both { remote: h, memory: Memory::new(MemoryLimits::default()) };

        // Responses and their chains.
        assert_eq!(b.ask(response("a", None)).await, Reply::Done);
        b.ask(response("b", Some("a"))).await;
        b.ask(response("c", Some("b"))).await;
        assert_eq!(ids(&b.ask(Op::Chain("c".into())).await), some(&["a", "b", "c"]));
        assert!(matches!(b.ask(Op::GetResponse("b".into())).await, Reply::Response(Some(_))));
        assert_eq!(b.ask(Op::GetResponse("zzz".into())).await, Reply::Response(None));
        assert_eq!(ids(&b.ask(Op::Chain("zzz".into())).await), None);
        assert_eq!(b.ask(Op::DeleteResponse("a".into())).await, Reply::Deleted(true));
        assert_eq!(b.ask(Op::DeleteResponse("a".into())).await, Reply::Deleted(false));
        assert_eq!(ids(&b.ask(Op::Chain("c".into())).await), None, "a link is missing");
        assert_eq!(ids(&b.ask(Op::Chain("b".into())).await), None);
        // A put replaces: c no longer follows b.
        b.ask(response("c", None)).await;
        assert_eq!(ids(&b.ask(Op::Chain("c".into())).await), some(&["c"]));
        // A loop of previous ids, and the bound: MAX_CHAIN links answer, one more does not.
        b.ask(response("x", Some("y"))).await;
        b.ask(response("y", Some("x"))).await;
        assert_eq!(ids(&b.ask(Op::Chain("x".into())).await), None, "a loop");
        for i in 0..=MAX_CHAIN {
            let previous = (i > 0).then(|| format!("long-{}", i - 1));
            b.ask(response(&format!("long-{i}"), previous.as_deref())).await;
        }
        let longest = ids(&b.ask(Op::Chain(format!("long-{}", MAX_CHAIN - 1))).await).expect("MAX_CHAIN links");
        assert_eq!((longest.len(), longest[0].as_str()), (MAX_CHAIN, "long-0"));
        assert_eq!(ids(&b.ask(Op::Chain(format!("long-{MAX_CHAIN}"))).await), None, "longer than MAX_CHAIN");

        // Conversations and their items.
        assert_eq!(b.ask(conversation("c1", None)).await, Reply::Done);
        assert!(matches!(b.ask(Op::GetConversation("c1".into())).await, Reply::Conversation(Some(_))));
        assert_eq!(b.ask(append("c1", &["1", "2", "3"])).await, Reply::Done);
        assert_eq!(ids(&b.ask(list("c1", None, 10, true)).await), some(&["1", "2", "3"]));
        assert_eq!(ids(&b.ask(list("c1", None, 2, false)).await), some(&["3", "2"]));
        assert_eq!(ids(&b.ask(list("c1", Some("1"), 10, true)).await), some(&["2", "3"]));
        assert_eq!(ids(&b.ask(list("c1", Some("3"), 10, false)).await), some(&["2", "1"]));
        assert_eq!(ids(&b.ask(list("c1", Some("2"), 1, true)).await), some(&["3"]));
        assert_eq!(ids(&b.ask(list("c1", Some("3"), 10, true)).await), some(&[]));
        assert_eq!(ids(&b.ask(list("c1", Some("x"), 10, true)).await), some(&[]), "an unknown cursor");
        assert_eq!(ids(&b.ask(list("c1", Some("x"), 10, false)).await), some(&[]));
        assert_eq!(ids(&b.ask(list("c1", None, 0, true)).await), some(&[]));
        assert_eq!(ids(&b.ask(list("c1", None, usize::MAX, false)).await), some(&["3", "2", "1"]));
        // A conversation that is not stored takes no items.
        assert_eq!(b.ask(append("nope", &["9"])).await, Reply::Done);
        assert_eq!(b.ask(Op::GetConversation("nope".into())).await, Reply::Conversation(None));
        assert_eq!(ids(&b.ask(list("nope", None, 10, true)).await), some(&[]));
        assert_eq!(b.ask(get_item("nope", "9")).await, Reply::Item(None));
        // An item is found only through its own conversation.
        b.ask(conversation("c2", None)).await;
        b.ask(append("c2", &["4"])).await;
        assert!(matches!(b.ask(get_item("c1", "2")).await, Reply::Item(Some(_))));
        assert_eq!(b.ask(get_item("c2", "2")).await, Reply::Item(None));
        assert_eq!(b.ask(get_item("c1", "4")).await, Reply::Item(None));
        // Replacing the record keeps the items.
        b.ask(conversation("c1", Some(r#"{"topic":"demo"}"#))).await;
        assert!(matches!(
            b.ask(Op::GetConversation("c1".into())).await,
            Reply::Conversation(Some(Conversation { metadata: Some(_), .. }))
        ));
        assert_eq!(ids(&b.ask(list("c1", None, 10, true)).await), some(&["1", "2", "3"]));
        // Deleting an item.
        assert_eq!(b.ask(delete_item("c1", "2")).await, Reply::Deleted(true));
        assert_eq!(b.ask(delete_item("c1", "2")).await, Reply::Deleted(false));
        assert_eq!(b.ask(delete_item("c2", "1")).await, Reply::Deleted(false), "not linked to c2");
        assert_eq!(b.ask(delete_item("nope", "1")).await, Reply::Deleted(false));
        assert_eq!(ids(&b.ask(list("c1", None, 10, true)).await), some(&["1", "3"]));
        assert_eq!(b.ask(get_item("c1", "2")).await, Reply::Item(None));
        assert_eq!(ids(&b.ask(list("c1", Some("2"), 10, true)).await), some(&[]), "a deleted cursor");
        b.ask(append("c1", &["5", "6"])).await;
        assert_eq!(ids(&b.ask(list("c1", None, 10, true)).await), some(&["1", "3", "5", "6"]));
        assert_eq!(ids(&b.ask(list("c1", Some("3"), 10, false)).await), some(&["1"]));
        // Deleting the conversation takes its items, and only its.
        assert_eq!(b.ask(Op::DeleteConversation("c1".into())).await, Reply::Deleted(true));
        assert_eq!(b.ask(Op::DeleteConversation("c1".into())).await, Reply::Deleted(false));
        assert_eq!(b.ask(Op::GetConversation("c1".into())).await, Reply::Conversation(None));
        assert_eq!(ids(&b.ask(list("c1", None, 10, true)).await), some(&[]));
        assert_eq!(b.ask(get_item("c1", "1")).await, Reply::Item(None));
        assert_eq!(ids(&b.ask(list("c2", None, 10, true)).await), some(&["4"]));
        b.ask(conversation("c1", None)).await;
        assert_eq!(ids(&b.ask(list("c1", None, 10, true)).await), some(&[]), "a new c1 starts empty");
        b.ask(append("c1", &["7"])).await;
        assert_eq!(ids(&b.ask(list("c1", None, 10, true)).await), some(&["7"]));

        // Where a remote store differs from memory, by design: an item belongs to its
        // conversation, and an id appended again keeps its first position, newer record.
        let ask = |op: Op| async move { h.ask(op).await.unwrap_or_else(|e| panic!("{e:?}")) };
        ask(conversation("d1", None)).await;
        ask(conversation("d2", None)).await;
        ask(append("d1", &["p", "q", "p"])).await;
        ask(append("d2", &["p"])).await;
        let again = Item { id: "p".into(), json: r#"{"id":"p","v":2}"#.into(), created_at: 5 };
        ask(Op::AppendItems { conversation: "d1".into(), items: vec![again.clone()] }).await;
        assert_eq!(ids(&ask(list("d1", None, 10, true)).await), some(&["p", "q"]));
        assert_eq!(ask(get_item("d1", "p")).await, Reply::Item(Some(again)));
        assert_eq!(ask(delete_item("d1", "p")).await, Reply::Deleted(true));
        assert_eq!(ids(&ask(list("d2", None, 10, true)).await), some(&["p"]), "d2's own p stays");
        assert!(matches!(ask(get_item("d2", "p")).await, Reply::Item(Some(_))));
    }

    /// Two gateway replicas (two `start`s) on one store: each chains off the other's
    /// responses, and their concurrent appends to one conversation stay whole.
    pub(crate) async fn two_replicas(backend: Backend) {
        let a = start(backend.clone(), WITHIN).expect("replica a");
        let b = start(backend, WITHIN).expect("replica b");
        a.ask(response("rep-1", None)).await.unwrap();
        b.ask(response("rep-2", Some("rep-1"))).await.unwrap();
        a.ask(response("rep-3", Some("rep-2"))).await.unwrap();
        let on_b = b.ask(Op::Chain("rep-3".into())).await.unwrap();
        assert_eq!(ids(&on_b), some(&["rep-1", "rep-2", "rep-3"]));
        assert_eq!(a.ask(Op::Chain("rep-3".into())).await.unwrap(), on_b);

        a.ask(conversation("rep-c", None)).await.unwrap();
        let appends = (0..20).map(|k| {
            let h = if k % 2 == 0 { &a } else { &b };
            let (first, second) = (format!("{k}-a"), format!("{k}-b"));
            async move { h.ask(append("rep-c", &[&first, &second])).await }
        });
        for r in futures_util::future::join_all(appends).await {
            assert_eq!(r.unwrap(), Reply::Done);
        }
        let listed = ids(&b.ask(list("rep-c", None, 100, true)).await.unwrap()).unwrap();
        assert_eq!(listed.len(), 40, "{listed:?}");
        for pair in listed.chunks(2) {
            let k = pair[0].strip_suffix("-a").unwrap_or_else(|| panic!("an append was split: {listed:?}"));
            assert_eq!(pair[1], format!("{k}-b"), "an append was split: {listed:?}");
        }
        assert!(matches!(a.ask(get_item("rep-c", "7-b")).await.unwrap(), Reply::Item(Some(_))));
        assert_eq!(b.ask(Op::DeleteConversation("rep-c".into())).await.unwrap(), Reply::Deleted(true));
        assert_eq!(a.ask(Op::GetConversation("rep-c".into())).await.unwrap(), Reply::Conversation(None));
    }

    /// One call: Unavailable, answered within the bound.
    async fn unavailable_in_time(h: &History, what: &str) {
        let t = crate::clock::now();
        let r = h.ask(Op::GetResponse("o-1".into())).await;
        let took = crate::clock::now() - t;
        assert!(matches!(r, Err(Unavailable(_))), "{what}: {r:?}");
        assert!(took < WITHIN + Duration::from_secs(2), "{what}: answered after {took:?}");
    }

    /// Calls succeed again within `BOOT`.
    async fn answers_again(h: &History) -> bool {
        let until = crate::clock::now() + BOOT;
        loop {
            if h.ask(Op::GetResponse("o-1".into())).await.is_ok() {
                return true;
            }
            if crate::clock::now() >= until {
                return false;
            }
            crate::io::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The server freezes, then dies: every call answers Unavailable within the bound (none
    /// hangs), and once the server is back the same handle works again.
    pub(crate) async fn outage(server: &mut impl Server) {
        let h = start(server.backend(), WITHIN).expect("start");
        h.ask(response("o-1", None)).await.unwrap();
        h.ask(response("o-2", Some("o-1"))).await.unwrap();

        server.freeze();
        unavailable_in_time(&h, "frozen").await;
        unavailable_in_time(&h, "still frozen").await;
        server.thaw();
        assert!(answers_again(&h).await, "never answered again after a freeze");
        assert_eq!(ids(&h.ask(Op::Chain("o-2".into())).await.unwrap()), some(&["o-1", "o-2"]));

        server.kill();
        unavailable_in_time(&h, "killed").await;
        unavailable_in_time(&h, "still down").await;
        server.restart().await;
        assert!(answers_again(&h).await, "never answered again after a restart");
        if server.durable() {
            assert_eq!(ids(&h.ask(Op::Chain("o-2".into())).await.unwrap()), some(&["o-1", "o-2"]));
        }
        h.ask(response("o-3", Some("o-2"))).await.unwrap();
        assert!(matches!(h.ask(Op::GetResponse("o-3".into())).await.unwrap(), Reply::Response(Some(_))));
    }

    /// `start` refuses a server that is not there, within the bound.
    pub(crate) fn unreachable_at_start(backend: Backend) {
        let t = crate::clock::now();
        let r = start(backend, WITHIN);
        let took = crate::clock::now() - t;
        let Err(e) = r else { panic!("started without a server") };
        assert!(e.starts_with("--history-backend"), "{e}");
        assert!(took < WITHIN + Duration::from_secs(2), "refused after {took:?}");
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::process::{Child, Command, Stdio};
    use std::time::Duration;

    use super::super::record::{Backend, Op, Reply};
    use super::super::thread::start;
    use super::testkit::{self, block_on, eventually, free_port, signal, Server, BOOT, WITHIN};

    /// A `redis-server` of the test's own on a free loopback port (no persistence), killed on
    /// drop: the Debian package .ci/run installs.
    struct RedisServer {
        child: Option<Child>,
        port: u16,
        dir: PathBuf,
    }

    impl RedisServer {
        async fn start() -> RedisServer {
            let port = free_port();
            let dir = std::env::temp_dir().join(format!("smg-history-redis-{}-{port}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            let mut s = RedisServer { child: None, port, dir };
            s.spawn().await;
            s
        }

        async fn spawn(&mut self) {
            let child = Command::new("redis-server")
                .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
                .arg("--dir")
                .arg(&self.dir)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("redis-server is not installed (.ci/run installs the Debian package)");
            self.child = Some(child);
            let port = self.port;
            assert!(eventually(BOOT, || pong(port)).await, "redis-server never answered PING");
        }

        fn pid(&self) -> String {
            self.child.as_ref().expect("running").id().to_string()
        }

        fn url(&self) -> String {
            format!("redis://127.0.0.1:{}", self.port)
        }
    }

    impl Server for RedisServer {
        fn backend(&self) -> Backend {
            Backend::Redis { url: self.url(), retention_days: 1 }
        }

        fn durable(&self) -> bool {
            false
        }

        fn freeze(&self) {
            signal("STOP", &self.pid());
        }

        fn thaw(&self) {
            signal("CONT", &self.pid());
        }

        fn kill(&mut self) {
            if let Some(mut c) = self.child.take() {
                // A frozen server must still die.
                signal("CONT", &c.id().to_string());
                let _ = c.kill();
                let _ = c.wait();
            }
        }

        async fn restart(&mut self) {
            self.kill();
            self.spawn().await;
        }
    }

    impl Drop for RedisServer {
        fn drop(&mut self) {
            self.kill();
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    /// One PING answered.
    fn pong(port: u16) -> bool {
        use std::io::{Read, Write};
        let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else { return false };
        let _ = s.set_read_timeout(Some(Duration::from_millis(200)));
        let mut buf = [0u8; 7];
        s.write_all(b"PING\r\n").is_ok() && s.read_exact(&mut buf).is_ok() && &buf == b"+PONG\r\n"
    }

    #[test]
    fn every_op_answers_as_memory_does_and_replicas_share_the_store() {
        block_on(async {
            let server = RedisServer::start().await;
            let h = start(server.backend(), WITHIN).expect("start");
            testkit::every_op_as_memory(&h).await;
            testkit::two_replicas(server.backend()).await;
        });
    }

    #[test]
    fn an_outage_answers_unavailable_in_time_and_a_restart_heals() {
        block_on(async {
            let mut server = RedisServer::start().await;
            testkit::outage(&mut server).await;
        });
    }

    #[test]
    fn start_fails_without_a_server() {
        block_on(async {
            testkit::unreachable_at_start(Backend::Redis {
                url: format!("redis://127.0.0.1:{}", free_port()),
                retention_days: 1,
            });
        });
    }

    /// The keys, and the retention on every one written: a day, or none with -1.
    #[test]
    fn every_key_written_gets_the_retention() {
        block_on(async {
            let server = RedisServer::start().await;
            let mut raw = redis::Client::open(server.url()).unwrap().get_connection().unwrap();
            let mut ttl = |key: &str| -> i64 { redis::cmd("TTL").arg(key).query(&mut raw).unwrap() };
            for (retention_days, tag) in [(1, "day"), (-1, "kept")] {
                let h = start(Backend::Redis { url: server.url(), retention_days }, WITHIN).expect("start");
                h.ask(testkit::response(&format!("r-{tag}"), None)).await.unwrap();
                let conversation = super::super::record::Conversation {
                    id: format!("c-{tag}"),
                    tenant: None,
                    created_at: 0,
                    metadata: None,
                };
                h.ask(Op::PutConversation(conversation)).await.unwrap();
                let item = super::super::record::Item { id: "i".into(), json: r#"{"id":"i"}"#.into(), created_at: 0 };
                let append = Op::AppendItems { conversation: format!("c-{tag}"), items: vec![item] };
                assert_eq!(h.ask(append).await.unwrap(), Reply::Done);
                for key in [
                    format!("smg:history:response:r-{tag}"),
                    format!("smg:history:conversation:c-{tag}"),
                    format!("smg:history:conversation-order:c-{tag}"),
                    format!("smg:history:conversation-items:c-{tag}"),
                ] {
                    let t = ttl(&key);
                    match retention_days {
                        1 => assert!((86_000..=86_400).contains(&t), "{key}: TTL {t}"),
                        _ => assert_eq!(t, -1, "{key}: TTL {t} (-2: no such key)"),
                    }
                }
            }
        });
    }
}
