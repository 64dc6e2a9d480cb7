//! The buckets in Redis, shared by every gateway replica: the same semantics as
//! [`LocalStore`](super::store::LocalStore) (`lease_from` and `apply`, step for step), run by
//! two Lua scripts so that one lease, over all of a request's scopes, is one atomic
//! round-trip. The scripts read Redis' own clock (`TIME`), so replicas' clocks don't matter.
//!
//! A bucket is the hash `smg:budget:<key>` with `tokens`, `requests` (doubles, written with 17
//! significant digits so they read back exactly) and `at` (server microseconds). Every write
//! sets a TTL that outlasts the refill back to full, so idle tenants vanish and nothing is
//! forgiven early (a bucket that reappears starts full, which is where it would have been).
//!
//! Runs on the budget owner's control thread (a single-threaded tokio runtime), never on a
//! shard. Every call answers within [`RESPONSE_TIMEOUT`] (connecting within
//! [`CONNECT_TIMEOUT`]), so the owner can fall back to its local store and reconnect later.

use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, Script, Value};

use super::store::{Delta, Lease, LeaseAnswer, LeaseAsk};

/// Bound on `connect`: TCP, handshake and loading both scripts.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// Bound on one `lease` or `apply`.
pub const RESPONSE_TIMEOUT: Duration = Duration::from_secs(1);
/// Prefix of every bucket's key.
pub const KEY_PREFIX: &str = "smg:budget:";

/// Helpers shared by both scripts: Rust's `f64::max`/`min` (a NaN loses, where Lua's
/// `math.max` would keep it), the bucket as `LocalStore::bucket` finds it (full when missing,
/// then refilled), and the write with its TTL.
const COMMON_LUA: &str = r#"
if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])

local function fmax(a, b)
  if a ~= a then return b end
  if b ~= b then return a end
  if a > b then return a end
  return b
end
local function fmin(a, b)
  if a ~= a then return b end
  if b ~= b then return a end
  if a < b then return a end
  return b
end

-- Bucket::refill: secs = saturating (now - at), continuous refill of capacity/60 per second.
local function refill(b, tpm, rpm)
  local secs = fmax(now - b.at, 0) / 1000000
  b.at = now
  b.t = fmin(b.t + secs * tpm / 60.0, tpm)
  b.r = fmin(b.r + secs * rpm / 60.0, rpm)
end

-- LocalStore::bucket: the stored bucket (or a full one), refilled, kept in `cache` for the
-- rest of the script as the map keeps it.
local function bucket(cache, key, tpm, rpm)
  local b = cache[key]
  if not b then
    local v = redis.call('HMGET', key, 'tokens', 'requests', 'at')
    local bt, br, bat = tonumber(v[1]), tonumber(v[2]), tonumber(v[3])
    if bt and br and bat then
      b = {t = bt, r = br, at = bat}
    else
      b = {t = tpm, r = rpm, at = now}
    end
    cache[key] = b
  end
  refill(b, tpm, rpm)
  return b
end

local function num(x) return string.format('%.17g', x) end

-- Kept until it would be full again (and 60 s more), at least 120 s, at most 30 days.
local function save(key, b, tpm, rpm)
  local full = fmax((tpm - b.t) * 60 / tpm, (rpm - b.r) * 60 / rpm)
  local ttl = fmin(fmax(120, math.ceil(full) + 60), 2592000)
  redis.call('HSET', key, 'tokens', num(b.t), 'requests', num(b.r), 'at', num(b.at))
  redis.call('EXPIRE', key, ttl)
end
"#;

/// `lease_from` over the refilled buckets. KEYS: one per scope, in order. ARGV: six per
/// scope: tokens_per_minute, requests_per_minute, need_tokens, want_tokens, need_requests,
/// want_requests. Returns {1, tokens1, requests1, ...} when granted, {0, wait_secs} (a
/// string, so the Rust side rounds it exactly as `lease_from` does) or {-1} (never).
const LEASE_LUA: &str = r#"
local cache, bs, as = {}, {}, {}
for i, key in ipairs(KEYS) do
  local o = (i - 1) * 6
  local a = {tpm = tonumber(ARGV[o + 1]), rpm = tonumber(ARGV[o + 2]),
             nt = tonumber(ARGV[o + 3]), wt = tonumber(ARGV[o + 4]),
             nr = tonumber(ARGV[o + 5]), wr = tonumber(ARGV[o + 6])}
  local b = bucket(cache, key, a.tpm, a.rpm)
  as[i] = a
  bs[i] = {t = b.t, r = b.r, at = b.at}
end

-- Bucket::wait_for; nil when a need is above its capacity.
local wait, never = 0, false
for i, a in ipairs(as) do
  local b = bs[i]
  if a.nt > a.tpm or a.nr > a.rpm then
    never = true
  else
    local st = fmax(a.nt - b.t, 0)
    local sr = fmax(a.nr - b.r, 0)
    wait = fmax(wait, fmax(st * 60 / a.tpm, sr * 60 / a.rpm))
  end
end

local reply
if never then
  reply = {-1}
elseif not (wait <= 0) then
  reply = {0, num(wait)}
else
  reply = {1}
  for i, a in ipairs(as) do
    local b = bs[i]
    local gt = fmin(fmax(fmax(math.floor(b.t), 0), a.nt), fmax(a.wt, a.nt))
    local gr = fmin(fmax(fmax(math.floor(b.r), 0), a.nr), fmax(a.wr, a.nr))
    b.t = b.t - gt
    b.r = b.r - gr
    reply[#reply + 1] = gt
    reply[#reply + 1] = gr
  end
end
-- As LocalStore: every scope's copy is written back, granted or not, the last one winning.
for i, key in ipairs(KEYS) do
  save(key, bs[i], as[i].tpm, as[i].rpm)
end
return reply
"#;

/// `LocalStore::apply`. KEYS: one per delta, in order. ARGV: four per delta:
/// tokens_per_minute, requests_per_minute, tokens, requests. Returns the number of deltas.
const APPLY_LUA: &str = r#"
local cache, order, lim = {}, {}, {}
for i, key in ipairs(KEYS) do
  local o = (i - 1) * 4
  local tpm, rpm = tonumber(ARGV[o + 1]), tonumber(ARGV[o + 2])
  if not cache[key] then order[#order + 1] = key end
  local b = bucket(cache, key, tpm, rpm)
  b.t = fmin(b.t - tonumber(ARGV[o + 3]), tpm)
  b.r = fmin(b.r - tonumber(ARGV[o + 4]), rpm)
  lim[key] = {tpm, rpm}
end
for _, key in ipairs(order) do
  save(key, cache[key], lim[key][1], lim[key][2])
end
return #KEYS
"#;

/// One connection to the Redis that holds every replica's budgets.
pub struct RedisStore {
    client: Client,
    con: MultiplexedConnection,
    lease: Script,
    apply: Script,
}

impl std::fmt::Debug for RedisStore {
    /// The server's address only: a URL may carry a password.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RedisStore({})", self.client.get_connection_info().addr())
    }
}

// === impl RedisStore ===

impl RedisStore {
    /// Connects (and loads the scripts) within [`CONNECT_TIMEOUT`]. `url` is
    /// `redis://host:port[/db]`.
    pub async fn connect(url: &str) -> Result<RedisStore, String> {
        // The URL may carry a password: not in the error.
        let client = Client::open(url).map_err(|e| format!("redis URL: {e}"))?;
        let lease = Script::new(&format!("{COMMON_LUA}{LEASE_LUA}"));
        let apply = Script::new(&format!("{COMMON_LUA}{APPLY_LUA}"));
        let con = open(&client, &[&lease, &apply]).await?;
        Ok(RedisStore { client, con, lease, apply })
    }

    /// A new connection to the same server (after an error, once Redis may be back).
    pub async fn reconnect(&mut self) -> Result<(), String> {
        self.con = open(&self.client, &[&self.lease, &self.apply]).await?;
        Ok(())
    }

    /// One round-trip: an atomic Lua script over every scope's key. An error after the
    /// script ran (an answer later than [`RESPONSE_TIMEOUT`]) loses that lease: the budget
    /// errs on the side of granting less, never more.
    pub async fn lease(&mut self, asks: &[LeaseAsk]) -> Result<Lease, String> {
        if asks.is_empty() {
            return Ok(Lease { answer: LeaseAnswer::Granted, granted: Vec::new() });
        }
        let mut call = self.lease.prepare_invoke();
        for a in asks {
            call.key(format!("{KEY_PREFIX}{}", a.key))
                .arg(a.limits.tokens_per_minute)
                .arg(a.limits.requests_per_minute)
                .arg(a.need_tokens)
                .arg(a.want_tokens)
                .arg(a.need_requests)
                .arg(a.want_requests);
        }
        let reply: Vec<Value> = bounded(RESPONSE_TIMEOUT, call.invoke_async(&mut self.con)).await?;
        lease_reply(&reply, asks.len()).ok_or_else(|| format!("redis: unexpected lease reply {reply:?}"))
    }

    /// One round-trip for a batch of deltas.
    pub async fn apply(&mut self, deltas: &[Delta]) -> Result<(), String> {
        if deltas.is_empty() {
            return Ok(());
        }
        let mut call = self.apply.prepare_invoke();
        for d in deltas {
            call.key(format!("{KEY_PREFIX}{}", d.key))
                .arg(d.limits.tokens_per_minute)
                .arg(d.limits.requests_per_minute)
                .arg(d.tokens)
                .arg(d.requests);
        }
        let n: i64 = bounded(RESPONSE_TIMEOUT, call.invoke_async(&mut self.con)).await?;
        if n != deltas.len() as i64 {
            return Err(format!("redis: apply took {n} of {} deltas", deltas.len()));
        }
        Ok(())
    }
}

/// A connection with both scripts loaded, within [`CONNECT_TIMEOUT`] in all.
async fn open(client: &Client, scripts: &[&Script]) -> Result<MultiplexedConnection, String> {
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(CONNECT_TIMEOUT))
        .set_response_timeout(Some(RESPONSE_TIMEOUT));
    bounded(CONNECT_TIMEOUT, async {
        let mut con = client.get_multiplexed_async_connection_with_config(&config).await?;
        for s in scripts {
            s.load_async(&mut con).await?;
        }
        Ok(con)
    })
    .await
}

async fn bounded<T>(
    within: Duration,
    f: impl std::future::Future<Output = redis::RedisResult<T>>,
) -> Result<T, String> {
    match tokio::time::timeout(within, f).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(format!("redis: {e}")),
        Err(_) => Err(format!("redis: no answer within {within:?}")),
    }
}

/// The lease script's reply; the wait is rounded as `lease_from` rounds it.
fn lease_reply(reply: &[Value], scopes: usize) -> Option<Lease> {
    match reply.first()? {
        Value::Int(1) if reply.len() == 1 + 2 * scopes => {
            let n = |v: &Value| match v {
                Value::Int(x) if *x >= 0 => Some(*x as u64),
                _ => None,
            };
            let granted = reply[1..].chunks(2).map(|c| Some((n(&c[0])?, n(&c[1])?))).collect::<Option<Vec<_>>>()?;
            Some(Lease { answer: LeaseAnswer::Granted, granted })
        }
        Value::Int(0) if reply.len() == 2 => {
            let Value::BulkString(s) = &reply[1] else { return None };
            let w: f64 = std::str::from_utf8(s).ok()?.parse().ok()?;
            Some(Lease {
                answer: LeaseAnswer::Denied { retry_after_secs: Some(w.ceil().max(1.0) as u64) },
                granted: Vec::new(),
            })
        }
        Value::Int(-1) if reply.len() == 1 => {
            Some(Lease { answer: LeaseAnswer::Denied { retry_after_secs: None }, granted: Vec::new() })
        }
        _ => None,
    }
}
