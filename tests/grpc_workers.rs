//! gRPC workers (`grpc://`, SGLang's scheduler API) through the real binary, against the
//! simulated scheduler (`smg-sim --grpc`) in this process: registration and readiness, the
//! gateway's own tokenization, detokenization and OpenAI responses, aborts and engine errors.

mod support;

use sonic_rs::{JsonContainerTrait, JsonValueTrait};
use support::sim::Sim;
use support::*;

const MODEL: &str = "sim-model";

fn gateway(legacy: bool, sims: &[&Sim], extra: &[&str]) -> Gateway {
    let urls: Vec<String> = sims.iter().map(|s| s.grpc_url()).collect();
    let mut args: Vec<&str> = vec!["--worker-urls"];
    args.extend(urls.iter().map(String::as_str));
    args.extend_from_slice(&["--cores", "2", "--health-check-interval-secs", "1"]);
    args.extend_from_slice(extra);
    let gw = Gateway::start(legacy, &args);
    gw.ready_workers(sims.len());
    gw
}

#[test]
fn grpc_workers_register_with_their_model_and_tokenizer() {
    both_drivers(|legacy| {
        // One advertises a local tokenizer directory, the other a path the gateway cannot
        // read: its tokenizer comes over GetTokenizer.
        let local = Sim::start(MODEL, &["--grpc"]);
        let remote = Sim::start(MODEL, &["--grpc", "--advertise-tokenizer-path", "/nonexistent/sim-model"]);
        let gw = gateway(legacy, &[&local, &remote], &[]);
        let workers = get(gw.port, "/workers").json();
        let list = workers["workers"].as_array().expect("workers");
        assert_eq!(list.len(), 2, "{workers:?}");
        for w in list.iter() {
            assert_eq!(w["connection_mode"].as_str(), Some("grpc"), "{w:?}");
            assert_eq!(w["runtime_type"].as_str(), Some("sglang"));
            assert_eq!(w["model_id"].as_str(), Some(MODEL));
            assert_eq!(w["is_healthy"].as_bool(), Some(true));
            assert!(w["url"].as_str().unwrap().starts_with("grpc://127.0.0.1:"));
        }
        let rpcs = |s: &Sim| s.stats()["grpc"]["rpcs"].clone();
        assert!(rpcs(&remote)["GetTokenizer"].as_u64().unwrap_or(0) >= 1, "{:?}", rpcs(&remote));
        assert!(rpcs(&local)["GetTokenizer"].as_u64().is_none(), "{:?}", rpcs(&local));
        assert!(rpcs(&local)["HealthCheck"].as_u64().unwrap_or(0) >= 1);
        let models = get(gw.port, "/v1/models").json();
        assert_eq!(models["data"][0]["id"].as_str(), Some(MODEL));
    });
}

use smg_loadtest::sim::grpc::generate::{seed_of, token_at};
use smg_loadtest::sim::grpc::tokenizer::token_text;

/// What the simulator says for engine request `rid`, sample `index`: `words` whole words.
fn sim_text(rid: &str, index: u32, words: u32) -> String {
    (0..words).map(|k| token_text(token_at(seed_of(rid), index, k))).collect()
}

fn chat(extra: &str) -> String {
    format!(r#"{{"model":"{MODEL}","messages":[{{"role":"user","content":"Say something"}}]{extra}}}"#)
}

fn completion(prompt: &str, extra: &str) -> String {
    format!(r#"{{"model":"{MODEL}","prompt":{prompt}{extra}}}"#)
}

/// The `data:` payloads of an SSE body, `[DONE]` included.
fn events(r: &Response) -> Vec<String> {
    r.text().split("\n\n").filter_map(|e| e.strip_prefix("data: ")).map(str::to_string).collect()
}

fn json_events(r: &Response) -> Vec<sonic_rs::Value> {
    let ev = events(r);
    assert_eq!(ev.last().map(String::as_str), Some("[DONE]"), "{}", r.text());
    ev[..ev.len() - 1].iter().map(|e| sonic_rs::from_str(e).unwrap_or_else(|_| panic!("event {e}"))).collect()
}

/// Streamed text per choice index, and the finish reasons.
fn streamed(evs: &[sonic_rs::Value], chat: bool) -> (Vec<String>, Vec<Option<String>>) {
    let mut text: Vec<String> = Vec::new();
    let mut fin: Vec<Option<String>> = Vec::new();
    for e in evs {
        for c in e["choices"].as_array().unwrap().iter() {
            let i = c["index"].as_u64().unwrap() as usize;
            if text.len() <= i {
                text.resize(i + 1, String::new());
                fin.resize(i + 1, None);
            }
            let piece = if chat { c["delta"]["content"].as_str() } else { c["text"].as_str() };
            text[i].push_str(piece.unwrap_or(""));
            if let Some(f) = c["finish_reason"].as_str() {
                fin[i] = Some(f.to_string());
            }
        }
    }
    (text, fin)
}

const FAST: &[&str] = &["--grpc", "--ttft-ms", "0", "--itl-ms", "0", "--output-tokens", "6"];

#[test]
fn chat_and_completions_text_is_what_the_engine_tokens_decode_to() {
    both_drivers(|legacy| {
        let sim = Sim::start(MODEL, FAST);
        let gw = gateway(legacy, &[&sim], &[]);
        // Non-streaming chat: 5 words and the stop token.
        let r = post(gw.port, "/v1/chat/completions", &chat(""), &[]);
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.header("x-smg-routed-worker-id"), Some(sim.grpc_url().as_str()));
        let v = r.json();
        let id = v["id"].as_str().unwrap().to_string();
        assert!(id.starts_with("chatcmpl-"), "{id}");
        assert_eq!(v["object"].as_str(), Some("chat.completion"));
        assert_eq!(v["model"].as_str(), Some(MODEL));
        assert!(v.get("system_fingerprint").is_none());
        let c = &v["choices"][0];
        assert_eq!(c["message"]["content"].as_str(), Some(sim_text(&id, 0, 5).as_str()));
        assert_eq!(c["finish_reason"].as_str(), Some("stop"));
        let u = &v["usage"];
        assert_eq!(u["completion_tokens"].as_u64(), Some(6), "the stop token counts: {u:?}");
        let prompt = u["prompt_tokens"].as_u64().unwrap();
        assert!(prompt > 3, "the ChatML prompt: {u:?}");
        assert_eq!(u["total_tokens"].as_u64(), Some(prompt + 6));
        assert!(u["prompt_tokens_details"]["cached_tokens"].as_u64().is_some());
        // What the engine got: token ids and explicit sampling values under the model's defaults.
        let last = sim.stats()["grpc"]["last_generate"].clone();
        assert_eq!(last["request_id"].as_str(), Some(id.as_str()));
        assert_eq!(last["input_tokens"].as_u64(), Some(prompt));
        assert!((last["temperature"].as_f64().unwrap() - 0.7).abs() < 1e-6, "{last:?}");
        assert_eq!(last["top_k"].as_i64(), Some(20));
        assert!((last["repetition_penalty"].as_f64().unwrap() - 1.0).abs() < 1e-6);
        assert_eq!(last["skip_special_tokens"].as_bool(), Some(true));
        assert!(last["max_new_tokens"].is_null());

        // The client's values win; max_completion_tokens is the engine's max_new_tokens.
        let r = post(gw.port, "/v1/chat/completions", &chat(r#","temperature":0.2,"max_completion_tokens":3"#), &[]);
        let v = r.json();
        let id = v["id"].as_str().unwrap();
        assert_eq!(v["choices"][0]["message"]["content"].as_str(), Some(sim_text(id, 0, 3).as_str()));
        assert_eq!(v["choices"][0]["finish_reason"].as_str(), Some("length"));
        let last = sim.stats()["grpc"]["last_generate"].clone();
        assert!((last["temperature"].as_f64().unwrap() - 0.2).abs() < 1e-6);
        assert_eq!(last["max_new_tokens"].as_u64(), Some(3));

        // Streaming chat, with usage (and continuous usage) chunks.
        let body = chat(r#","stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":true}"#);
        let r = post(gw.port, "/v1/chat/completions", &body, &[]);
        assert_eq!(r.status, 200, "{}", r.text());
        assert!(r.header("content-type").unwrap().starts_with("text/event-stream"));
        let evs = json_events(&r);
        let id = evs[0]["id"].as_str().unwrap().to_string();
        assert_eq!(evs[0]["choices"][0]["delta"]["role"].as_str(), Some("assistant"));
        assert!(evs
            .iter()
            .all(|e| e["object"].as_str() == Some("chat.completion.chunk") && e["id"].as_str() == Some(&id)));
        let (text, fin) = streamed(&evs, true);
        assert_eq!(text, [sim_text(&id, 0, 5)]);
        assert_eq!(fin, [Some("stop".to_string())]);
        let last = evs.last().unwrap();
        assert!(last["choices"].as_array().unwrap().is_empty());
        assert_eq!(last["usage"]["completion_tokens"].as_u64(), Some(6));
        assert!(evs[1]["usage"]["completion_tokens"].as_u64().is_some(), "continuous usage: {:?}", evs[1]);

        // Completions, non-streaming and streaming; each prompt of an array its own request.
        let r = post(gw.port, "/v1/completions", &completion(r#""Once upon a time""#, ""), &[]);
        let v = r.json();
        let id = v["id"].as_str().unwrap();
        assert!(id.starts_with("cmpl-"), "{id}");
        assert_eq!(v["object"].as_str(), Some("text_completion"));
        assert_eq!(v["choices"][0]["text"].as_str(), Some(sim_text(id, 0, 5).as_str()));
        let r = post(gw.port, "/v1/completions", &completion(r#""Once""#, r#","stream":true"#), &[]);
        let evs = json_events(&r);
        let id = evs[0]["id"].as_str().unwrap().to_string();
        assert_eq!(streamed(&evs, false).0, [sim_text(&id, 0, 5)]);
        let before = sim.served();
        let r = post(gw.port, "/v1/completions", &completion(r#"["one","two"]"#, r#","max_tokens":2"#), &[]);
        let v = r.json();
        let id = v["id"].as_str().unwrap();
        assert_eq!(sim.served() - before, 2, "one engine request per prompt");
        for i in 0..2u32 {
            let c = &v["choices"][i as usize];
            assert_eq!(c["index"].as_u64(), Some(i as u64));
            assert_eq!(c["text"].as_str(), Some(sim_text(&format!("{id}-{i}"), 0, 2).as_str()));
        }
        assert_eq!(v["usage"]["completion_tokens"].as_u64(), Some(4));
    });
}
