//! The Responses API's history store through the real binary, against real servers: two
//! gateways sharing one Redis or one PostgreSQL serve each other's responses and
//! conversations; `--storage-context-headers` lands in the stored record; a Redis that stops
//! answering costs a bounded `503 storage_unavailable` (and an honest `"store": false`), and
//! chaining heals once it is back; tenants never see each other's records.
// A test's threads are not shards: they read the clock and wait.
#![allow(clippy::disallowed_methods)]

mod support;

use std::time::{Duration, Instant};

use sonic_rs::{JsonContainerTrait, JsonValueTrait, Value};
use support::postgres_server::PostgresServer;
use support::redis_server::RedisServer;
use support::responses::*;
use support::sim::{grpc_gateway as gateway, Sim};
use support::*;

const MODEL: &str = "sim-model";
const FAST: &[&str] = &["--grpc", "--ttft-ms", "0", "--itl-ms", "0", "--output-tokens", "6"];

fn id_of(v: &Value) -> String {
    v["id"].as_str().unwrap().to_string()
}

fn turn(input: &str) -> String {
    format!(r#"{{"model":"{MODEL}","input":"{input}"}}"#)
}

fn chained(input: &str, previous: &str) -> String {
    format!(r#"{{"model":"{MODEL}","input":"{input}","previous_response_id":"{previous}"}}"#)
}

fn unstored(input: &str) -> String {
    format!(r#"{{"model":"{MODEL}","input":"{input}","store":false}}"#)
}

fn in_conversation(input: &str, conversation: &str) -> String {
    format!(r#"{{"model":"{MODEL}","input":"{input}","conversation":"{conversation}"}}"#)
}

/// The flags that put a gateway on this server.
fn redis_flags(server: &RedisServer) -> Vec<String> {
    ["--history-backend", "redis", "--redis-url", &server.url()].map(String::from).to_vec()
}

fn postgres_flags(server: &PostgresServer) -> Vec<String> {
    ["--history-backend", "postgres", "--postgres-db-url", &server.url()].map(String::from).to_vec()
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

// === Two gateways, one store ===

/// Two gateways (one shared simulated worker) on the same store: what one stores the other
/// serves, chains off and deletes, in both directions.
fn two_gateways_share_the_store(legacy: bool, store: &[&str]) {
    let sim = Sim::start(MODEL, FAST);
    let a = gateway(legacy, &[&sim], store);
    let b = gateway(legacy, &[&sim], store);

    // Made on A, read on B: the same object, and its input items.
    let first = ok(&post(a.port, "/v1/responses", &turn("Tell me a story"), &[]));
    assert_eq!(first["store"].as_bool(), Some(true), "{first:?}");
    let id = id_of(&first);
    assert_eq!(ok(&get(b.port, &format!("/v1/responses/{id}"))), first);
    let items = ok(&get(b.port, &format!("/v1/responses/{id}/input_items")));
    let data = items["data"].as_array().unwrap();
    assert_eq!(data.len(), 1, "{items:?}");
    assert_eq!(data[0]["content"][0]["text"].as_str(), Some("Tell me a story"));

    // Chained on B off A's response: the engine read A's input and output first.
    let output = first["usage"]["output_tokens"].as_u64().unwrap();
    let second = ok(&post(b.port, "/v1/responses", &chained("And then?", &id), &[]));
    assert_eq!(second["previous_response_id"].as_str(), Some(id.as_str()));
    let with_history = engine_prompt(&sim);
    let v = ok(&post(b.port, "/v1/responses", &unstored("And then?"), &[]));
    assert_eq!(v["store"].as_bool(), Some(false));
    let alone = engine_prompt(&sim);
    assert!(with_history >= alone + output, "A's turn reached the engine through B: {with_history} vs {alone}");
    // And back: B's response is A's to read and chain off (the whole chain, A's turn too).
    let second_id = id_of(&second);
    assert_eq!(ok(&get(a.port, &format!("/v1/responses/{second_id}"))), second);
    ok(&post(a.port, "/v1/responses", &chained("The end?", &second_id), &[]));
    let two_back = engine_prompt(&sim);
    ok(&post(a.port, "/v1/responses", &unstored("The end?"), &[]));
    assert!(two_back > engine_prompt(&sim) + 2 * output, "both earlier turns reached the engine through A");

    // A conversation made on B, a turn in it on A, its items listed on B.
    let conv = ok(&post(b.port, "/v1/conversations", r#"{"metadata":{"topic":"shared"}}"#, &[]));
    let cid = id_of(&conv);
    assert_eq!(ok(&get(a.port, &format!("/v1/conversations/{cid}"))), conv);
    let t = ok(&post(a.port, "/v1/responses", &in_conversation("Hello there", &cid), &[]));
    assert_eq!(t["conversation"]["id"].as_str(), Some(cid.as_str()));
    let listed = ok(&get(b.port, &format!("/v1/conversations/{cid}/items?order=asc")));
    let data = listed["data"].as_array().unwrap();
    let out = t["output"].as_array().unwrap();
    assert!(!out.is_empty(), "{t:?}");
    assert_eq!(data.len(), 1 + out.len(), "the turn's input and output items: {listed:?}");
    assert_eq!(data[0]["type"].as_str(), Some("message"));
    assert_eq!(data[0]["role"].as_str(), Some("user"));
    assert_eq!(data[0]["content"][0]["text"].as_str(), Some("Hello there"));
    for (listed, answered) in data.iter().skip(1).zip(out.iter()) {
        assert_eq!(listed, answered, "an output item as the turn answered it");
    }
    // The next turn, on B, reads them.
    ok(&post(b.port, "/v1/responses", &in_conversation("Go on", &cid), &[]));
    let in_conv = engine_prompt(&sim);
    ok(&post(b.port, "/v1/responses", &unstored("Go on"), &[]));
    assert!(in_conv > engine_prompt(&sim), "the items A's turn added reached the engine through B");

    // Deleted on B: gone on A, and nothing chains off it there.
    let del = ok(&call(b.port, "DELETE", &format!("/v1/responses/{id}"), None, &[]));
    assert_eq!(del["deleted"].as_bool(), Some(true));
    assert_eq!(error_code(&get(a.port, &format!("/v1/responses/{id}")), 404), "not_found");
    let served = sim.served();
    let r = post(a.port, "/v1/responses", &chained("Again", &id), &[]);
    assert_eq!(error_code(&r, 400), "previous_response_not_found");
    assert_eq!(sim.served(), served, "nothing generated for a refused chain");
    let gone = ok(&call(b.port, "DELETE", &format!("/v1/conversations/{cid}"), None, &[]));
    assert_eq!(gone["deleted"].as_bool(), Some(true));
    assert_eq!(error_code(&get(a.port, &format!("/v1/conversations/{cid}")), 404), "not_found");
    assert_eq!(error_code(&get(a.port, &format!("/v1/conversations/{cid}/items")), 404), "not_found");
}

#[test]
fn two_gateways_share_responses_and_conversations_through_redis() {
    let server = RedisServer::start();
    let flags = redis_flags(&server);
    both_drivers(|legacy| two_gateways_share_the_store(legacy, &strs(&flags)));
}

#[test]
fn two_gateways_share_responses_and_conversations_through_postgres() {
    let server = PostgresServer::start();
    let flags = postgres_flags(&server);
    both_drivers(|legacy| two_gateways_share_the_store(legacy, &strs(&flags)));
}

// === Storage context ===

/// Stores one turn with `x-tenant-id: acme` and one without, on a gateway copying that
/// header into the context; returns their ids.
fn turns_with_and_without_context(legacy: bool, store: &[&str]) -> (String, String) {
    let sim = Sim::start(MODEL, FAST);
    let mut flags = store.to_vec();
    flags.extend_from_slice(&["--storage-context-headers", "x-tenant-id=tenant_id"]);
    let gw = gateway(legacy, &[&sim], &flags);
    let with = ok(&post(gw.port, "/v1/responses", &turn("With a tenant"), &["X-Tenant-Id: acme"]));
    let without = ok(&post(gw.port, "/v1/responses", &turn("Without"), &[]));
    // The context is the store's: the response object does not show it.
    assert!(with.get("context").is_none(), "{with:?}");
    (id_of(&with), id_of(&without))
}

/// A stored record (its JSON, as the backend keeps it): its context and its tenant.
fn check_context(record: &str, want: &[(&str, &str)]) {
    let v: Value = sonic_rs::from_str(record).unwrap_or_else(|e| panic!("not a record ({e}): {record}"));
    let context: Vec<(String, String)> = v["context"]
        .as_array()
        .unwrap_or_else(|| panic!("no context: {record}"))
        .iter()
        .map(|p| (p[0].as_str().unwrap().to_string(), p[1].as_str().unwrap().to_string()))
        .collect();
    let want: Vec<(String, String)> = want.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    assert_eq!(context, want, "{record}");
    assert!(v["tenant"].is_null(), "no tenant identity without keys: {record}");
}

#[test]
fn storage_context_headers_are_kept_in_the_redis_record() {
    let server = RedisServer::start();
    let flags = redis_flags(&server);
    both_drivers(|legacy| {
        let (with, without) = turns_with_and_without_context(legacy, &strs(&flags));
        let mut con = redis::Client::open(server.url()).unwrap().get_connection().unwrap();
        let mut record = |id: &str| -> String {
            let key = format!("smg:history:response:{id}");
            let r: Option<String> = redis::cmd("HGET").arg(&key).arg("record").query(&mut con).unwrap();
            r.unwrap_or_else(|| panic!("no record at {key}"))
        };
        check_context(&record(&with), &[("tenant_id", "acme")]);
        check_context(&record(&without), &[]);
    });
}

#[test]
fn storage_context_headers_are_kept_in_the_postgres_record() {
    let server = PostgresServer::start();
    let flags = postgres_flags(&server);
    both_drivers(|legacy| {
        let (with, without) = turns_with_and_without_context(legacy, &strs(&flags));
        // Ids are `resp_` and hex: nothing to quote.
        assert!(with.chars().chain(without.chars()).all(|c| c.is_ascii_alphanumeric() || c == '_'));
        let record = |id: &str| server.query(&format!("SELECT record FROM smg_history_responses WHERE id = '{id}'"));
        check_context(&record(&with), &[("tenant_id", "acme")]);
        check_context(&record(&without), &[]);
    });
}

// === Outage ===

/// SIGSTOP on a process now, SIGCONT on drop (a failed assertion too).
struct Paused(i32);

impl Paused {
    fn stop(pid: i32) -> Paused {
        unsafe { libc::kill(pid, libc::SIGSTOP) };
        Paused(pid)
    }
}

impl Drop for Paused {
    fn drop(&mut self) {
        unsafe { libc::kill(self.0, libc::SIGCONT) };
    }
}

/// `f`'s answer and how long it took.
fn timed<T>(f: impl FnOnce() -> T) -> (T, Duration) {
    let t = Instant::now();
    let v = f();
    (v, t.elapsed())
}

/// A Redis that stops answering under a running gateway (`--redis-op-timeout-secs 1`): a
/// chained turn, a read and a conversation's creation answer `503 storage_unavailable` once
/// the bound has passed, well before the default bound (5 s) would; a plain turn is served
/// and says it was not stored. Once Redis answers again, chaining works again; the gateway
/// served throughout.
#[test]
fn a_redis_outage_answers_unavailable_in_time_and_chaining_heals() {
    let server = RedisServer::start();
    let mut flags = redis_flags(&server);
    flags.extend(["--redis-op-timeout-secs", "1"].map(String::from));
    // The right answer costs the 1 s bound; a gateway that ignored the flag would take the
    // default 5 s, one that never gave up forever.
    let bound = patience(Duration::from_secs(3));
    both_drivers(|legacy| {
        let sim = Sim::start(MODEL, FAST);
        let mut gw = gateway(legacy, &[&sim], &strs(&flags));
        let first = ok(&post(gw.port, "/v1/responses", &turn("Before the outage"), &[]));
        let id = id_of(&first);

        let paused = Paused::stop(server.pid());
        let (r, took) = timed(|| post(gw.port, "/v1/responses", &chained("During", &id), &[]));
        assert_eq!(error_code(&r, 503), "storage_unavailable");
        assert!(took < bound, "a chained turn answered 503 only after {took:?}");
        let (r, took) = timed(|| get(gw.port, &format!("/v1/responses/{id}")));
        assert_eq!(error_code(&r, 503), "storage_unavailable");
        assert!(took < bound, "a read answered 503 only after {took:?}");
        let (r, took) = timed(|| post(gw.port, "/v1/conversations", "{}", &[]));
        assert_eq!(error_code(&r, 503), "storage_unavailable");
        assert!(took < bound, "a conversation's creation answered 503 only after {took:?}");
        // Served, and not claimed stored.
        let (r, took) = timed(|| post(gw.port, "/v1/responses", &turn("During"), &[]));
        let plain = ok(&r);
        assert_eq!(plain["store"].as_bool(), Some(false), "{plain:?}");
        assert_eq!(plain["status"].as_str(), Some("completed"), "{plain:?}");
        assert!(took < bound, "a plain turn took {took:?}");
        // Streamed: the final response says so too.
        let body = format!(r#"{{"model":"{MODEL}","input":"During","stream":true}}"#);
        let (r, took) = timed(|| post(gw.port, "/v1/responses", &body, &[]));
        assert_eq!(r.status, 200, "{}", r.text());
        let text = r.text();
        let last = text.split_terminator("\n\n").last().unwrap();
        assert!(last.starts_with("event: response.completed"), "{text}");
        let done: Value = sonic_rs::from_str(last.lines().nth(1).unwrap().strip_prefix("data: ").unwrap()).unwrap();
        assert_eq!(done["response"]["store"].as_bool(), Some(false), "{done:?}");
        assert!(took < bound, "a streamed turn took {took:?}");
        assert!(gw.alive(), "the gateway died in the outage: {}", gw.log_text());

        // Back: chaining works again (the first request after may still meet the old
        // connection's failure).
        drop(paused);
        let mut last = None;
        let healed = wait_until(patience(Duration::from_secs(10)), || {
            let r = post(gw.port, "/v1/responses", &chained("After", &id), &[]);
            let done = r.status == 200;
            last = Some(r);
            done
        });
        let r = last.unwrap();
        assert!(healed, "chaining never came back: {} {}", r.status, r.text());
        let after = r.json();
        assert_eq!(after["previous_response_id"].as_str(), Some(id.as_str()));
        assert_eq!(after["store"].as_bool(), Some(true), "{after:?}");
        assert_eq!(ok(&get(gw.port, &format!("/v1/responses/{}", id_of(&after)))), after);
        assert!(gw.alive(), "the gateway died: {}", gw.log_text());
        assert!(!gw.log_text().contains("panicked"), "{}", gw.log_text());
    });
}

// === Tenants ===

const TENANTS: &[&str] = &["--tenant-api-key", "team-a:a-secret", "--tenant-api-key", "team-b:b-secret"];
const AS_A: &[&str] = &["Authorization: Bearer a-secret"];
const AS_B: &[&str] = &["Authorization: Bearer b-secret"];

/// With tenant keys (memory backend), a response and a conversation are their tenant's:
/// another tenant's every read, delete and chain answers as for an unknown id, and leaves
/// them as they were; their tenant reads them.
#[test]
fn a_tenant_never_sees_another_tenants_records() {
    both_drivers(|legacy| {
        let sim = Sim::start(MODEL, FAST);
        let gw = gateway(legacy, &[&sim], TENANTS);
        let p = gw.port;
        let first = ok(&post(p, "/v1/responses", &turn("A's secret"), AS_A));
        let id = id_of(&first);

        // B: as if it did not exist.
        let served = sim.served();
        for path in [format!("/v1/responses/{id}"), format!("/v1/responses/{id}/input_items")] {
            assert_eq!(error_code(&call(p, "GET", &path, None, AS_B), 404), "not_found", "{path}");
        }
        let del = call(p, "DELETE", &format!("/v1/responses/{id}"), None, AS_B);
        assert_eq!(error_code(&del, 404), "not_found");
        let r = post(p, "/v1/responses", &chained("Tell me", &id), AS_B);
        assert_eq!(error_code(&r, 400), "previous_response_not_found");
        assert_eq!(sim.served(), served, "nothing generated for another tenant's chain");

        // A: untouched, and chains off it.
        assert_eq!(ok(&call(p, "GET", &format!("/v1/responses/{id}"), None, AS_A)), first);
        let items = ok(&call(p, "GET", &format!("/v1/responses/{id}/input_items"), None, AS_A));
        assert_eq!(items["data"][0]["content"][0]["text"].as_str(), Some("A's secret"));
        let next = ok(&post(p, "/v1/responses", &chained("Go on", &id), AS_A));
        assert_eq!(next["previous_response_id"].as_str(), Some(id.as_str()));

        // A conversation of A's.
        let conv = ok(&post(p, "/v1/conversations", r#"{"metadata":{"owner":"a"}}"#, AS_A));
        let cid = id_of(&conv);
        ok(&post(p, "/v1/responses", &in_conversation("In A's conversation", &cid), AS_A));
        let before = ok(&call(p, "GET", &format!("/v1/conversations/{cid}/items"), None, AS_A));
        assert_eq!(before["data"].as_array().unwrap().len(), 2, "{before:?}");
        let item = before["data"][0]["id"].as_str().unwrap().to_string();
        let served = sim.served();
        let new_item = r#"{"items":[{"type":"message","role":"user","content":"B was here"}]}"#;
        let b_tries = [
            ("GET", format!("/v1/conversations/{cid}"), None),
            ("POST", format!("/v1/conversations/{cid}"), Some(r#"{"metadata":{"owner":"b"}}"#)),
            ("GET", format!("/v1/conversations/{cid}/items"), None),
            ("POST", format!("/v1/conversations/{cid}/items"), Some(new_item)),
            ("GET", format!("/v1/conversations/{cid}/items/{item}"), None),
            ("DELETE", format!("/v1/conversations/{cid}/items/{item}"), None),
            ("DELETE", format!("/v1/conversations/{cid}"), None),
        ];
        for (method, path, body) in b_tries {
            assert_eq!(error_code(&call(p, method, &path, body, AS_B), 404), "not_found", "{method} {path}");
        }
        let r = post(p, "/v1/responses", &in_conversation("Let me in", &cid), AS_B);
        assert_eq!(error_code(&r, 404), "not_found");
        assert_eq!(sim.served(), served, "nothing generated in another tenant's conversation");

        // A: as it was.
        assert_eq!(ok(&call(p, "GET", &format!("/v1/conversations/{cid}"), None, AS_A)), conv);
        assert_eq!(ok(&call(p, "GET", &format!("/v1/conversations/{cid}/items"), None, AS_A)), before);
        ok(&post(p, "/v1/responses", &in_conversation("Still mine", &cid), AS_A));
        // And B's own records are B's.
        let mine = ok(&post(p, "/v1/responses", &turn("B's own"), AS_B));
        assert_eq!(ok(&call(p, "GET", &format!("/v1/responses/{}", id_of(&mine)), None, AS_B)), mine);
        let r = call(p, "GET", &format!("/v1/responses/{}", id_of(&mine)), None, AS_A);
        assert_eq!(error_code(&r, 404), "not_found");
    });
}
