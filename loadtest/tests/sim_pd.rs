//! smg-sim's PD roles (`--pd-role`) under both drivers: a prefill sim and a decode sim given the
//! same bodies with SGLang's bootstrap fields hand the KV over the prefill's bootstrap port; vLLM
//! workers do it with `kv_transfer_params`, the prefill's answer passed on to the decode; gRPC
//! workers (`--grpc`) with Generate's `disaggregated_params`. `/generate`'s log-probabilities on
//! a pair: the prefill's hold the prompt, the decode's none.

mod common;
mod grpc_client;

use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use common::*;
use grpc_client::{block_on, call, connect, decode, split, Reply};
use smg_proto::paths::sglang_scheduler as path;
use smg_proto::scheduler as pb;
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
        let closed = refused_port();
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

        // The long-poll of the room that never came ends on the prefill's own timer, which
        // started when the decode's request reached it: a moment after the decode's.
        let drained =
            wait_until(patience(Duration::from_secs(10)), || stats(p)["handoffs_pending"].as_u64() == Some(0));
        let ps = stats(p);
        assert!(drained, "a long-poll outlived its budget: {ps:?}");
        assert_eq!(ps["pd_role"].as_str(), Some("prefill"));
        assert_eq!(ps["handoffs_served"].as_u64(), Some(3), "{ps:?}");
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
fn grpc_pd_roles_are_sglangs() {
    // The gRPC API is SGLang's: a vLLM worker has no gRPC PD shape.
    let out = Command::new(env!("CARGO_BIN_EXE_smg-sim"))
        .args(["--ports", "0", "--pd-role", "prefill", "--grpc", "--runtime", "vllm"])
        .output()
        .expect("run smg-sim");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--pd-role") && err.contains("--grpc") && err.contains("sglang"), "{err}");
}

/// A Generate request of 40 prompt ids for `max_new` tokens, with `params` as its
/// `disaggregated_params`.
fn gen_request(id: &str, stream: bool, max_new: u32, params: Option<pb::DisaggregatedParams>) -> pb::GenerateRequest {
    let sp = pb::SamplingParams {
        temperature: 1.0,
        top_p: 1.0,
        top_k: -1,
        max_new_tokens: Some(max_new),
        ..Default::default()
    };
    pb::GenerateRequest {
        request_id: id.into(),
        tokenized: Some(pb::TokenizedInput { original_text: String::new(), input_ids: (1..=40).collect() }),
        sampling_params: Some(sp),
        stream,
        disaggregated_params: params,
        ..Default::default()
    }
}

fn params(bport: u16, room: i32) -> Option<pb::DisaggregatedParams> {
    Some(pb::DisaggregatedParams {
        bootstrap_host: "127.0.0.1".into(),
        bootstrap_port: bport as i32,
        bootstrap_room: room,
    })
}

/// One Generate call on a fresh connection, on a runtime of the calling thread.
fn generate(port: u16, req: &pb::GenerateRequest) -> Reply {
    block_on(async {
        let mut c = connect(port).await;
        call(&mut c, path::GENERATE, req).await
    })
}

/// The `server_args` string `key` of a gRPC worker's GetServerInfo.
fn server_arg(port: u16, key: &str) -> Option<prost_types::value::Kind> {
    let si: Vec<pb::GetServerInfoResponse> = block_on(async {
        let mut c = connect(port).await;
        decode(&call(&mut c, path::GET_SERVER_INFO, &pb::GetServerInfoRequest {}).await)
    });
    si[0].server_args.as_ref()?.fields.get(key)?.kind.clone()
}

#[test]
fn grpc_prefill_hands_kv_to_decode() {
    use prost_types::value::Kind;
    for legacy in DRIVERS {
        let timeout = patience(Duration::from_secs(2));
        let timeout_ms = timeout.as_millis().to_string();
        let prefill =
            Sim::start(&["--grpc", "--ports", "0", "--pd-role", "prefill", "--ttft-ms", "20", "--itl-ms", "2"], legacy);
        let decode_sim = Sim::start(
            &["--grpc", "--ports", "0", "--pd-role", "decode", "--itl-ms", "2", "--handoff-timeout-ms", &timeout_ms],
            legacy,
        );
        let (p, d) = (prefill.port(), decode_sim.port());
        let line = &prefill.lines[0];
        assert!(line.contains(" runtime=sglang protocol=grpc role=prefill bootstrap=127.0.0.1:"), "{line}");
        let bport = bootstrap_port(line);
        assert!(decode_sim.lines[0].ends_with(" protocol=grpc role=decode"), "{}", decode_sim.lines[0]);

        // Decode first, as the gateway's legs leave together: its call waits on the bootstrap
        // port until the prefill of its room is done. The largest room the proto's int32 holds.
        let req = gen_request("pd-1", true, 5, params(bport, i32::MAX - 1));
        let decode_leg = {
            let req = req.clone();
            thread::spawn(move || generate(d, &req))
        };
        let asked = wait_until(patience(Duration::from_secs(10)), || stats(p)["handoffs_pending"].as_u64() == Some(1));
        assert!(asked, "the decode never asked the prefill's bootstrap port");
        let (chunks, done) = split(decode(&generate(p, &req)));
        assert_eq!(chunks.len(), 1, "one token from a prefill");
        assert_eq!((chunks[0].token_ids.len(), chunks[0].completion_tokens), (1, 1));
        assert_eq!(done.len(), 1);
        assert_eq!(
            (done[0].finish_reason.as_str(), done[0].completion_tokens, done[0].prompt_tokens),
            ("length", 1, 40)
        );
        let first = chunks[0].token_ids[0];
        let (chunks, done) = split(decode(&decode_leg.join().unwrap()));
        assert_eq!(chunks.iter().map(|c| c.completion_tokens).collect::<Vec<_>>(), [1, 2, 3, 4, 5]);
        assert_eq!(chunks[0].token_ids, [first], "the decode goes on from the prefill's token");
        assert_eq!((done[0].finish_reason.as_str(), done[0].completion_tokens), ("length", 5));

        // Prefill first, not streamed, with log-probabilities: the prompt's come from the prefill only.
        let mut req = gen_request("pd-2", false, 3, params(bport, 0));
        req.return_logprob = true;
        req.logprob_start_len = 0;
        let (_, pre) = split(decode(&generate(p, &req)));
        assert_eq!(pre[0].output_ids.len(), 1);
        assert_eq!(pre[0].input_logprobs.as_ref().map(|l| l.token_ids.len()), Some(40));
        let (_, dec) = split(decode(&generate(d, &req)));
        assert_eq!(dec[0].output_ids.len(), 3);
        assert_eq!(dec[0].output_ids[0], pre[0].output_ids[0]);
        assert!(dec[0].input_logprobs.is_none(), "a decode computes no prompt log-probabilities");
        assert_eq!(dec[0].output_logprobs.as_ref().map(|l| l.token_logprobs.len()), Some(3));

        // A room no prefill ever gets: INTERNAL before any message, once the budget is spent.
        let started = Instant::now();
        let lost = generate(d, &gen_request("lost", true, 3, params(bport, 12_345)));
        let took = started.elapsed();
        assert_eq!((lost.code, lost.trailers_only), (13, true), "{}", lost.message);
        assert!(lost.messages.is_empty());
        assert!(lost.message.starts_with("KV transfer failed"), "{}", lost.message);
        assert!(took >= timeout - Duration::from_millis(50), "failed after {took:?}, before the {timeout:?} budget");
        assert!(took < timeout + patience(Duration::from_secs(5)), "failed only after {took:?}");
        // A bootstrap port nobody listens on: INTERNAL at once.
        let closed = refused_port();
        let started = Instant::now();
        let lost = generate(d, &gen_request("lost2", false, 3, params(closed, 1)));
        assert_eq!(lost.code, 13, "{}", lost.message);
        assert!(lost.message.starts_with("KV transfer failed"), "{}", lost.message);
        assert!(started.elapsed() < timeout, "an unreachable prefill waited {:?}", started.elapsed());

        // Both roles need disaggregated_params; a negative room is no room.
        for (port, req) in [
            (p, gen_request("bare", false, 3, None)),
            (d, gen_request("bare", true, 3, None)),
            (p, gen_request("neg", false, 3, params(bport, -1))),
        ] {
            let r = generate(port, &req);
            assert_eq!((r.code, r.trailers_only), (3, true), "{}", r.message);
            assert!(r.message.contains("disaggregated_params"), "{}", r.message);
        }

        // The unary RPCs as any gRPC worker's, the role in SGLang's server args and load section.
        for (port, role) in [(p, "prefill"), (d, "decode")] {
            assert_eq!(server_arg(port, "disaggregation_mode"), Some(Kind::StringValue(role.into())));
            let (info, loads): (Vec<pb::GetModelInfoResponse>, Vec<pb::GetLoadsResponse>) = block_on(async {
                let mut c = connect(port).await;
                let info = decode(&call(&mut c, path::GET_MODEL_INFO, &pb::GetModelInfoRequest {}).await);
                let req = pb::GetLoadsRequest { dp_rank: None, include: vec!["disagg".into()] };
                (info, decode(&call(&mut c, path::GET_LOADS, &req).await))
            });
            assert_eq!(info[0].served_model_name, "sim-model");
            assert_eq!(loads[0].loads[0].disaggregation.as_ref().map(|x| x.mode.as_str()), Some(role));
        }
        assert_eq!(server_arg(p, "disaggregation_bootstrap_port"), Some(Kind::NumberValue(bport as f64)));
        assert_eq!(server_arg(d, "disaggregation_bootstrap_port"), None);

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
        assert_eq!(ds["handoffs_failed"].as_u64(), Some(2), "{ds:?}");
        assert!(ds["handoff_wait_ms"].as_f64().unwrap() >= timeout.as_millis() as f64 - 50.0, "{ds:?}");
        assert_eq!(ds["completed"].as_u64(), Some(2), "{ds:?}");
        assert_eq!(ds["grpc"]["in_flight"].as_u64(), Some(0), "{ds:?}");
    }
}

/// A `/generate` body asking for log-probabilities from the prompt's start, with `extra` fields.
fn logprob_body(extra: &str) -> String {
    format!(
        r#"{{"text":"a prompt of some length for the pair","sampling_params":{{"max_new_tokens":4}},"return_logprob":true,"logprob_start_len":0{extra}}}"#
    )
}

fn list_len(v: &sonic_rs::Value, key: &str) -> usize {
    v["meta_info"][key].as_array().unwrap_or_else(|| panic!("no {key} in {v:?}")).len()
}

#[test]
fn generate_logprobs_on_a_pair() {
    for legacy in DRIVERS {
        let timeout_ms = patience(Duration::from_secs(3)).as_millis().to_string();
        let prefill = Sim::start(&["--ports", "0", "--pd-role", "prefill"], legacy);
        let decode_sim =
            Sim::start(&["--ports", "0", "--pd-role", "decode", "--handoff-timeout-ms", &timeout_ms], legacy);
        let (p, d) = (prefill.port(), decode_sim.port());
        let bport = bootstrap_port(&prefill.lines[0]);

        // Whole answers, prefill first: the prompt's log-probabilities come from the prefill.
        let body = logprob_body(&fields(bport, 1));
        let pre = http(p, "POST", "/generate", &body);
        assert_eq!(pre.status, 200, "{}", pre.text());
        let pj = pre.json();
        let prompt_tokens = pj["meta_info"]["prompt_tokens"].as_u64().unwrap() as usize;
        assert!(prompt_tokens > 1);
        let input = pj["meta_info"]["input_token_logprobs"].as_array().unwrap();
        assert_eq!(input.len(), prompt_tokens, "the whole prompt from logprob_start_len 0");
        assert!(input[0][0].is_null() && input[1][0].as_f64().unwrap() <= 0.0, "{input:?}");
        assert_eq!(list_len(&pj, "output_token_logprobs"), 1);
        let dec = http(d, "POST", "/generate", &body);
        assert_eq!(dec.status, 200, "{}", dec.text());
        let dj = dec.json();
        assert_eq!(list_len(&dj, "input_token_logprobs"), 0, "a decode computes no prompt log-probabilities");
        let output = dj["meta_info"]["output_token_logprobs"].as_array().unwrap();
        assert_eq!(output.len(), 4);
        assert_eq!(output[0], pj["meta_info"]["output_token_logprobs"][0], "the same first token");
        assert!(output.iter().all(|t| t[0].as_f64().is_some_and(|lp| lp <= 0.0) && t[1].as_u64().is_some()));

        // Streamed: every chunk carries the whole input list (the decode's empty) and the output so far.
        let body = logprob_body(&format!(r#","stream":true{}"#, fields(bport, 2)));
        let pre = http(p, "POST", "/generate", &body);
        let text = pre.text();
        let ev = events(&text);
        assert_eq!(ev.len(), 2, "{text}");
        let chunk: sonic_rs::Value = sonic_rs::from_str(ev[0]).unwrap();
        assert_eq!(
            (list_len(&chunk, "input_token_logprobs"), list_len(&chunk, "output_token_logprobs")),
            (prompt_tokens, 1)
        );
        let dec = http(d, "POST", "/generate", &body);
        let text = dec.text();
        let ev = events(&text);
        assert_eq!(ev.len(), 5, "{text}");
        for (k, e) in ev[..4].iter().enumerate() {
            let chunk: sonic_rs::Value = sonic_rs::from_str(e).unwrap();
            assert_eq!(list_len(&chunk, "input_token_logprobs"), 0, "{e}");
            assert_eq!(list_len(&chunk, "output_token_logprobs"), k + 1, "{e}");
        }
    }
}
