//! `RedisStore` against a real `redis-server` on a free loopback port: the same answers as
//! `LocalStore` for the same sequence, one budget shared by two replicas, server time for
//! refill and debt, and quick errors when Redis dies or hangs, then a reconnect once it is back.
// A test's threads are not shards: they sleep, and time what the gateway does.
#![allow(clippy::disallowed_methods)]

mod support;

use std::time::{Duration, Instant};

use smg::budget::redis_store::RedisStore;
use smg::budget::store::*;
use support::redis_server::RedisServer;
use support::*;

async fn raw(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url).unwrap().get_multiplexed_async_connection().await.unwrap()
}

fn ask(key: &str, limits: ScopeLimits, need: u64, want: u64, need_r: u64, want_r: u64) -> LeaseAsk {
    LeaseAsk {
        key: key.into(),
        limits,
        need_tokens: need,
        want_tokens: want,
        need_requests: need_r,
        want_requests: want_r,
    }
}

fn delta(key: &str, limits: ScopeLimits, tokens: i64, requests: i64) -> Delta {
    Delta { key: key.into(), limits, tokens, requests }
}

/// Same answer, the retry allowed to differ by the whole seconds elapsed (each store reads
/// its own clock: a wait of x - τ seconds, τ below `elapsed`, rounds up to x - floor(τ)).
fn same(local: &Lease, redis: &Lease, elapsed: Duration) -> bool {
    match (local.answer, redis.answer) {
        (LeaseAnswer::Denied { retry_after_secs: Some(a) }, LeaseAnswer::Denied { retry_after_secs: Some(b) }) => {
            a.abs_diff(b) <= elapsed.as_secs() && redis.granted.is_empty()
        }
        _ => local == redis,
    }
}

struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
}

// === Tests ===

/// A random sequence of leases (one to three scopes, repeated keys, needs above capacity,
/// wants below needs) and deltas (debt and returns), run against both stores. Capacities
/// divide 60 and refill at most 0.2/s, so while the run lasts under 5 s every bucket holds
/// the same whole number of tokens in both, and the answers must be the same.
#[tokio::test]
async fn redis_store_answers_as_local_store() {
    let server = RedisServer::start();
    let mut redis = RedisStore::connect(&server.url()).await.unwrap();
    let mut local = LocalStore::default();
    let lim = |tpm, rpm| ScopeLimits { tokens_per_minute: tpm, requests_per_minute: rpm };
    // Two scopes of a tenant, another tenant, and scopes that never refill (a zero capacity).
    let scopes = [("t1", lim(12, 12)), ("t1#r1", lim(6, 10)), ("t2", lim(10, 15)), ("z", lim(0, 0)), ("m", lim(6, 0))];
    // The zero-capacity scopes one time in ten each.
    let pick = |rng: &mut Rng| scopes[[0, 0, 0, 1, 1, 1, 2, 2, 3, 4][rng.below(10) as usize]];
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let (mut granted, mut denied, mut never) = (0, 0, 0);
    let start = Instant::now();
    for step in 0..600 {
        let n = 1 + rng.below(3) as usize;
        if rng.below(10) < 7 {
            let asks: Vec<LeaseAsk> = (0..n)
                .map(|_| {
                    let (k, l) = pick(&mut rng);
                    let need = rng.below(l.tokens_per_minute + 2);
                    let want = (need + rng.below(8)).saturating_sub(2);
                    // Rarely above a zero capacity.
                    let need_r = if l.requests_per_minute == 0 { u64::from(rng.below(4) == 0) } else { rng.below(3) };
                    let want_r = (need_r + rng.below(4)).saturating_sub(1);
                    ask(k, l, need, want, need_r, want_r)
                })
                .collect();
            let r = redis.lease(&asks).await.unwrap();
            let l = local.lease(&asks, Instant::now());
            assert!(same(&l, &r, start.elapsed()), "step {step}: {asks:?}\nlocal {l:?}\nredis {r:?}");
            match l.answer {
                LeaseAnswer::Granted => granted += 1,
                LeaseAnswer::Denied { retry_after_secs: Some(_) } => denied += 1,
                LeaseAnswer::Denied { retry_after_secs: None } => never += 1,
            }
        } else {
            let deltas: Vec<Delta> = (0..n)
                .map(|_| {
                    let (k, l) = pick(&mut rng);
                    delta(k, l, rng.below(20) as i64 - 14, rng.below(4) as i64 - 2)
                })
                .collect();
            redis.apply(&deltas).await.unwrap();
            local.apply(&deltas, Instant::now());
        }
    }
    assert!(
        start.elapsed() < patience(Duration::from_secs(5)),
        "too slow for whole-token agreement: {:?}",
        start.elapsed()
    );
    eprintln!("granted {granted}, denied {denied}, never {never}");
    assert!(granted > 60 && denied > 60 && never > 20, "a sequence that tests little: {granted}/{denied}/{never}");
    // Nothing asked at all: granted, without a round-trip.
    assert_eq!(redis.lease(&[]).await.unwrap(), local.lease(&[], Instant::now()));
    redis.apply(&[]).await.unwrap();
}

/// Refill runs on Redis' clock; settles above a reservation are debt that delays the next
/// lease and makes the key live until it is repaid; returns give back.
#[tokio::test]
async fn refill_debt_and_ttl_follow_the_server() {
    let server = RedisServer::start();
    let mut redis = RedisStore::connect(&server.url()).await.unwrap();
    let mut local = LocalStore::default();
    let l = ScopeLimits { tokens_per_minute: 600, requests_per_minute: 60 };
    let both = |r: &Lease, lo: &Lease| assert_eq!(r, lo);

    let drain = [ask("a", l, 600, 600, 1, 1)];
    both(&redis.lease(&drain).await.unwrap(), &local.lease(&drain, Instant::now()));
    let drained = Instant::now();
    // 10 tokens a second: 5 take half a second, rounded up to one.
    let five = [ask("a", l, 5, 5, 1, 1)];
    let denied = Lease { answer: LeaseAnswer::Denied { retry_after_secs: Some(1) }, granted: vec![] };
    both(&redis.lease(&five).await.unwrap(), &denied);
    let until = drained + patience(Duration::from_secs(3));
    let at = loop {
        if redis.lease(&five).await.unwrap().answer == LeaseAnswer::Granted {
            break Instant::now();
        }
        assert!(Instant::now() < until, "refill never came");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let waited = at - drained;
    assert!(waited >= Duration::from_millis(450), "granted after {waited:?}, before 5 tokens refilled");
    assert!(waited <= patience(Duration::from_millis(1500)), "granted only after {waited:?}");

    // Debt: 100 below zero, so one token is 10.1 s away; the key lives past the repayment.
    let debt = [delta("b", l, 700, 0)];
    redis.apply(&debt).await.unwrap();
    local.apply(&debt, Instant::now());
    let one = [ask("b", l, 1, 1, 1, 1)];
    both(&redis.lease(&one).await.unwrap(), &local.lease(&one, Instant::now()));
    assert_eq!(redis.lease(&one).await.unwrap().answer, LeaseAnswer::Denied { retry_after_secs: Some(11) });
    let back = [delta("b", l, -650, 0)];
    redis.apply(&back).await.unwrap();
    local.apply(&back, Instant::now());
    let big = [ask("b", l, 550, 550, 1, 1)];
    both(&redis.lease(&big).await.unwrap(), &local.lease(&big, Instant::now()));
    // Ten minutes of debt: the key outlives it.
    redis.apply(&[delta("c", l, 6600, 0)]).await.unwrap();

    let mut con = raw(&server.url()).await;
    let ttl = |k: &'static str| {
        let mut con = con.clone();
        async move { redis::cmd("TTL").arg(format!("smg:budget:{k}")).query_async::<i64>(&mut con).await.unwrap() }
    };
    let (a, c) = (ttl("a").await, ttl("c").await);
    assert!((110..=120).contains(&a), "TTL of a refilled bucket: {a}");
    // 6000 below zero refills in 660 s; 60 s more.
    assert!((710..=720).contains(&c), "TTL of a bucket deep in debt: {c}");
    let fields: Vec<String> = redis::cmd("HKEYS").arg("smg:budget:a").query_async(&mut con).await.unwrap();
    assert_eq!(fields.len(), 3, "{fields:?}");
    let tokens: f64 = redis::cmd("HGET").arg("smg:budget:c").arg("tokens").query_async(&mut con).await.unwrap();
    assert!((-6000.0..-5999.0).contains(&tokens), "{tokens}");
}

/// Two replicas (threads with their own runtime and connection) lease one tenant's two
/// scopes as fast as they can and give some back: together they never get more than the
/// capacity plus what refilled meanwhile, and they do get all of it.
#[test]
fn two_replicas_share_one_budget() {
    let server = RedisServer::start();
    let tenant = ScopeLimits { tokens_per_minute: 3000, requests_per_minute: 600 };
    let rule = ScopeLimits { tokens_per_minute: 1200, requests_per_minute: 6000 };
    let run = Duration::from_millis(600);
    let start = Instant::now();
    let replicas: Vec<_> = (0..2)
        .map(|i| {
            let url = server.url();
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
                rt.block_on(async move {
                    let mut s = RedisStore::connect(&url).await.unwrap();
                    let asks = [ask("acme", tenant, 3, 40, 1, 2), ask("acme#7", rule, 3, 25, 1, 1)];
                    // Net tokens and requests per scope, and grants.
                    let (mut net, mut grants, mut n) = ([0i64; 4], 0u64, 0u64);
                    while start.elapsed() < run {
                        n += 1;
                        let l = s.lease(&asks).await.unwrap();
                        if l.answer != LeaseAnswer::Granted {
                            continue;
                        }
                        grants += 1;
                        let g = &l.granted;
                        net[0] += g[0].0 as i64;
                        net[1] += g[0].1 as i64;
                        net[2] += g[1].0 as i64;
                        net[3] += g[1].1 as i64;
                        if (n + i) % 3 == 0 {
                            // Unspent allowance goes back.
                            s.apply(&[delta("acme", tenant, -2, 0), delta("acme#7", rule, -2, 0)]).await.unwrap();
                            net[0] -= 2;
                            net[2] -= 2;
                        }
                    }
                    (net, grants)
                })
            })
        })
        .collect();
    let got: Vec<([i64; 4], u64)> = replicas.into_iter().map(|h| h.join().unwrap()).collect();
    let secs = start.elapsed().as_secs_f64();
    eprintln!("{secs:.2} s: {got:?}");
    assert!(got.iter().all(|(_, g)| *g > 0), "a replica got nothing: {got:?}");
    let total = |i: usize| got.iter().map(|(n, _)| n[i]).sum::<i64>() as f64;
    for (i, cap) in
        [tenant.tokens_per_minute, tenant.requests_per_minute, rule.tokens_per_minute, rule.requests_per_minute]
            .into_iter()
            .enumerate()
    {
        let cap = cap as f64;
        let most = cap + cap / 60.0 * secs;
        assert!(total(i) <= most, "scope figure {i}: {} granted, at most {most} ({got:?})", total(i));
    }
    // The rule's tokens run out first: it was drained (to below one lease's need) and refilled.
    let rule_floor = rule.tokens_per_minute as f64 - 10.0;
    assert!(total(2) >= rule_floor, "rule tokens: only {} of {rule_floor} granted ({got:?})", total(2));
}

/// Errors come back within about a second, whether Redis is unreachable, hung (SIGSTOP) or
/// dead; once it is back on the same port, a reconnect (or a new connect) works.
#[tokio::test]
async fn dead_or_hung_redis_fails_fast_and_reconnects() {
    let quick = patience(Duration::from_millis(1500));
    let l = ScopeLimits { tokens_per_minute: 600, requests_per_minute: 60 };
    let one = [ask("t", l, 10, 10, 1, 1)];

    // Nothing listens: refused at once.
    let port = free_port();
    let t = Instant::now();
    assert!(RedisStore::connect(&format!("redis://127.0.0.1:{port}")).await.is_err());
    assert!(t.elapsed() < quick, "refused connect took {:?}", t.elapsed());
    // A listener that never answers (the handshake hangs): the connect timeout.
    let silent = local_listener();
    let t = Instant::now();
    let e = RedisStore::connect(&format!("redis://{}", silent.local_addr().unwrap())).await.unwrap_err();
    assert!(t.elapsed() < quick, "silent connect took {:?}: {e}", t.elapsed());
    assert!(RedisStore::connect("http://127.0.0.1:1").await.is_err(), "not a redis URL");

    let mut server = RedisServer::start();
    let mut s = RedisStore::connect(&server.url()).await.unwrap();
    assert_eq!(s.lease(&one).await.unwrap().granted, vec![(10, 1)]);

    // Hung: the response timeout.
    unsafe { libc::kill(server.pid(), libc::SIGSTOP) };
    let t = Instant::now();
    let e = s.lease(&one).await.unwrap_err();
    assert!(t.elapsed() < quick, "lease on a hung redis took {:?}: {e}", t.elapsed());
    let t = Instant::now();
    let e = s.apply(&[delta("t", l, 5, 0)]).await.unwrap_err();
    assert!(t.elapsed() < quick, "apply on a hung redis took {:?}: {e}", t.elapsed());
    unsafe { libc::kill(server.pid(), libc::SIGCONT) };

    // Dead.
    server.kill();
    for _ in 0..3 {
        let t = Instant::now();
        let e = s.lease(&one).await.unwrap_err();
        assert!(t.elapsed() < quick, "lease on a dead redis took {:?}: {e}", t.elapsed());
    }
    let t = Instant::now();
    assert!(s.reconnect().await.is_err());
    assert!(RedisStore::connect(&server.url()).await.is_err());
    assert!(t.elapsed() < quick * 2, "reconnects to a dead redis took {:?}", t.elapsed());

    // Back on the same port, empty: buckets start full again and the scripts load anew.
    server.restart();
    let mut fresh = RedisStore::connect(&server.url()).await.unwrap();
    assert_eq!(fresh.lease(&[ask("t", l, 600, 600, 1, 1)]).await.unwrap().granted, vec![(600, 1)]);
    s.reconnect().await.unwrap();
    let l2 = s.lease(&one).await.unwrap();
    assert_eq!(l2.answer, LeaseAnswer::Denied { retry_after_secs: Some(1) }, "both see one budget again");
    s.apply(&[delta("t", l, -20, 0)]).await.unwrap();
    assert_eq!(fresh.lease(&one).await.unwrap().granted, vec![(10, 1)]);
    drop(silent);
}
