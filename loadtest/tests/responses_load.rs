//! smg-load's Responses scenarios through its binary: a chained conversation's turns carry
//! the previous answer's id (against a loopback stand-in that numbers its answers and fails
//! one), compare refuses them without gRPC workers, and a short run of `responses-chain10`
//! against the real gateway in front of `smg-sim --grpc` is answered 200 turn after turn with
//! the history growing in the engine's prompt. And `smg-sim --tool-call-markup` as an agent
//! model behind that gateway: a call for a question, then text quoting the tool's result.
//!
//! The gateway comes from `common::gateway_bin` (`$SMG_BIN`, else `smg` beside this test's
//! target directory); without one that test skips with a note. 127.0.0.1 only; every run is
//! bounded by a request count and a duration, and every wait by the patience factor.

mod common;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use smg_loadtest::load::scenario::Scenario;
use sonic_rs::{JsonContainerTrait, JsonValueTrait, Value};

/// One request the stand-in received: its body, and the id and status it answered with.
struct Seen {
    body: Value,
    id: String,
    status: u16,
}

/// A loopback server answering every POST like a Responses API does (`{"id": "resp_N", …}`,
/// N counting from 0 in arrival order), but request number `fail` with a 500 that names an id
/// too (which nobody may chain off). Keep-alive; each connection on a thread of its own.
fn stand_in(fail: usize) -> (u16, Arc<Mutex<Vec<Seen>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
    let log = seen.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { return };
            let log = log.clone();
            std::thread::spawn(move || serve(conn, &log, fail));
        }
    });
    (port, seen)
}

fn serve(mut conn: TcpStream, log: &Mutex<Vec<Seen>>, fail: usize) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    loop {
        // One request: the head, then content-length bytes of body.
        let (head_end, len) = loop {
            if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&buf[..at]).to_ascii_lowercase();
                let len = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .map_or(0, |v| v.trim().parse().unwrap());
                break (at + 4, len);
            }
            match conn.read(&mut chunk) {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        };
        while buf.len() < head_end + len {
            match conn.read(&mut chunk) {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        let body: Value = sonic_rs::from_slice(&buf[head_end..head_end + len]).unwrap();
        buf.drain(..head_end + len);
        let answer = {
            let mut log = log.lock().unwrap();
            let n = log.len();
            let id = format!("resp_{n}");
            let (status, answer) = if n == fail {
                (500, format!(r#"{{"id":"{id}","error":{{"message":"simulated failure"}}}}"#))
            } else {
                (
                    200,
                    format!(
                        r#"{{"id":"{id}","object":"response","status":"completed","usage":{{"input_tokens":5,"output_tokens":1,"total_tokens":6}}}}"#
                    ),
                )
            };
            log.push(Seen { body, id, status });
            format!(
                "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{answer}",
                answer.len()
            )
        };
        if conn.write_all(answer.as_bytes()).is_err() {
            return;
        }
    }
}

/// A run's bound in time, scaled by the patience factor.
fn bound(secs: u64) -> String {
    format!("{}ms", patience(Duration::from_secs(secs)).as_millis())
}

#[test]
fn each_chained_turn_carries_the_id_of_the_answer_before() {
    let scenario = Scenario::load("responses-chain10").unwrap();
    // Every input names its conversation and turn in the pool.
    let place: HashMap<String, (usize, usize)> = scenario
        .bodies()
        .iter()
        .enumerate()
        .map(|(i, b)| {
            let v: Value = sonic_rs::from_slice(b).unwrap();
            (v["input"].as_str().unwrap().to_string(), (i / scenario.turns, i % scenario.turns))
        })
        .collect();
    assert_eq!(place.len(), scenario.sessions * scenario.turns, "distinct inputs");
    for legacy in DRIVERS {
        let (port, seen) = stand_in(4);
        let r = smg_load(
            &[
                "run",
                "--url",
                &format!("http://127.0.0.1:{port}"),
                "--scenario",
                "responses-chain10",
                "--concurrency",
                "2",
                "--requests",
                "25",
                "--duration",
                &bound(30),
                "--json",
            ],
            legacy,
        );
        assert_eq!(r["requests"].as_u64(), Some(25), "{r:?}");
        assert_eq!(r["ok"].as_u64(), Some(24), "{r:?}");
        assert_eq!(r["status"]["500"].as_u64(), Some(1), "{r:?}");
        let chain = &r["chain"];
        let (first, chained) = (chain["first_turns"].as_u64().unwrap(), chain["chained_turns"].as_u64().unwrap());
        assert_eq!(first + chained, 25, "{r:?}");
        assert_eq!(chain["cut_short"].as_u64(), Some(1), "the failed turn ends its conversation: {r:?}");
        // Two users of 10 turns, one conversation cut: at most 2 + 1 + 2 conversations begin.
        assert!((2..=5).contains(&first), "{r:?}");
        assert_eq!(r["prompt_tokens"].as_u64(), Some(24 * 5), "Responses usage is read: {r:?}");

        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 25);
        let answered: HashMap<&str, (usize, &Seen)> =
            seen.iter().enumerate().map(|(n, s)| (s.id.as_str(), (n, s))).collect();
        let mut chained_off = std::collections::HashSet::new();
        for (n, s) in seen.iter().enumerate() {
            assert_eq!(s.body["store"].as_bool(), Some(true));
            let (c, t) = place[s.body["input"].as_str().unwrap()];
            match s.body["previous_response_id"].as_str() {
                None => assert_eq!(t, 0, "request {n}: a conversation begins at its first turn"),
                Some(prev) => {
                    let (m, before) = answered[prev];
                    assert!(m < n, "request {n} chains off {prev}, answered before it");
                    assert_eq!(before.status, 200, "request {n} chains off a failed answer");
                    let (pc, pt) = place[before.body["input"].as_str().unwrap()];
                    assert_eq!((c, t), (pc, pt + 1), "request {n}: the turn after {prev}'s, same conversation");
                    assert!(chained_off.insert(prev), "{prev} chained off twice");
                }
            }
        }
        assert_eq!(chained_off.len() as u64, chained);
    }
}

#[test]
fn compare_refuses_responses_without_grpc_workers() {
    let out = Command::new(env!("CARGO_BIN_EXE_smg-load"))
        .args(["compare", "--scenario", "responses-1k", "--targets", "smg", "--rounds", "1"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("add --grpc") && err.contains("responses-1k"), "{err}");
}

/// The gateway binary in front of a worker, on a loopback port, its log in a file; stopped
/// (and the log removed) on drop.
struct Gateway {
    child: Child,
    port: u16,
    log: std::path::PathBuf,
}

impl Gateway {
    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log);
    }
}

/// Starts the gateway on a port picked here ([`on_a_free_port`]: again on another one when it
/// exits because it cannot listen).
fn start_gateway(bin: &std::path::Path, worker: u16, extra: &[&str]) -> Gateway {
    on_a_free_port("the gateway", |port| {
        let log = std::env::temp_dir().join(format!("smg-load-responses-{}-{port}.log", std::process::id()));
        let child = Command::new(bin)
            .args(["launch", "--worker-urls", &format!("grpc://127.0.0.1:{worker}")])
            .args(["--host", "127.0.0.1", "--port", &port.to_string(), "--cores", "1"])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("start the gateway");
        let mut gw = Gateway { child, port, log };
        let mut exited = None;
        let ready = wait_until(patience(Duration::from_secs(30)), || {
            exited = gw.child.try_wait().unwrap();
            exited.is_some()
                || http_raw(port, &request_bytes("GET", "/readiness", ""), Duration::from_secs(2))
                    .is_ok_and(|raw| parse_response(&raw).text().contains("\"healthy_workers\":1"))
        });
        match exited {
            Some(_) if gw.log_text().contains("cannot listen on") => return None,
            Some(st) => panic!("the gateway exited at start ({st}):\n{}", gw.log_text()),
            None => {}
        }
        assert!(ready, "the gateway's gRPC worker never became routable:\n{}", gw.log_text());
        Some(gw)
    })
}

#[test]
fn responses_chain10_through_the_gateway_on_a_grpc_worker() {
    let Some(bin) = gateway_bin() else {
        eprintln!("skipped: no gateway binary (build it with `cargo build --bin smg`, or set SMG_BIN)");
        return;
    };
    let sim = Sim::start(&["--grpc", "--ports", "0", "--ttft-ms", "0", "--itl-ms", "0"], false);
    let gw = start_gateway(&bin, sim.port(), &[]);
    let scenario = Scenario::load("responses-chain10").unwrap();
    let url = format!("http://127.0.0.1:{}", gw.port);
    let engine_prompt =
        || http(sim.port(), "GET", "/sim/stats", "").json()["grpc"]["last_generate"]["input_tokens"].as_u64().unwrap();
    // The first turn alone: what the engine reads of a fresh turn.
    let first = String::from_utf8(scenario.bodies().swap_remove(0)).unwrap();
    let r = http_within(gw.port, "POST", "/v1/responses", &first, Duration::from_secs(15));
    assert_eq!(r.status, 200, "{}", r.text());
    let fresh = engine_prompt();
    assert_eq!(r.json()["usage"]["input_tokens"].as_u64(), Some(fresh));

    // One user: one conversation of 10 turns, each chained off the one before.
    let one = smg_load(
        &[
            "run",
            "--url",
            &url,
            "--scenario",
            "responses-chain10",
            "--concurrency",
            "1",
            "--requests",
            "10",
            "--duration",
            &bound(60),
            "--json",
        ],
        false,
    );
    assert_eq!(one["status"]["200"].as_u64(), Some(10), "{one:?}");
    assert_eq!(one["ok"].as_u64(), Some(10), "{one:?}");
    assert_eq!(one["chain"]["first_turns"].as_u64(), Some(1), "{one:?}");
    assert_eq!(one["chain"]["chained_turns"].as_u64(), Some(9), "{one:?}");
    assert_eq!(one["chain"]["cut_short"].as_u64(), Some(0), "{one:?}");
    // The gateway rendered the stored history: the tenth turn's prompt holds the nine before.
    let tenth = engine_prompt();
    assert!(tenth > 4 * fresh, "the tenth turn read {tenth} prompt tokens, a fresh one {fresh}");

    // Two users at once.
    let two = smg_load(
        &[
            "run",
            "--url",
            &url,
            "--scenario",
            "responses-chain10",
            "--concurrency",
            "2",
            "--requests",
            "24",
            "--duration",
            &bound(60),
            "--json",
        ],
        false,
    );
    assert_eq!(two["status"]["200"].as_u64(), Some(24), "{two:?}");
    let chain = &two["chain"];
    assert_eq!(chain["first_turns"].as_u64().unwrap() + chain["chained_turns"].as_u64().unwrap(), 24, "{two:?}");
    assert!(chain["chained_turns"].as_u64().unwrap() >= 20, "{two:?}");
    assert_eq!(chain["cut_short"].as_u64(), Some(0), "{two:?}");
}

const WEATHER: &str = r#"{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}"#;

#[test]
fn an_agent_model_answers_a_tool_result_in_text_through_the_gateway() {
    let Some(bin) = gateway_bin() else {
        eprintln!("skipped: no gateway binary (build it with `cargo build --bin smg`, or set SMG_BIN)");
        return;
    };
    let sim = Sim::start(
        &[
            "--grpc",
            "--ports",
            "0",
            "--ttft-ms",
            "0",
            "--itl-ms",
            "0",
            "--reasoning-markup",
            "qwen3",
            "--tool-call-markup",
            "qwen",
        ],
        false,
    );
    let gw = start_gateway(&bin, sim.port(), &["--reasoning-parser", "qwen3", "--tool-call-parser", "qwen"]);
    let chat = |messages: &str| {
        let body = format!(r#"{{"model":"sim-model","messages":[{messages}],"tools":[{WEATHER}]}}"#);
        let r = http_within(gw.port, "POST", "/v1/chat/completions", &body, Duration::from_secs(15));
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()["choices"][0].clone()
    };
    // A user's question: the model calls the tool.
    let asked = chat(r#"{"role":"user","content":"Weather in Paris?"}"#);
    assert_eq!(asked["finish_reason"].as_str(), Some("tool_calls"), "{asked:?}");
    let call = &asked["message"]["tool_calls"][0];
    let (id, args) = (call["id"].as_str().unwrap(), call["function"]["arguments"].as_str().unwrap());
    // Its result: the model answers in text, quoting it, and calls nothing.
    let history = format!(
        r#"{{"role":"user","content":"Weather in Paris?"}},{{"role":"assistant","content":"","tool_calls":[{{"id":"{id}","type":"function","function":{{"name":"get_weather","arguments":{}}}}}]}},{{"role":"tool","tool_call_id":"{id}","content":"Sunny, 21 C"}}"#,
        sonic_rs::to_string(args).unwrap()
    );
    let answered = chat(&history);
    assert_eq!(answered["finish_reason"].as_str(), Some("stop"), "{answered:?}");
    let m = &answered["message"];
    assert_eq!(m["content"].as_str().map(str::trim), Some("The tool said: Sunny, 21 C."), "{answered:?}");
    assert_eq!(m["reasoning_content"].as_str(), Some("The tool answered."), "{answered:?}");
    assert!(m["tool_calls"].as_array().is_none_or(|c| c.is_empty()), "{answered:?}");
}
