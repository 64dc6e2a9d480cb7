//! Tenant token budgets through the binary (both drivers, two shards): tokens admitted match
//! the budget, `Retry-After` is right to the second, an oversize request gets none, request
//! budgets, a broken policy file. Replicas sharing Redis: tests/budgets_redis.rs.

// clippy.toml's house rules are the gateway's: a test's threads are not shards and may block.
#![allow(clippy::disallowed_methods)]

mod support;

use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use sonic_rs::JsonValueTrait;
use support::sim::Sim;
use support::*;

/// A policy file that lives as long as the value.
pub struct PolicyFile(std::path::PathBuf);

impl std::ops::Deref for PolicyFile {
    type Target = std::path::Path;
    fn deref(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for PolicyFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn policy_file(yaml: &str) -> PolicyFile {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static N: AtomicUsize = AtomicUsize::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let p = std::env::temp_dir().join(format!("smg-budget-{}-{n}.yaml", std::process::id()));
    std::fs::write(&p, yaml).unwrap();
    PolicyFile(p)
}

pub fn team_policy(tpm: u64, rpm: u64) -> String {
    format!(
        "default_policy:\n  tokens_per_minute: 1000000000\n  requests_per_minute: 1000000000\n\
         tenants:\n  - tenant_key: \"header:team\"\n    tokens_per_minute: {tpm}\n    requests_per_minute: {rpm}\n"
    )
}

fn chat(max_tokens: u32, stream: bool) -> String {
    let opts = if stream { r#","stream":true,"stream_options":{"include_usage":true}"# } else { "" };
    format!(r#"{{"model":"m","messages":[{{"role":"user","content":"hi"}}],"max_tokens":{max_tokens}{opts}}}"#)
}

/// The reservation the gateway makes for `body`: 4 bytes a token, plus max_tokens.
fn estimate(body: &str, max_tokens: u64) -> u64 {
    (body.len() as u64).div_ceil(4) + max_tokens
}

/// Usage tokens reported in a JSON body, or in the usage event of an SSE body.
fn usage_tokens(text: &str) -> Option<u64> {
    let json =
        text.lines().filter_map(|l| l.strip_prefix("data: ")).find(|l| l.contains("\"usage\":{")).unwrap_or(text);
    let v: sonic_rs::Value = sonic_rs::from_str(json).ok()?;
    Some(v["usage"]["prompt_tokens"].as_u64()? + v["usage"]["completion_tokens"].as_u64()?)
}

fn start(legacy: bool, worker: &str, policy: &std::path::Path, extra: &[&str]) -> Gateway {
    let p = policy.to_str().unwrap();
    let mut args = vec![
        "--worker-urls",
        worker,
        "--cores",
        "2",
        "--trust-tenant-header",
        "--tenant-rate-limit-enabled",
        "--tenant-rate-limit-config",
        p,
    ];
    args.extend_from_slice(extra);
    let gw = Gateway::start(legacy, &args);
    gw.ready_workers(1);
    gw
}

#[test]
fn tokens_admitted_match_the_budget_on_two_shards() {
    both_drivers(|legacy| {
        let w = Sim::start("m", &[]);
        let policy = policy_file(&team_policy(10_000, 1_000_000));
        let gw = start(legacy, &w.url(), &policy, &[]);
        let port = gw.port;
        let began = Instant::now();
        let run_for = Duration::from_secs(10);
        let clients: Vec<_> = (0..16)
            .map(|i| {
                std::thread::spawn(move || {
                    let (mut used, mut admitted, mut denied) = (0u64, 0u64, 0u64);
                    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
                    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
                    let mut rest = Vec::new();
                    let mut n = 0u64;
                    while began.elapsed() < run_for {
                        n += 1;
                        let body = chat(16, (i + n).is_multiple_of(3));
                        let req = post_bytes("/v1/chat/completions", &body, &["X-SMG-Tenant-ID: team"]);
                        s.write_all(req.as_bytes()).unwrap();
                        let r = read_response(&mut s, &mut rest, false).unwrap();
                        match r.status {
                            200 => {
                                admitted += 1;
                                used += usage_tokens(&r.text()).expect("the worker reports usage");
                            }
                            429 => {
                                assert_eq!(r.header("x-smg-error-code"), Some("tenant_rate_limit_exceeded"));
                                assert!(r.header("retry-after").is_some_and(|v| v.parse::<u64>().unwrap() >= 1));
                                denied += 1;
                                // Back off a little, far less than Retry-After: the budget is
                                // kept saturated, as a busy tenant would.
                                std::thread::sleep(Duration::from_millis(5));
                            }
                            s => panic!("unexpected {s}: {}", r.text()),
                        }
                    }
                    (used, admitted, denied)
                })
            })
            .collect();
        let (mut used, mut admitted, mut denied) = (0, 0, 0);
        for c in clients {
            let (u, a, d) = c.join().unwrap();
            used += u;
            admitted += a;
            denied += d;
        }
        let secs = began.elapsed().as_secs_f64();
        let budget = 10_000.0 + 10_000.0 / 60.0 * secs;
        let off = (used as f64 - budget) / budget;
        eprintln!(
            "{admitted} admitted, {denied} denied, {used} tokens used over {secs:.2} s; budget {budget:.0} ({:+.2}%)",
            off * 100.0
        );
        assert!(denied > 0, "the budget never bit");
        assert!(off.abs() <= 0.01, "{used} tokens admitted against a budget of {budget:.0}: {:+.2}%", off * 100.0);
    });
}

#[test]
fn retry_after_is_right_to_the_second_and_oversize_has_none() {
    both_drivers(|legacy| {
        // This worker reports no usage: every reservation stands at its estimate.
        let w = FakeWorker::start("m");
        let policy = policy_file(&team_policy(600, 1_000_000));
        let gw = start(legacy, &w.url(), &policy, &[]);
        let send = |body: &str| post(gw.port, "/v1/chat/completions", body, &["X-SMG-Tenant-ID: team"]);
        let body = chat(300, false);
        let first = estimate(&body, 300);
        assert_eq!(send(&body).status, 200);
        // 600 − first (and the lease's one spare token) are left, refilling 10 a second.
        let left = 600 - (first + 1);
        let want = (first - left).div_ceil(10);
        let r = send(&body);
        assert_eq!(r.status, 429, "{}", r.text());
        assert_eq!(r.json()["error"]["code"].as_str(), Some("tenant_rate_limit_exceeded"));
        assert_eq!(r.json()["error"]["message"].as_str(), Some("Tenant rate limit exceeded for this request"));
        let got: u64 = r.header("retry-after").unwrap().parse().unwrap();
        assert!(got == want || got == want + 1, "Retry-After {got}, expected {want}");
        // Larger than the whole budget: no wait would do, so no Retry-After.
        let r = send(&chat(1000, false));
        assert_eq!(r.status, 429);
        assert_eq!(r.header("retry-after"), None);
        // Another tenant has its own budget.
        assert_eq!(post(gw.port, "/v1/chat/completions", &body, &["X-SMG-Tenant-ID: other"]).status, 200);
        assert_eq!(w.requests().len(), 2, "denied requests never reach the worker");
    });
}

#[test]
fn requests_per_minute_are_a_budget_too() {
    let w = FakeWorker::start("m");
    let policy = policy_file(&team_policy(1_000_000, 3));
    let gw = start(false, &w.url(), &policy, &[]);
    for _ in 0..3 {
        assert_eq!(
            post(gw.port, "/v1/completions", r#"{"model":"m","prompt":"x"}"#, &["X-SMG-Tenant-ID: team"]).status,
            200
        );
    }
    let r = post(gw.port, "/v1/completions", r#"{"model":"m","prompt":"x"}"#, &["X-SMG-Tenant-ID: team"]);
    assert_eq!(r.status, 429);
    // One request comes back every 20 s.
    let secs: u64 = r.header("retry-after").unwrap().parse().unwrap();
    assert!((19..=20).contains(&secs), "Retry-After {secs}");
    // Embeddings are an inference endpoint too.
    assert_eq!(post(gw.port, "/v1/embeddings", r#"{"model":"m","input":"x"}"#, &["X-SMG-Tenant-ID: team"]).status, 429);
}

#[test]
fn a_broken_policy_file_is_logged_with_its_line_and_nothing_is_limited() {
    let w = FakeWorker::start("m");
    let policy = policy_file("default_policy:\n  tokens_per_minute: 10\n  requests_per_minute: oops\n");
    let gw = start(false, &w.url(), &policy, &[]);
    let name = policy.to_str().unwrap().to_string();
    assert!(gw.log_has(&name) && gw.log_has("line 3"), "{}", gw.log_text());
    assert!(gw.log_has("starting without tenant rate limits"));
    for _ in 0..5 {
        assert_eq!(post(gw.port, "/v1/chat/completions", &chat(100, false), &["X-SMG-Tenant-ID: team"]).status, 200);
    }
    let bad = policy_file("default_policy:\n  tokens_per_minute: -1\n  requests_per_minute: 1\n");
    let gw = start(false, &w.url(), &bad, &[]);
    assert!(gw.log_has("tokens_per_minute must be > 0"), "{}", gw.log_text());
}

/// `clients` keep-alive clients for `run_for` on `port` as tenant `team`: (tokens used,
/// admitted, denied, any other status).
fn load(port: u16, clients: usize, run_for: Duration) -> std::thread::JoinHandle<(u64, u64, u64, Vec<String>)> {
    std::thread::spawn(move || {
        let began = Instant::now();
        let threads: Vec<_> = (0..clients)
            .map(|i| {
                std::thread::spawn(move || {
                    let (mut used, mut ok, mut denied, mut other) = (0u64, 0u64, 0u64, Vec::new());
                    let mut n = 0u64;
                    while began.elapsed() < run_for {
                        n += 1;
                        let body = chat(16, (i as u64 + n).is_multiple_of(3));
                        let r = post(port, "/v1/chat/completions", &body, &["X-SMG-Tenant-ID: team"]);
                        match r.status {
                            200 => {
                                ok += 1;
                                used += usage_tokens(&r.text()).unwrap_or(0);
                            }
                            429 => {
                                denied += 1;
                                std::thread::sleep(Duration::from_millis(5));
                            }
                            s => other.push(format!("{s}: {}", r.text())),
                        }
                    }
                    (used, ok, denied, other)
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).fold((0, 0, 0, Vec::new()), |mut a, b| {
            a.0 += b.0;
            a.1 += b.1;
            a.2 += b.2;
            a.3.extend(b.3);
            a
        })
    })
}

#[test]
fn two_replicas_share_one_budget_through_redis() {
    let redis = support::redis_server::RedisServer::start();
    let w = Sim::start("m", &[]);
    let policy = policy_file(&team_policy(10_000, 1_000_000));
    let url = redis.url();
    let a = start(false, &w.url(), &policy, &["--redis-url", &url]);
    let b = start(true, &w.url(), &policy, &["--redis-url", &url]);
    assert!(a.log_has("tenant budgets shared through") && b.log_has("tenant budgets shared through"));
    let began = Instant::now();
    let (la, lb) = (load(a.port, 8, Duration::from_secs(10)), load(b.port, 8, Duration::from_secs(10)));
    let (ra, rb) = (la.join().unwrap(), lb.join().unwrap());
    let secs = began.elapsed().as_secs_f64();
    assert!(ra.3.is_empty() && rb.3.is_empty(), "{:?} {:?}", ra.3, rb.3);
    let used = ra.0 + rb.0;
    let budget = 10_000.0 + 10_000.0 / 60.0 * secs;
    let off = (used as f64 - budget) / budget;
    eprintln!(
        "replicas: {} + {} tokens ({} + {} admitted) against {budget:.0}: {:+.2}%",
        ra.0,
        rb.0,
        ra.1,
        rb.1,
        off * 100.0
    );
    assert!(ra.1 > 0 && rb.1 > 0, "both replicas admitted");
    assert!(off.abs() <= 0.01, "the pair admitted {used} tokens against {budget:.0}: {:+.2}%", off * 100.0);
}

#[test]
fn redis_going_away_fails_no_request_and_is_reconciled() {
    let mut redis = support::redis_server::RedisServer::start();
    let w = Sim::start("m", &[]);
    let policy = policy_file(&team_policy(10_000, 1_000_000));
    let url = redis.url();
    let (ma, mb) = (free_port(), free_port());
    let (sa, sb) = (ma.to_string(), mb.to_string());
    let a = start(
        false,
        &w.url(),
        &policy,
        &["--redis-url", &url, "--prometheus-host", "127.0.0.1", "--prometheus-port", &sa],
    );
    let b = start(
        false,
        &w.url(),
        &policy,
        &["--redis-url", &url, "--prometheus-host", "127.0.0.1", "--prometheus-port", &sb],
    );
    let rejected = |p: u16| metric(p, r#"smg_tenant_rate_limit_total{result="rejected"}"#).unwrap_or(0.0);
    let began = Instant::now();
    let (la, lb) = (load(a.port, 4, Duration::from_secs(6)), load(b.port, 4, Duration::from_secs(6)));
    // Redis goes away once the shared budget is in force: both replicas have been refused.
    assert!(
        wait_until(patience(Duration::from_secs(4)), || rejected(ma) > 0.0 && rejected(mb) > 0.0),
        "precondition: the shared budget never bit with Redis up ({} and {} refused)",
        rejected(ma),
        rejected(mb)
    );
    redis.kill();
    let gone = Instant::now();
    assert!(a.log_has("unreachable") && b.log_has("unreachable"), "{}", a.log_text());
    // Redis comes back once each replica, alone, has spent its own bucket (it starts full):
    // refused again since it noticed. One that never refuses while alone admits without
    // bound meanwhile, which the bound below catches.
    let (ra0, rb0) = (rejected(ma), rejected(mb));
    wait_until(patience(Duration::from_secs(3)), || rejected(ma) > ra0 && rejected(mb) > rb0);
    let away = gone.elapsed().as_secs_f64();
    redis.restart();
    let (ra, rb) = (la.join().unwrap(), lb.join().unwrap());
    let secs = began.elapsed().as_secs_f64();
    assert!(ra.3.is_empty() && rb.3.is_empty(), "a request failed because Redis went away: {:?} {:?}", ra.3, rb.3);
    assert!(a.log_has("is back") && b.log_has("is back"), "{}", a.log_text());
    // The README's bound: while Redis is away each replica admits up to the whole budget
    // alone (its own bucket starts full and refills), on top of the shared budget.
    let used = (ra.0 + rb.0) as f64;
    let shared = 10_000.0 + 10_000.0 / 60.0 * secs;
    let alone = 2.0 * (10_000.0 + 10_000.0 / 60.0 * away);
    eprintln!("with Redis away {away:.1} s: {used} tokens against {shared:.0} shared + {alone:.0} alone");
    assert!(used <= (shared + alone) * 1.01, "{used} tokens: more than the README's bound {:.0}", shared + alone);
}

/// Decisions answered by an SGLang worker settle the budget at the input tokens its System
/// One reply counts, not at the estimate: padding makes the estimate five times the usage,
/// so an unsettled budget would admit a fifth of the tokens it allows.
#[test]
fn decisions_settle_at_the_reported_input_tokens() {
    both_drivers(|legacy| {
        let w = Sim::start("m", &["--runtime", "sglang"]);
        let policy = policy_file(&team_policy(30_000, 1_000_000));
        let gw = start(legacy, &w.url(), &policy, &[]);
        let q = r#"[{"type":"predicate","instructions":"On time?"}]"#;
        let text = "word ".repeat(40);
        let body = format!(
            r#"{{"model":"m","input":[{{"role":"user","type":"message","content":[{{"type":"input_text","text":"{text}"}}]}}],"questions":{q}}}{}"#,
            " ".repeat(3000)
        );
        let port = gw.port;
        let began = Instant::now();
        let run_for = Duration::from_secs(6);
        let (mut used, mut estimated, mut denied) = (0u64, 0u64, 0u64);
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut rest = Vec::new();
        while began.elapsed() < run_for {
            let req = post_bytes("/v1/decisions", &body, &["X-SMG-Tenant-ID: team"]);
            s.write_all(req.as_bytes()).unwrap();
            let r = read_response(&mut s, &mut rest, false).unwrap();
            match r.status {
                200 => {
                    used += r.json()["usage"]["input_tokens"].as_u64().expect("usage");
                    estimated += estimate(&body, 0);
                }
                429 => {
                    denied += 1;
                    std::thread::sleep(Duration::from_millis(5));
                }
                s => panic!("unexpected {s}: {}", r.text()),
            }
        }
        let secs = began.elapsed().as_secs_f64();
        let budget = 30_000.0 + 30_000.0 / 60.0 * secs;
        let off = (used as f64 - budget) / budget;
        eprintln!(
            "decisions: {used} tokens used ({estimated} estimated, body {} bytes), {denied} denied; budget {budget:.0}",
            body.len()
        );
        assert!(denied > 0, "the budget never bit");
        assert!(estimated > 3 * used, "the padding should make the estimate far larger than the usage");
        // One request's estimate of slack: the last admission may overshoot by it.
        let slack = estimate(&body, 0) as f64 / budget;
        assert!(off.abs() <= 0.02 + slack, "{used} tokens admitted against {budget:.0}: {:+.2}%", off * 100.0);
    });
}
