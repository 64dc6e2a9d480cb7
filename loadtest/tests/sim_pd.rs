//! smg-sim's PD roles (`--pd-role`) under both drivers: a prefill sim and a decode sim given the
//! same bodies with SGLang's bootstrap fields hand the KV over the prefill's bootstrap port; vLLM
//! workers do it with `kv_transfer_params`, the prefill's answer passed on to the decode.

mod common;

use std::net::TcpListener;
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use common::*;
use sonic_rs::{JsonContainerTrait, JsonValueTrait};

/// The bootstrap port a prefill sim's `listening` line names.
fn bootstrap_port(line: &str) -> u16 {
    let addr = line.split_whitespace().find_map(|f| f.strip_prefix("bootstrap=")).expect("no bootstrap= field");
    addr.rsplit(':').next().unwrap().parse().unwrap()
}

fn stats(port: u16) -> sonic_rs::Value {
    http(port, "GET", "/sim/stats", "").json()
}

/// `{"bootstrap_host":...,"bootstrap_port":...,"bootstrap_room":...}` fields to append to a body.
fn fields(bport: u16, room: u64) -> String {
    format!(r#","bootstrap_host":"127.0.0.1","bootstrap_port":{bport},"bootstrap_room":{room}"#)
}

/// SSE events of a body, without the `data: ` prefix.
fn events(text: &str) -> Vec<&str> {
    text.split("\n\n").filter(|e| !e.is_empty()).map(|e| e.strip_prefix("data: ").unwrap_or(e)).collect()
}

#[test]
fn prefill_hands_kv_to_decode() {
    for legacy in DRIVERS {
        let timeout = patience(Duration::from_secs(3));
        let timeout_ms = timeout.as_millis().to_string();
        let prefill = Sim::start(&["--ports", "0", "--pd-role", "prefill", "--ttft-ms", "20", "--itl-ms", "2"], legacy);
        let decode = Sim::start(
            &["--ports", "0", "--pd-role", "decode", "--itl-ms", "2", "--handoff-timeout-ms", &timeout_ms],
            legacy,
        );
        let (p, d) = (prefill.port(), decode.port());
        let line = &prefill.lines[0];
        assert!(
            line.starts_with(&format!(
                "listening 127.0.0.1:{p} model=sim-model runtime=sglang role=prefill bootstrap=127.0.0.1:"
            )),
            "{line}"
        );
        let bport = bootstrap_port(line);
        assert_ne!(bport, p);
        assert!(decode.lines[0].ends_with(" runtime=sglang role=decode"), "{}", decode.lines[0]);

        // Decode first: it waits on the bootstrap port until the prefill of its room is done.
        let body = chat_body(&format!(r#","max_tokens":5{}"#, fields(bport, 9_223_372_036_854_775_807)));
        let decode_leg = {
            let body = body.clone();
            thread::spawn(move || http(d, "POST", "/v1/chat/completions", &body))
        };
        let asked = wait_until(patience(Duration::from_secs(10)), || stats(p)["handoffs_pending"].as_u64() == Some(1));
        assert!(asked, "the decode never asked the prefill's bootstrap port");
        let pre = http(p, "POST", "/v1/chat/completions", &body);
        assert_eq!(pre.status, 200, "{}", pre.text());
        let pj = pre.json();
        assert_eq!(pj["choices"][0]["message"]["content"].as_str(), Some(" hi"));
        assert_eq!(pj["choices"][0]["finish_reason"].as_str(), Some("length"));
        assert_eq!(pj["usage"]["completion_tokens"].as_u64(), Some(1));
        assert!(pj["usage"]["prompt_tokens"].as_u64().unwrap() > 0);
        let dec = decode_leg.join().unwrap();
        assert_eq!(dec.status, 200, "{}", dec.text());
        let dj = dec.json();
        assert_eq!(dj["choices"][0]["message"]["content"].as_str(), Some(" hi hi hi hi hi"));
        assert_eq!(dj["usage"]["completion_tokens"].as_u64(), Some(5));

        // Prefill first, a streamed /generate batch of two: each leg's fields are arrays.
        let batch = format!(
            r#"{{"text":["a","b"],"sampling_params":{{"max_new_tokens":3}},"stream":true,"bootstrap_host":["127.0.0.1","127.0.0.1"],"bootstrap_port":[{bport},{bport}],"bootstrap_room":[7,8]}}"#
        );
        let pre = http(p, "POST", "/generate", &batch);
        assert_eq!(pre.status, 200, "{}", pre.text());
        let text = pre.text();
        let ev = events(&text);
        assert_eq!(ev.len(), 2, "{text}");
        let first: sonic_rs::Value = sonic_rs::from_str(ev[0]).unwrap();
        assert_eq!(first["text"].as_str(), Some(" hi"));
        assert_eq!(first["meta_info"]["completion_tokens"].as_u64(), Some(1));
        assert_eq!(first["meta_info"]["finish_reason"]["type"].as_str(), Some("length"));
        assert_eq!(ev[1], "[DONE]");
        let dec = http(d, "POST", "/generate", &batch);
        assert_eq!(dec.status, 200, "{}", dec.text());
        let text = dec.text();
        let ev = events(&text);
        assert_eq!(ev.len(), 4, "{text}");
        let last: sonic_rs::Value = sonic_rs::from_str(ev[2]).unwrap();
        assert_eq!(last["text"].as_str(), Some(" hi hi hi"));
        assert_eq!(ev[3], "[DONE]");

        // A room no prefill ever gets: 500 once the decode's budget is spent.
        let started = Instant::now();
        let lost = http(d, "POST", "/v1/completions", &format!(r#"{{"prompt":"x"{}}}"#, fields(bport, 12_345)));
        let took = started.elapsed();
        assert_eq!(lost.status, 500, "{}", lost.text());
        let msg = lost.json()["error"]["message"].as_str().unwrap().to_string();
        assert!(msg.starts_with("KV transfer failed"), "{msg}");
        assert!(took >= timeout - Duration::from_millis(50), "failed after {took:?}, before the {timeout:?} budget");
        assert!(took < timeout + patience(Duration::from_secs(5)), "failed only after {took:?}");

        // A bootstrap port nobody listens on: 500 at once.
        let closed = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let started = Instant::now();
        let lost = http(d, "POST", "/generate", &format!(r#"{{"text":"x"{}}}"#, fields(closed, 1)));
        assert_eq!(lost.status, 500, "{}", lost.text());
        assert!(lost.json()["error"]["message"].as_str().unwrap().starts_with("KV transfer failed"));
        assert!(started.elapsed() < timeout, "an unreachable prefill waited {:?}", started.elapsed());

        // Missing fields: the prefill needs the room, the decode all three.
        let no_room = chat_body(r#","bootstrap_host":"127.0.0.1","bootstrap_port":1"#);
        for (port, body) in
            [(p, chat_body("")), (p, no_room), (d, chat_body("")), (d, chat_body(r#","bootstrap_room":1"#))]
        {
            let r = http(port, "POST", "/v1/chat/completions", &body);
            assert_eq!(r.status, 400, "{}", r.text());
            assert!(r.json()["error"]["message"].as_str().unwrap().contains("bootstrap"), "{}", r.text());
        }

        let ps = stats(p);
        assert_eq!(ps["pd_role"].as_str(), Some("prefill"));
        assert_eq!(ps["handoffs_served"].as_u64(), Some(3), "{ps:?}");
        assert_eq!(ps["handoffs_pending"].as_u64(), Some(0), "{ps:?}");
        assert_eq!(ps["output_tokens"].as_u64(), Some(2), "one token per prefill answer: {ps:?}");
        let ds = stats(d);
        assert_eq!(ds["pd_role"].as_str(), Some("decode"));
        assert_eq!(ds["handoffs_waited"].as_u64(), Some(3), "{ds:?}");
        assert_eq!(ds["handoffs_failed"].as_u64(), Some(2), "{ds:?}");
        assert!(ds["handoff_wait_ms"].as_f64().unwrap() >= timeout.as_millis() as f64 - 50.0, "{ds:?}");
        assert_eq!(ds["completed"].as_u64(), Some(2), "{ds:?}");
    }
}

/// The prefill leg vLLM's disaggregated proxy makes of a client's chat request `extra`.
fn vllm_prefill_leg(extra: &str) -> String {
    chat_body(&format!(
        r#"{extra},"max_tokens":1,"stream":false,"kv_transfer_params":{{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}}"#
    ))
}

/// The prefill's `kv_transfer_params`, checked field by field, as the JSON to pass on.
fn vllm_params(pre: &Resp, bport: u16) -> String {
    assert_eq!(pre.status, 200, "{}", pre.text());
    let pj = pre.json();
    let kv = &pj["kv_transfer_params"];
    assert_eq!(kv["do_remote_prefill"].as_bool(), Some(true), "{}", pre.text());
    assert_eq!(kv["do_remote_decode"].as_bool(), Some(false));
    let blocks = kv["remote_block_ids"].as_array().expect("remote_block_ids");
    assert!(!blocks.is_empty() && blocks.iter().all(|b| b.as_u64().is_some()), "{}", pre.text());
    assert!(kv["remote_engine_id"].as_str().is_some_and(|e| !e.is_empty()), "{}", pre.text());
    assert_eq!(kv["remote_host"].as_str(), Some("127.0.0.1"));
    assert_eq!(kv["remote_port"].as_u64(), Some(bport as u64));
    assert_eq!(kv["tp_size"].as_u64(), Some(1));
    assert!(kv["remote_request_id"].as_str().is_some_and(|r| r.parse::<u64>().is_ok()), "{}", pre.text());
    sonic_rs::to_string(kv).unwrap()
}

#[test]
fn vllm_prefill_hands_kv_to_decode() {
    for legacy in DRIVERS {
        let timeout = patience(Duration::from_secs(2));
        let timeout_ms = timeout.as_millis().to_string();
        let prefill = Sim::start(
            &["--ports", "0", "--runtime", "vllm", "--pd-role", "prefill", "--ttft-ms", "20", "--itl-ms", "2"],
            legacy,
        );
        let decode = Sim::start(
            &[
                "--ports",
                "0",
                "--runtime",
                "vllm",
                "--pd-role",
                "decode",
                "--itl-ms",
                "2",
                "--handoff-timeout-ms",
                &timeout_ms,
            ],
            legacy,
        );
        let (p, d) = (prefill.port(), decode.port());
        let line = &prefill.lines[0];
        assert!(line.contains(" runtime=vllm role=prefill bootstrap=127.0.0.1:"), "{line}");
        let bport = bootstrap_port(line);
        assert!(decode.lines[0].ends_with(" runtime=vllm role=decode"), "{}", decode.lines[0]);

        // Prefill first, as the proxy does; an SGLang bootstrap field, even a bad one, is ignored.
        let pre = http(p, "POST", "/v1/chat/completions", &vllm_prefill_leg(r#","bootstrap_room":-1"#));
        let kv = vllm_params(&pre, bport);
        let pj = pre.json();
        assert_eq!(pj["choices"][0]["message"]["content"].as_str(), Some(" hi"));
        assert_eq!(pj["choices"][0]["finish_reason"].as_str(), Some("length"));
        assert_eq!(pj["usage"]["completion_tokens"].as_u64(), Some(1));
        let room: u64 = pj["kv_transfer_params"]["remote_request_id"].as_str().unwrap().parse().unwrap();
        // The decode: the client's request with the prefill's kv_transfer_params.
        let dec = http(
            d,
            "POST",
            "/v1/chat/completions",
            &chat_body(&format!(r#","max_tokens":5,"kv_transfer_params":{kv}"#)),
        );
        assert_eq!(dec.status, 200, "{}", dec.text());
        let dj = dec.json();
        assert_eq!(dj["choices"][0]["message"]["content"].as_str(), Some(" hi hi hi hi hi"));
        assert_eq!(dj["usage"]["completion_tokens"].as_u64(), Some(5));
        assert!(dj.get("kv_transfer_params").is_none(), "{}", dec.text());

        // Streamed to the client, /v1/completions: the prefill leg is still a JSON answer.
        let leg = r#"{"model":"sim-model","prompt":"hello there","max_tokens":1,"stream":false,"kv_transfer_params":{"do_remote_decode":true}}"#;
        let pre = http(p, "POST", "/v1/completions", leg);
        let kv2 = vllm_params(&pre, bport);
        assert_eq!(pre.json()["choices"][0]["text"].as_str(), Some(" hi"));
        let room2: u64 = pre.json()["kv_transfer_params"]["remote_request_id"].as_str().unwrap().parse().unwrap();
        assert_ne!(room, room2, "a fresh room per prefill");
        let body = format!(
            r#"{{"model":"sim-model","prompt":"hello there","max_tokens":3,"stream":true,"stream_options":{{"include_usage":true}},"kv_transfer_params":{kv2}}}"#
        );
        let dec = http(d, "POST", "/v1/completions", &body);
        assert_eq!(dec.status, 200, "{}", dec.text());
        let text = dec.text();
        let ev = events(&text);
        assert_eq!(ev.len(), 6, "3 tokens, the finish, the usage, [DONE]: {text}");
        let usage: sonic_rs::Value = sonic_rs::from_str(ev[4]).unwrap();
        assert_eq!(usage["usage"]["completion_tokens"].as_u64(), Some(3), "{text}");
        assert_eq!(ev[5], "[DONE]");

        // A room this prefill never finished: 500 once the decode's budget is spent.
        let lost_kv = kv.replace(&format!("\"{room}\""), &format!("\"{}\"", room + 1_000_000));
        assert_ne!(lost_kv, kv);
        let started = Instant::now();
        let lost = http(
            d,
            "POST",
            "/v1/chat/completions",
            &chat_body(&format!(r#","stream":true,"kv_transfer_params":{lost_kv}"#)),
        );
        let took = started.elapsed();
        assert_eq!(lost.status, 500, "{}", lost.text());
        let msg = lost.json()["error"]["message"].as_str().unwrap().to_string();
        assert!(msg.starts_with("KV transfer failed"), "{msg}");
        assert!(took >= timeout - Duration::from_millis(50), "failed after {took:?}, before the {timeout:?} budget");
        assert!(took < timeout + patience(Duration::from_secs(5)), "failed only after {took:?}");

        // Without the proxy's marks: the prefill needs do_remote_decode, the decode the prefill's
        // answer.
        for (port, body, needs) in [
            (p, chat_body(""), "do_remote_decode"),
            (p, chat_body(r#","kv_transfer_params":{"do_remote_decode":false}"#), "do_remote_decode"),
            (d, chat_body(""), "kv_transfer_params"),
            (d, chat_body(r#","kv_transfer_params":{"do_remote_prefill":true}"#), "remote_host"),
        ] {
            let r = http(port, "POST", "/v1/chat/completions", &body);
            assert_eq!(r.status, 400, "{}", r.text());
            assert!(r.json()["error"]["message"].as_str().unwrap().contains(needs), "{}", r.text());
        }

        // The lost room's long-poll ends on the prefill's own clock, about when the decode gave up.
        let idle = wait_until(patience(Duration::from_secs(5)), || stats(p)["handoffs_pending"].as_u64() == Some(0));
        assert!(idle, "the lost room's long-poll never ended: {:?}", stats(p));
        let ps = stats(p);
        assert_eq!(ps["pd_role"].as_str(), Some("prefill"));
        assert_eq!(ps["handoffs_served"].as_u64(), Some(2), "{ps:?}");
        assert_eq!(ps["output_tokens"].as_u64(), Some(2), "one token per prefill answer: {ps:?}");
        let ds = stats(d);
        assert_eq!(ds["pd_role"].as_str(), Some("decode"));
        assert_eq!(ds["handoffs_waited"].as_u64(), Some(2), "{ds:?}");
        assert_eq!(ds["handoffs_failed"].as_u64(), Some(1), "{ds:?}");
        assert_eq!(ds["completed"].as_u64(), Some(2), "{ds:?}");
    }
}

#[test]
fn pd_role_is_http_only() {
    let out = Command::new(env!("CARGO_BIN_EXE_smg-sim"))
        .args(["--ports", "0", "--pd-role", "prefill", "--grpc"])
        .output()
        .expect("run smg-sim");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--pd-role") && err.contains("--grpc"), "{err}");
}
