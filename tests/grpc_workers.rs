//! gRPC workers (`grpc://`, SGLang's scheduler API) through the real binary, against the
//! simulated scheduler (`smg-sim --grpc`) in this process: registration and readiness, the
//! gateway's own tokenization, detokenization and OpenAI responses, aborts and engine errors.
// A test's threads are not shards: they sleep, and time what the gateway does.
#![allow(clippy::disallowed_methods)]

mod support;

use std::time::Duration;

use sonic_rs::{JsonContainerTrait, JsonValueTrait};
use support::sim::{grpc_gateway as gateway, tokenizer_dir_with_template, Sim};
use support::*;

const MODEL: &str = "sim-model";

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
use smg_loadtest::sim::tokenizer::token_text;

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

#[test]
fn stop_strings_and_multibyte_characters_split_across_tokens() {
    both_drivers(|legacy| {
        let sim = Sim::start(MODEL, FAST);
        let gw = gateway(legacy, &[&sim], &[]);
        // One byte token per byte: "é", "ö" and "😀" each span several tokens, and so does "END".
        let said = "héllo wörld 😀 END and then more";
        let output = format!(r#","custom_params":{{"sim_output":"{said}"}}"#);
        let r = post(gw.port, "/v1/chat/completions", &chat(&output), &[]);
        assert_eq!(r.json()["choices"][0]["message"]["content"].as_str(), Some(said));
        for stream in [false, true] {
            let extra = format!(r#"{output},"stop":["END"],"stream":{stream}"#);
            let r = post(gw.port, "/v1/chat/completions", &chat(&extra), &[]);
            assert_eq!(r.status, 200, "{}", r.text());
            let (text, fin) = if stream {
                let evs = json_events(&r);
                // Every delta is whole characters (a split one would not be valid JSON text
                // equal to the original when joined).
                streamed(&evs, true)
            } else {
                let v = r.json();
                let c = &v["choices"][0];
                (
                    vec![c["message"]["content"].as_str().unwrap().to_string()],
                    vec![c["finish_reason"].as_str().map(String::from)],
                )
            };
            assert_eq!(text, ["héllo wörld 😀 "], "stream {stream}");
            assert_eq!(fin, [Some("stop".to_string())]);
        }
        // no_stop_trim keeps the stop string; a completions stream splits the same way.
        let extra = format!(r#"{output},"stop":"END","no_stop_trim":true"#);
        let v = post(gw.port, "/v1/chat/completions", &chat(&extra), &[]).json();
        assert_eq!(v["choices"][0]["message"]["content"].as_str(), Some("héllo wörld 😀 END"));
        let extra = format!(r#"{output},"stop":["wör"],"stream":true"#);
        let r = post(gw.port, "/v1/completions", &completion(r#""x""#, &extra), &[]);
        assert_eq!(streamed(&json_events(&r), false).0, ["héllo "]);
    });
}

#[test]
fn n_choices_come_back_by_index() {
    both_drivers(|legacy| {
        let sim = Sim::start(MODEL, FAST);
        let gw = gateway(legacy, &[&sim], &[]);
        let v = post(gw.port, "/v1/chat/completions", &chat(r#","n":3"#), &[]).json();
        let id = v["id"].as_str().unwrap();
        let choices = v["choices"].as_array().unwrap();
        assert_eq!(choices.len(), 3);
        for (i, c) in choices.iter().enumerate() {
            assert_eq!(c["index"].as_u64(), Some(i as u64));
            assert_eq!(c["message"]["content"].as_str(), Some(sim_text(id, i as u32, 5).as_str()));
        }
        assert_eq!(v["usage"]["completion_tokens"].as_u64(), Some(18));
        let r = post(gw.port, "/v1/chat/completions", &chat(r#","n":3,"stream":true"#), &[]);
        let evs = json_events(&r);
        let id = evs[0]["id"].as_str().unwrap().to_string();
        let (text, fin) = streamed(&evs, true);
        assert_eq!(text, (0..3).map(|i| sim_text(&id, i, 5)).collect::<Vec<_>>());
        assert!(fin.iter().all(|f| f.as_deref() == Some("stop")));
        assert_eq!(sim.stats()["grpc"]["last_generate"]["n"].as_u64(), Some(3));
    });
}

#[test]
fn a_client_that_leaves_mid_generation_gets_its_request_aborted() {
    both_drivers(|legacy| {
        let sim = Sim::start(MODEL, &["--grpc", "--ttft-ms", "0", "--itl-ms", "40", "--output-tokens", "500"]);
        let gw = gateway(legacy, &[&sim], &[]);
        for stream in [true, false] {
            let before = sim.stats()["grpc"]["aborts"].as_u64().unwrap_or(0);
            let mut s = std::net::TcpStream::connect(("127.0.0.1", gw.port)).unwrap();
            use std::io::{Read, Write};
            let body = chat(&format!(r#","stream":{stream}"#));
            s.write_all(post_bytes("/v1/chat/completions", &body, &[]).as_bytes()).unwrap();
            if stream {
                // The first event arrived: generation is under way.
                let mut got = [0u8; 512];
                s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
                assert!(s.read(&mut got).unwrap() > 0);
            } else {
                assert!(wait_until(Duration::from_secs(10), || sim.stats()["grpc"]["in_flight"].as_u64() == Some(1)));
            }
            drop(s);
            let left = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64;
            assert!(
                wait_until(Duration::from_secs(5), || sim.stats()["grpc"]["aborts"].as_u64().unwrap_or(0) > before),
                "no Abort RPC (stream {stream}): {:?}",
                sim.stats()["grpc"]
            );
            let g = sim.stats()["grpc"].clone();
            let at = g["abort_unix_ms"].as_array().unwrap().iter().last().unwrap().as_u64().unwrap();
            assert!(at.saturating_sub(left) <= 100, "Abort {} ms after the client left (stream {stream})", at - left);
            assert!(g["abort_ids"]
                .as_array()
                .unwrap()
                .iter()
                .last()
                .unwrap()
                .as_str()
                .unwrap()
                .starts_with("chatcmpl-"));
        }
    });
}

#[test]
fn engine_errors_before_the_first_token_are_mapped_statuses() {
    both_drivers(|legacy| {
        let sim = Sim::start(MODEL, FAST);
        let gw = gateway(legacy, &[&sim], &["--disable-retries"]);
        let cases = [
            ("INVALID_ARGUMENT", 400),
            ("RESOURCE_EXHAUSTED", 429),
            ("UNAVAILABLE", 503),
            ("DEADLINE_EXCEEDED", 504),
            ("INTERNAL", 500),
        ];
        for (code, status) in cases {
            for stream in [false, true] {
                let extra = format!(r#","custom_params":{{"sim_error":"{code}"}},"stream":{stream}"#);
                let r = post(gw.port, "/v1/chat/completions", &chat(&extra), &[]);
                assert_eq!(r.status, status, "{code}: {}", r.text());
                assert_eq!(r.header("x-smg-error-code"), Some("start_generation_failed"));
                assert!(r.header("content-type").unwrap().starts_with("application/json"));
                assert_eq!(r.json()["error"]["code"].as_str(), Some("start_generation_failed"));
                assert!(r.header("x-smg-routed-worker-id").is_none());
            }
        }
        // An invalid argument is the request's fault: the worker stays routable.
        let ok = post(gw.port, "/v1/chat/completions", &chat(""), &[]);
        assert_eq!(ok.status, 200);
        // The contract's own refusals, before dispatch.
        let huge = "# ".repeat(17_000);
        let r = post(gw.port, "/v1/completions", &completion(&format!("\"{huge}\""), ""), &[]);
        assert_eq!(r.status, 400, "{}", r.text());
        assert_eq!(r.json()["error"]["code"].as_str(), Some("context_length_exceeded"));
        let image = r#"{"model":"sim-model","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"http://x/a.png"}}]}]}"#;
        let r = post(gw.port, "/v1/chat/completions", image, &[]);
        assert_eq!(
            (r.status, r.json()["error"]["code"].as_str().map(String::from)),
            (400, Some("multimodal_not_supported".into()))
        );
        let r = post(gw.port, "/v1/chat/completions", &chat(r#","modalities":["text","audio"]"#), &[]);
        assert_eq!(r.json()["error"]["code"].as_str(), Some("unsupported_output_modality"), "{}", r.text());
        let r = post(gw.port, "/v1/chat/completions", &chat(r#","return_audio":true"#), &[]);
        assert_eq!(r.json()["error"]["code"].as_str(), Some("audio_output_not_supported"), "{}", r.text());
    });
}

#[test]
fn a_retryable_engine_error_goes_to_another_worker() {
    both_drivers(|legacy| {
        let bad = Sim::start(MODEL, &["--grpc", "--fail-rate", "1", "--fail-status", "503"]);
        let good = Sim::start(MODEL, FAST);
        let gw = gateway(legacy, &[&bad, &good], &["--policy", "round_robin"]);
        for _ in 0..4 {
            let r = post(gw.port, "/v1/chat/completions", &chat(""), &[]);
            assert_eq!(r.status, 200, "{}", r.text());
            assert_eq!(r.header("x-smg-routed-worker-id"), Some(good.grpc_url().as_str()));
        }
    });
}

#[test]
fn a_mid_stream_failure_is_an_error_event_then_done() {
    both_drivers(|legacy| {
        let sim = Sim::start(
            MODEL,
            &[
                "--grpc",
                "--ttft-ms",
                "0",
                "--itl-ms",
                "0",
                "--output-tokens",
                "8",
                "--truncate-rate",
                "1",
                "--truncate-after-tokens",
                "3",
            ],
        );
        let gw = gateway(legacy, &[&sim], &[]);
        let r = post(gw.port, "/v1/chat/completions", &chat(r#","stream":true"#), &[]);
        assert_eq!(r.status, 200);
        let ev = events(&r);
        assert_eq!(ev.last().map(String::as_str), Some("[DONE]"));
        let err: sonic_rs::Value = sonic_rs::from_str(&ev[ev.len() - 2]).unwrap();
        assert!(err["error"]["message"].as_str().unwrap().starts_with("Stream error:"), "{err:?}");
        assert_eq!(err["error"]["type"].as_str(), Some("internal_error"));
        let chunks: Vec<sonic_rs::Value> = ev[..ev.len() - 2].iter().map(|e| sonic_rs::from_str(e).unwrap()).collect();
        let id = chunks[0]["id"].as_str().unwrap().to_string();
        assert_eq!(streamed(&chunks, true).0, [sim_text(&id, 0, 3)]);
        assert!(!r.text().contains("\"finish_reason\":\"error\""));
    });
}

#[test]
fn text_policies_route_grpc_requests_on_the_gateways_token_ids() {
    both_drivers(|legacy| {
        let a = Sim::start(MODEL, FAST);
        let b = Sim::start(MODEL, FAST);
        for policy in ["prefix_hash", "cache_aware"] {
            // Routing, not health, is under test: a health probe that a busy host delays past
            // its timeout would take a worker out and leave every prompt to the other.
            let gw = gateway(legacy, &[&a, &b], &["--policy", policy, "--disable-health-check"]);
            let routed = |body: &str, hint: Option<String>| {
                let h = hint.map(|t| format!("X-SMG-Routing-Tokens: {t}"));
                let headers: Vec<&str> = h.iter().map(String::as_str).collect();
                let r = post(gw.port, "/v1/chat/completions", body, &headers);
                assert_eq!(r.status, 200, "{}", r.text());
                r.header("x-smg-routed-worker-id").unwrap().to_string()
            };
            let prompt = |i: usize| {
                let text = format!("conversation {i}: {}", "the same long system prompt ".repeat(40));
                format!(r#"{{"model":"{MODEL}","messages":[{{"role":"user","content":"{text}"}}]}}"#)
            };
            // A routing hint is for HTTP workers: the prompt's own ids decide here.
            let first = routed(&prompt(0), None);
            for k in 0..5 {
                assert_eq!(routed(&prompt(0), Some(format!("{k},{},{}", k * 7 + 1, k * 13 + 2))), first, "{policy}");
            }
            if policy == "prefix_hash" {
                // 24 distinct heads on a ring of two workers: all on one by chance is 2 in 2^24.
                let seen: std::collections::HashSet<String> = (1..25).map(|i| routed(&prompt(i), None)).collect();
                assert_eq!(seen.len(), 2, "distinct prompts spread over both workers");
            }
        }
    });
}

/// `--request-timeout-secs` bounds a gRPC call as it bounds an HTTP exchange: an engine that
/// never answers is a 504 (start_generation_failed) and its stream is cancelled; one that goes
/// silent mid-stream past `--upstream-read-timeout-secs` ends the stream with the error event.
#[test]
fn timeouts_bound_a_grpc_call() {
    both_drivers(|legacy| {
        let sim = Sim::start(MODEL, &["--grpc", "--hang-rate", "1"]);
        let gw = gateway(legacy, &[&sim], &["--request-timeout-secs", "1", "--disable-retries"]);
        let started = std::time::Instant::now();
        let r = post(gw.port, "/v1/chat/completions", &chat(""), &[]);
        assert_eq!(r.status, 504, "{}", r.text());
        assert_eq!(r.header("x-smg-error-code"), Some("start_generation_failed"));
        assert!(started.elapsed() < patience(Duration::from_secs(5)), "took {:?}", started.elapsed());
        assert!(
            wait_until(Duration::from_secs(5), || sim.stats()["grpc"]["in_flight"].as_u64() == Some(0)),
            "the hung call was not cancelled: {:?}",
            sim.stats()["grpc"]
        );
        drop(gw);
        // Tokens every 3 s: the first arrives, the gap after it is past the 1 s read limit.
        let slow = Sim::start(MODEL, &["--grpc", "--ttft-ms", "0", "--itl-ms", "3000", "--output-tokens", "5"]);
        let gw = gateway(legacy, &[&slow], &["--upstream-read-timeout-secs", "1", "--disable-retries"]);
        let r = post(gw.port, "/v1/chat/completions", &chat(r#","stream":true"#), &[]);
        assert_eq!(r.status, 200);
        let evs = events(&r);
        assert_eq!(evs.last().map(String::as_str), Some("[DONE]"), "{evs:?}");
        assert!(evs.iter().any(|e| e.contains("\"error\"")), "no error event: {evs:?}");
    });
}

/// The admin `/flush_cache` fan-out reaches a gRPC worker through the scheduler API's
/// FlushCache (not an HTTP POST it cannot answer).
#[test]
fn admin_fan_outs_reach_grpc_workers_over_grpc() {
    both_drivers(|legacy| {
        let sim = Sim::start(MODEL, FAST);
        let gw = gateway(legacy, &[&sim], &[]);
        let before = sim.stats()["grpc"]["rpcs"]["FlushCache"].as_u64().unwrap_or(0);
        let r = post(gw.port, "/flush_cache", "", &[]);
        assert_eq!(r.status, 200, "{}", r.text());
        let v = r.json();
        assert_eq!(v["successful"].as_array().map(|a| a.len()), Some(1), "{}", r.text());
        assert_eq!(v["failed"].as_array().map(|a| a.len()), Some(0), "{}", r.text());
        assert_eq!(sim.stats()["grpc"]["rpcs"]["FlushCache"].as_u64(), Some(before + 1));
        assert_eq!((v["grpc_workers"].as_u64(), v["http_workers"].as_u64()), (Some(1), Some(0)), "{v:?}");
        // /get_loads asks GetLoads and shows it in SGLang's /v1/loads shape.
        let before = sim.stats()["grpc"]["rpcs"]["GetLoads"].as_u64().unwrap_or(0);
        let v = get(gw.port, "/get_loads").json();
        let l = &v["loads"][0];
        assert_eq!(l["worker"].as_str(), Some(sim.grpc_url().as_str()), "{v:?}");
        assert_eq!(l["load"].as_i64(), Some(0), "an idle engine: {v:?}");
        assert_eq!(l["details"]["loads"][0]["num_used_tokens"].as_i64(), Some(0), "{v:?}");
        assert!(l["details"]["loads"][0]["max_total_num_tokens"].as_i64().unwrap() > 0, "{v:?}");
        assert_eq!((v["successful"].as_u64(), v["failed"].as_u64()), (Some(1), Some(0)));
        assert!(sim.stats()["grpc"]["rpcs"]["GetLoads"].as_u64().unwrap() > before);
        // SMG's gRPC router has no server/model-info pass-through: 501, as there.
        for (path, text) in
            [("/get_server_info", "Server info not implemented"), ("/get_model_info", "Get model info not implemented")]
        {
            let r = get(gw.port, path);
            assert_eq!((r.status, r.text().as_str()), (501, text), "{path}");
        }
    });
}

#[test]
fn the_thinking_decision_reaches_the_template_in_the_contracts_order() {
    // A template with a toggle (on by default) and one effort level of its own ('max'); the
    // simulator answers with the prompt it got, so the reply is what the template rendered.
    let template = "think={{ enable_thinking | default('default') }} effort={{ reasoning_effort | default('-') }}{% if reasoning_effort == 'max' %} deep{% endif %}";
    let dir = tokenizer_dir_with_template(template);
    both_drivers(|legacy| {
        let sim = Sim::start(MODEL, FAST);
        let gw = gateway(legacy, &[&sim], &["--tokenizer-path", dir.to_str().unwrap()]);
        let cases = [
            // Nothing asked: the template's default stands (nothing written).
            ("", "think=default effort=-", true),
            // 4. The effective effort: none turns thinking off.
            (r#","reasoning_effort":"none""#, "think=False effort=none", false),
            // 2. A native level turns it on.
            (r#","reasoning_effort":"max""#, "think=True effort=max deep", true),
            // 2 before 4: the template's level from chat_template_kwargs wins over the request's.
            (
                r#","reasoning_effort":"none","chat_template_kwargs":{"reasoning_effort":"max"}"#,
                "think=True effort=max deep",
                true,
            ),
            // A level the template does not know says nothing: the default stands.
            (r#","reasoning_effort":"high""#, "think=default effort=high", true),
            // 3. thinking.type, under a level the template does not know; adaptive says nothing.
            (r#","reasoning_effort":"high","thinking":{"type":"disabled"}"#, "think=False effort=high", false),
            (r#","thinking":{"type":"adaptive","effort":"max"}"#, "think=True effort=max deep", true),
            (r#","thinking":{"type":"enabled"}"#, "think=True effort=-", true),
            // 1. An explicit toggle beats every other rule.
            (
                r#","reasoning_effort":"max","chat_template_kwargs":{"enable_thinking":false}"#,
                "think=False effort=max deep",
                false,
            ),
        ];
        for (extra, want, reasons) in cases {
            let body = chat(&format!(r#"{extra},"custom_params":{{"sim_echo_prompt":true}}"#));
            let r = post(gw.port, "/v1/chat/completions", &body, &[]);
            assert_eq!(r.status, 200, "{extra}: {}", r.text());
            assert_eq!(r.json()["choices"][0]["message"]["content"].as_str(), Some(want), "{extra}");
            let last = sim.stats()["grpc"]["last_generate"].clone();
            assert_eq!(last["require_reasoning"].as_bool(), Some(reasons), "{extra}: {last:?}");
        }
    });
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn logprobs_come_back_per_token_in_both_openai_shapes() {
    use smg_loadtest::sim::grpc::generate::{alternative_at, logprob_at};
    let f32_of = |v: &sonic_rs::Value| v.as_f64().unwrap() as f32;
    both_drivers(|legacy| {
        let sim = Sim::start(MODEL, FAST);
        let gw = gateway(legacy, &[&sim], &[]);
        // Chat: 5 words (the stop token is not output), each with 2 alternatives.
        let check_chat = |rid: &str, content: &[sonic_rs::Value], words: u32| {
            assert_eq!(content.len(), words as usize, "{content:?}");
            let seed = seed_of(rid);
            for (k, e) in content.iter().enumerate() {
                let k = k as u32;
                let tok = token_at(seed, 0, k);
                let text = token_text(tok);
                assert_eq!(e["token"].as_str(), Some(text.as_str()));
                assert_eq!(f32_of(&e["logprob"]), logprob_at(seed, 0, k));
                let bytes: Vec<u64> = e["bytes"].as_array().unwrap().iter().map(|b| b.as_u64().unwrap()).collect();
                assert_eq!(bytes, text.bytes().map(u64::from).collect::<Vec<_>>());
                let top = e["top_logprobs"].as_array().unwrap();
                assert_eq!(top.len(), 2, "{e:?}");
                assert_eq!(top[0]["token"].as_str(), Some(text.as_str()));
                let (alt, lp) = alternative_at(seed, 0, k, tok, 1);
                assert_eq!(top[1]["token"].as_str(), Some(token_text(alt).as_str()));
                assert_eq!(f32_of(&top[1]["logprob"]), lp);
            }
        };
        let r = post(gw.port, "/v1/chat/completions", &chat(r#","logprobs":true,"top_logprobs":2"#), &[]);
        assert_eq!(r.status, 200, "{}", r.text());
        let v = r.json();
        let last = sim.stats()["grpc"]["last_generate"].clone();
        assert_eq!(last["return_logprob"].as_bool(), Some(true));
        assert_eq!(last["top_logprobs_num"].as_i64(), Some(2));
        let rid = v["id"].as_str().unwrap().to_string();
        check_chat(&rid, v["choices"][0]["logprobs"]["content"].as_array().unwrap(), 5);
        // Without logprobs: null, and the engine is not asked.
        let v = post(gw.port, "/v1/chat/completions", &chat(""), &[]).json();
        assert!(v["choices"][0]["logprobs"].is_null(), "{v:?}");
        assert_eq!(sim.stats()["grpc"]["last_generate"]["return_logprob"].as_bool(), Some(false));
        // Streaming: each chunk carries its tokens' entries.
        let r = post(gw.port, "/v1/chat/completions", &chat(r#","logprobs":true,"top_logprobs":2,"stream":true"#), &[]);
        let evs = json_events(&r);
        let rid = evs[0]["id"].as_str().unwrap().to_string();
        let content: Vec<sonic_rs::Value> = evs
            .iter()
            .flat_map(|e| e["choices"].as_array().unwrap().iter().cloned().collect::<Vec<_>>())
            .filter_map(|c| c["logprobs"]["content"].as_array().cloned())
            .flat_map(|a| a.iter().cloned().collect::<Vec<_>>())
            .collect();
        check_chat(&rid, &content, 5);
        // A stop string: entries for the tokens up to the one that completed it, no further.
        let body = chat(r#","logprobs":true,"stop":["c"],"custom_params":{"sim_output":"ab cd"}"#);
        let v = post(gw.port, "/v1/chat/completions", &body, &[]).json();
        assert_eq!(v["choices"][0]["message"]["content"].as_str(), Some("ab "), "{v:?}");
        let content = v["choices"][0]["logprobs"]["content"].as_array().unwrap();
        let tokens: Vec<&str> = content.iter().map(|e| e["token"].as_str().unwrap()).collect();
        assert_eq!(tokens, ["a", "b", " ", "c"]);
        assert!(content.iter().all(|e| e["top_logprobs"].as_array().unwrap().is_empty()));
        // Completions: the legacy shape, text_offset in characters of the completion text.
        let check_legacy = |rid: &str, lp: &sonic_rs::Value, text: &str| {
            let seed = seed_of(rid);
            let tokens: Vec<String> =
                lp["tokens"].as_array().unwrap().iter().map(|t| t.as_str().unwrap().to_string()).collect();
            assert_eq!(tokens.concat(), text);
            assert_eq!(tokens.len(), 5);
            let mut at = 0u64;
            for k in 0..5u32 {
                let tok = token_at(seed, 0, k);
                assert_eq!(tokens[k as usize], token_text(tok));
                assert_eq!(f32_of(&lp["token_logprobs"][k as usize]), logprob_at(seed, 0, k));
                let top = lp["top_logprobs"][k as usize].as_object().unwrap();
                assert_eq!(top.len(), 2, "{lp:?}");
                let (alt, alt_lp) = alternative_at(seed, 0, k, tok, 1);
                assert_eq!(f32_of(top.get(&token_text(alt)).unwrap()), alt_lp);
                assert_eq!(lp["text_offset"][k as usize].as_u64(), Some(at));
                at += token_text(tok).chars().count() as u64;
            }
        };
        let r = post(gw.port, "/v1/completions", &completion("\"Once\"", r#","logprobs":2"#), &[]);
        assert_eq!(r.status, 200, "{}", r.text());
        let v = r.json();
        let rid = v["id"].as_str().unwrap().to_string();
        check_legacy(&rid, &v["choices"][0]["logprobs"], v["choices"][0]["text"].as_str().unwrap());
        let r = post(gw.port, "/v1/completions", &completion("\"Once\"", r#","logprobs":2,"stream":true"#), &[]);
        let evs = json_events(&r);
        let rid = evs[0]["id"].as_str().unwrap().to_string();
        // The chunks' arrays laid end to end: one legacy object for the whole stream.
        let keys = ["tokens", "token_logprobs", "top_logprobs", "text_offset"];
        let mut merged: Vec<Vec<String>> = vec![Vec::new(); keys.len()];
        let mut text = String::new();
        for e in &evs {
            let c = &e["choices"][0];
            text.push_str(c["text"].as_str().unwrap_or(""));
            if c["logprobs"].is_null() {
                continue;
            }
            for (k, key) in keys.iter().enumerate() {
                merged[k].extend(c["logprobs"][*key].as_array().unwrap().iter().map(|v| v.to_string()));
            }
        }
        let fields: Vec<String> =
            keys.iter().zip(&merged).map(|(k, vals)| format!("\"{k}\":[{}]", vals.join(","))).collect();
        let whole: sonic_rs::Value = sonic_rs::from_str(&format!("{{{}}}", fields.join(","))).unwrap();
        check_legacy(&rid, &whole, &text);
    });
}

#[test]
fn deepseek_v4_streams_usage_on_its_finish_chunk() {
    const DS: &str = "deepseek-ai/DeepSeek-V4-Flash";
    both_drivers(|legacy| {
        let sim = Sim::start(DS, FAST);
        let gw = gateway(legacy, &[&sim], &[]);
        let body = |extra: &str| {
            format!(r#"{{"model":"{DS}","messages":[{{"role":"user","content":"Hi"}}],"stream":true{extra}}}"#)
        };
        let usage_members = |evs: &[sonic_rs::Value]| -> Vec<Option<bool>> {
            // Per chunk: None (no member), Some(false) null, Some(true) an object.
            evs.iter().map(|e| e.get("usage").map(|u| !u.is_null())).collect()
        };
        for extra in ["", r#","stream_options":{"include_usage":true,"continuous_usage_stats":true}"#] {
            let r = post(gw.port, "/v1/chat/completions", &body(extra), &[]);
            assert_eq!(r.status, 200, "{}", r.text());
            let evs = json_events(&r);
            // No usage-only chunk: every chunk has its choice.
            assert!(evs.iter().all(|e| e["choices"].as_array().unwrap().len() == 1), "{extra}: {evs:?}");
            let last = evs.last().unwrap();
            assert_eq!(last["choices"][0]["finish_reason"].as_str(), Some("stop"));
            let u = &last["usage"];
            assert_eq!(u["completion_tokens"].as_u64(), Some(6), "{extra}: {last:?}");
            assert_eq!(u["total_tokens"].as_u64(), Some(u["prompt_tokens"].as_u64().unwrap() + 6));
            let members = usage_members(&evs[..evs.len() - 1]);
            let before = if extra.is_empty() { None } else { Some(false) };
            assert!(members.iter().all(|m| *m == before), "{extra}: {members:?}");
        }
        // n = 2: only the last choice's finish chunk carries the aggregate.
        let r = post(gw.port, "/v1/chat/completions", &body(r#","n":2"#), &[]);
        let evs = json_events(&r);
        let with_usage: Vec<&sonic_rs::Value> = evs.iter().filter(|e| e.get("usage").is_some()).collect();
        assert_eq!(with_usage.len(), 1, "{evs:?}");
        assert_eq!(with_usage[0]["usage"]["completion_tokens"].as_u64(), Some(12));
        assert!(with_usage[0]["choices"][0]["finish_reason"].is_str());
        // Another profile on the same path keeps the OpenAI format.
        let sim2 = Sim::start(MODEL, FAST);
        let gw2 = gateway(legacy, &[&sim2], &[]);
        let r = post(
            gw2.port,
            "/v1/chat/completions",
            &chat(r#","stream":true,"stream_options":{"include_usage":true}"#),
            &[],
        );
        let evs = json_events(&r);
        let last = evs.last().unwrap();
        assert!(last["choices"].as_array().unwrap().is_empty() && last["usage"].is_object(), "{last:?}");
        assert!(evs[..evs.len() - 1].iter().all(|e| e.get("usage").is_none()));
    });
}

#[test]
fn completions_echo_the_prompt_and_append_the_suffix() {
    both_drivers(|legacy| {
        let sim = Sim::start(MODEL, FAST);
        let gw = gateway(legacy, &[&sim], &[]);
        let extra = r#","echo":true,"suffix":" END""#;
        let v = post(gw.port, "/v1/completions", &completion("\"Once upon\"", extra), &[]).json();
        let rid = v["id"].as_str().unwrap().to_string();
        let want = format!("Once upon{} END", sim_text(&rid, 0, 5));
        assert_eq!(v["choices"][0]["text"].as_str(), Some(want.as_str()), "{v:?}");
        let r =
            post(gw.port, "/v1/completions", &completion("\"Once upon\"", &format!("{extra},\"stream\":true")), &[]);
        let evs = json_events(&r);
        let rid = evs[0]["id"].as_str().unwrap().to_string();
        let (text, fin) = streamed(&evs, false);
        assert_eq!(text[0], format!("Once upon{} END", sim_text(&rid, 0, 5)));
        assert_eq!(fin[0].as_deref(), Some("stop"));
        assert!(evs[0]["choices"][0]["text"].as_str().unwrap().starts_with("Once upon"), "echo leads: {evs:?}");
        // A token-id prompt is echoed as its text; two prompts each echo their own.
        use smg_loadtest::sim::tokenizer::word;
        let ids = [word(3, false), word(7, true)];
        let prompt_text: String = ids.iter().map(|&t| token_text(t)).collect();
        let v = post(
            gw.port,
            "/v1/completions",
            &completion(&format!("[{},{}]", ids[0], ids[1]), r#","echo":true,"max_tokens":1"#),
            &[],
        )
        .json();
        assert!(v["choices"][0]["text"].as_str().unwrap().starts_with(&prompt_text), "{prompt_text:?}: {v:?}");
        let v = post(
            gw.port,
            "/v1/completions",
            &completion(r#"["alpha", "beta"]"#, r#","echo":true,"max_tokens":1"#),
            &[],
        )
        .json();
        let texts: Vec<&str> = v["choices"].as_array().unwrap().iter().map(|c| c["text"].as_str().unwrap()).collect();
        assert!(texts[0].starts_with("alpha") && texts[1].starts_with("beta"), "{texts:?}");
        // Without echo and suffix: the generated text alone.
        let v = post(gw.port, "/v1/completions", &completion("\"Once upon\"", ""), &[]).json();
        let rid = v["id"].as_str().unwrap().to_string();
        assert_eq!(v["choices"][0]["text"].as_str(), Some(sim_text(&rid, 0, 5).as_str()));
    });
}

#[test]
fn dp_aware_grpc_workers_route_ranks_and_name_the_rank_in_each_call() {
    both_drivers(|legacy| {
        let mut args = FAST.to_vec();
        args.extend_from_slice(&["--dp-size", "2"]);
        let sim = Sim::start(MODEL, &args);
        let urls = sim.grpc_url();
        let gw = Gateway::start(
            legacy,
            &["--worker-urls", &urls, "--dp-aware", "--policy", "round_robin", "--health-check-interval-secs", "1"],
        );
        gw.ready_workers(2);
        let mut seen = std::collections::BTreeSet::new();
        for i in 0..10 {
            let extra = if i % 2 == 0 { "" } else { r#","stream":true"# };
            let r = post(gw.port, "/v1/chat/completions", &chat(extra), &[]);
            assert_eq!(r.status, 200, "{}", r.text());
            seen.insert(r.header("x-smg-routed-worker-id").unwrap().to_string());
        }
        let want: std::collections::BTreeSet<_> = [format!("{urls}@0"), format!("{urls}@1")].into();
        assert_eq!(seen, want);
        let st = sim.stats();
        let ranks: Vec<u64> = st["dp_rank_requests"].as_array().unwrap().iter().map(|c| c.as_u64().unwrap()).collect();
        assert_eq!(ranks, [5, 5], "each call named its rank: {st:?}");
        let list = get(gw.port, "/workers").json();
        assert_eq!(list["total"].as_u64(), Some(2));
        assert_eq!(list["workers"][1]["connection_mode"].as_str(), Some("grpc"));
    });
}

#[test]
fn speculative_decoding_counts_reach_usage_when_the_engine_drafted() {
    both_drivers(|legacy| {
        let sim = Sim::start(MODEL, FAST);
        let gw = gateway(legacy, &[&sim], &[]);
        let spec = r#","n":2,"custom_params":{"sim_spec_draft":10,"sim_spec_accepted":7}"#;
        let v = post(gw.port, "/v1/chat/completions", &chat(spec), &[]).json();
        let d = &v["usage"]["completion_tokens_details"];
        assert_eq!(d["accepted_prediction_tokens"].as_u64(), Some(14), "two choices summed: {v:?}");
        assert_eq!(d["rejected_prediction_tokens"].as_u64(), Some(6));
        let r = post(
            gw.port,
            "/v1/chat/completions",
            &chat(&format!(r#"{spec},"stream":true,"stream_options":{{"include_usage":true}}"#)),
            &[],
        );
        let evs = json_events(&r);
        let u = &evs.last().unwrap()["usage"];
        assert_eq!(u["completion_tokens_details"]["rejected_prediction_tokens"].as_u64(), Some(6), "{u:?}");
        // No drafts: no speculative fields (and no details at all without reasoning tokens).
        let v = post(gw.port, "/v1/chat/completions", &chat(""), &[]).json();
        assert!(v["usage"].get("completion_tokens_details").is_none(), "{v:?}");
    });
}

/// `field` of /proc/<pid>/status (`VmRSS:`, `VmHWM:`), in KiB.
fn status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with(field)).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[test]
fn an_engine_message_over_the_limit_fails_the_call_before_it_is_buffered() {
    both_drivers(|legacy| {
        let sim = Sim::start(MODEL, FAST);
        let gw = gateway(legacy, &[&sim], &["--grpc-max-message-size", "8388608", "--disable-retries"]);
        assert_eq!(post(gw.port, "/v1/chat/completions", &chat(""), &[]).status, 200);
        let base = status_kib(gw.pid(), "VmRSS:");
        // 6M token ids of 4 bytes: a 24 MB message, three times the limit.
        for stream in [false, true] {
            let extra = format!(r#","custom_params":{{"sim_huge_tokens":6000000}},"stream":{stream}"#);
            let r = post(gw.port, "/v1/chat/completions", &chat(&extra), &[]);
            assert_eq!(r.status, 502, "{}", r.text());
            assert_eq!(r.header("x-smg-error-code"), Some("upstream_response_too_large"));
            let msg = r.json()["error"]["message"].as_str().unwrap_or("").to_string();
            assert!(msg.contains("--grpc-max-message-size") && msg.contains("the limit is 8388608"), "{msg}");
            // The same worker, on the same connection, serves the next request.
            assert_eq!(post(gw.port, "/v1/chat/completions", &chat(""), &[]).status, 200);
        }
        let peak = status_kib(gw.pid(), "VmHWM:").saturating_sub(base);
        println!("24 MB engine message ({}): peak RSS +{peak} KiB", if legacy { "epoll" } else { "io_uring" });
        assert!(peak < 12 << 10, "peak RSS grew {peak} KiB with a 24 MB message refused");
    });
}

/// The gRPC path parses the client's body whole (sonic-rs, by recursion): at the contract's
/// depth limit it is answered, on the stack the shards get; past it, a 400 before any parse.
#[test]
fn bodies_at_the_depth_limit_are_answered_and_deeper_ones_refused() {
    both_drivers(|legacy| {
        let sim = Sim::start(MODEL, &["--grpc"]);
        let mut gw = gateway(legacy, &[&sim], &[]);
        let nested = |levels: usize| chat(&format!(r#","metadata_deep":{}{}"#, "[".repeat(levels), "]".repeat(levels)));
        let r = post(gw.port, "/v1/chat/completions", &nested(127), &[]);
        assert_eq!(r.status, 200, "{}", r.text());
        let r = post(gw.port, "/v1/chat/completions", &nested(100_000), &[]);
        assert_eq!(r.status, 400, "{}", r.text());
        assert_eq!(r.json()["error"]["code"].as_str(), Some("json_parse_error"));
        assert!(gw.alive());
    });
}

/// A chat body over `--max-buffered-request-bytes` is read whole for a gRPC worker (it is
/// rendered and tokenized), never streamed to it as HTTP/1.1: that answered 502 and counted
/// against the worker's breaker, so a few such requests opened it for everyone.
#[test]
fn a_large_body_for_a_grpc_worker_is_read_not_streamed() {
    both_drivers(|legacy| {
        let sim = Sim::start(MODEL, &["--grpc"]);
        let args = ["--policy", "round_robin", "--max-buffered-request-bytes", "65536", "--cb-failure-threshold", "2"];
        let gw = gateway(legacy, &[&sim], &args);
        let big = chat(&format!(r#","user":"{}""#, "x".repeat(200_000)));
        let generates = || sim.stats()["grpc"]["rpcs"]["Generate"].as_u64().unwrap_or(0);
        let before = generates();
        for _ in 0..3 {
            let r = post(gw.port, "/v1/chat/completions", &big, &[]);
            assert_eq!(r.status, 200, "{}", r.text());
        }
        let r = post(gw.port, "/v1/chat/completions", &chat(""), &[]);
        assert_eq!(r.status, 200, "the worker's breaker stayed closed: {}", r.text());
        assert_eq!(generates(), before + 4, "every request reached the engine as a Generate call");
        // 1.2 MB whose prompt is longer than the model's context: refused before dispatch.
        let long =
            format!(r#"{{"model":"{MODEL}","messages":[{{"role":"user","content":"{}"}}]}}"#, "# ".repeat(600_000));
        // Tokenizing 1.2 MB takes a debug build seconds, many more on a loaded 2-core host; the
        // wrong behaviour this guards against is no answer at all.
        let r = support::post_within(gw.port, "/v1/chat/completions", &long, &[], Duration::from_secs(90));
        assert_eq!(r.status, 400, "{}", &r.text()[..r.text().len().min(300)]);
        assert_eq!(r.json()["error"]["code"].as_str(), Some("context_length_exceeded"));
        assert_eq!(generates(), before + 4, "nothing reached the engine");
    });
}

/// One model on an HTTP and a gRPC worker, clients sending non-streamed chats; the `victim`
/// is killed under load once `after` requests are answered. Every request is answered 200
/// (a failure before any byte reached the client is retried on the other worker, whatever
/// its protocol), and every request sent after the kill by the survivor.
fn fails_over_across_protocols(legacy: bool, kill_grpc: bool) {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Arc;
    let http = Sim::start(MODEL, &["--ttft-ms", "0", "--itl-ms", "5", "--output-tokens", "6"]);
    let grpc = Sim::start(MODEL, &["--grpc", "--ttft-ms", "0", "--itl-ms", "5", "--output-tokens", "6"]);
    let (http_url, grpc_url) = (http.url(), grpc.grpc_url());
    let args = [
        "--worker-urls",
        &http_url,
        &grpc_url,
        "--cores",
        "2",
        "--policy",
        "round_robin",
        "--health-check-interval-secs",
        "1",
    ];
    let gw = Gateway::start(legacy, &args);
    gw.ready_workers(2);
    let (victim, survivor_url) = if kill_grpc { (&grpc, http_url.clone()) } else { (&http, grpc_url.clone()) };
    let answered = Arc::new(AtomicUsize::new(0));
    let killed = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..4)
        .map(|_| {
            let (port, answered, killed) = (gw.port, Arc::clone(&answered), Arc::clone(&killed));
            std::thread::spawn(move || {
                // Until 10 requests went out after the kill (at most 400 in all).
                let mut out = Vec::new();
                while out.len() < 400 && out.iter().filter(|(after, _)| *after).count() < 10 {
                    let after_kill = killed.load(Ordering::SeqCst);
                    let r = post(port, "/v1/chat/completions", &chat(""), &[]);
                    answered.fetch_add(1, Ordering::SeqCst);
                    out.push((after_kill, r));
                }
                out
            })
        })
        .collect();
    assert!(wait_until(patience(Duration::from_secs(10)), || answered.load(Ordering::SeqCst) >= 8));
    victim.die();
    killed.store(true, Ordering::SeqCst);
    let mut after = 0;
    for c in clients {
        for (after_kill, r) in c.join().unwrap() {
            assert_eq!(r.status, 200, "kill_grpc={kill_grpc}: {}", r.text());
            assert!(r.json()["choices"][0]["message"]["content"].as_str().is_some_and(|t| !t.is_empty()));
            if after_kill {
                after += 1;
                assert_eq!(r.header("x-smg-routed-worker-id"), Some(survivor_url.as_str()), "sent after the kill");
            }
        }
    }
    assert!(after >= 40, "only {after} requests were sent after the kill");
}

#[test]
fn a_model_on_grpc_and_http_workers_fails_over_from_grpc_to_http() {
    both_drivers(|legacy| fails_over_across_protocols(legacy, true));
}

#[test]
fn a_model_on_grpc_and_http_workers_fails_over_from_http_to_grpc() {
    both_drivers(|legacy| fails_over_across_protocols(legacy, false));
}

/// Routes gRPC workers do not take (embeddings of a generation model, say) go to a model's
/// HTTP workers; a model with gRPC workers only answers the contract's code for the
/// route, never a 501 of the gateway's own.
#[test]
fn routes_grpc_workers_do_not_take_go_to_http_workers_or_answer_the_contracts_code() {
    both_drivers(|legacy| {
        let http = Sim::start(MODEL, &["--ttft-ms", "0", "--itl-ms", "0", "--output-tokens", "3"]);
        let grpc = Sim::start(MODEL, FAST);
        let only = Sim::start("grpc-only-model", FAST);
        let (h, g, o) = (http.url(), grpc.grpc_url(), only.grpc_url());
        let args = ["--worker-urls", &h, &g, &o, "--cores", "2", "--policy", "round_robin"];
        let gw = Gateway::start(legacy, &args);
        gw.ready_workers(3);
        // A generation model's gRPC workers do not embed.
        let embed = format!(r#"{{"model":"{MODEL}","input":"hello"}}"#);
        for _ in 0..6 {
            let r = post(gw.port, "/v1/embeddings", &embed, &[]);
            assert_eq!(r.status, 200, "{}", r.text());
            assert_eq!(r.header("x-smg-routed-worker-id"), Some(http.url().as_str()));
        }
        // Chat still goes round both.
        let seen: std::collections::HashSet<String> = (0..4)
            .map(|_| post(gw.port, "/v1/chat/completions", &chat(""), &[]))
            .map(|r| r.header("x-smg-routed-worker-id").unwrap().to_string())
            .collect();
        assert_eq!(seen.len(), 2, "{seen:?}");
        let only_embed = r#"{"model":"grpc-only-model","input":"hello"}"#;
        let r = post(gw.port, "/v1/embeddings", only_embed, &[]);
        assert_eq!(r.status, 503, "{}", r.text());
        assert_eq!(r.json()["error"]["code"].as_str(), Some("no_available_workers"));
        // Decisions are scored through a gRPC worker's engine (tests/decisions.rs has the rest).
        let decide =
            r#"{"model":"grpc-only-model","input":"x","questions":[{"type":"predicate","instructions":"Is it?"}]}"#;
        let r = post(gw.port, "/v1/decisions", decide, &[]);
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.header("x-smg-routed-worker-id"), Some(only.grpc_url().as_str()));
        let form = "--b\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\ngrpc-only-model\r\n--b\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\nContent-Type: audio/wav\r\n\r\nRIFF\r\n--b--\r\n";
        let mut sock = std::net::TcpStream::connect(("127.0.0.1", gw.port)).unwrap();
        let head = format!(
            "POST /v1/audio/transcriptions HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; boundary=b\r\nContent-Length: {}\r\n\r\n{form}",
            form.len()
        );
        std::io::Write::write_all(&mut sock, head.as_bytes()).unwrap();
        let r = read_response(&mut sock, &mut Vec::new(), false).unwrap();
        assert_eq!(r.status, 400, "{}", r.text());
        assert_eq!(r.json()["error"]["code"].as_str(), Some("audio_transcription_model_not_supported"));
    });
}

/// An embedding model's gRPC workers (`is_generation: false`) serve `/v1/embeddings` through
/// the Embed RPC, one call per input: the vectors come back in input order, as floats or
/// base64, truncated to `dimensions`; a generation model's gRPC workers do not embed.
#[test]
fn an_embedding_models_grpc_workers_embed_each_input_in_order() {
    use smg_loadtest::sim::grpc::embed::vector;
    both_drivers(|legacy| {
        let emb = Sim::start("embed-model", &["--grpc", "--is-embedding", "--embedding-dim", "8"]);
        let gen = Sim::start("gen-model", FAST);
        let gw = support::sim::grpc_gateway(legacy, &[&emb, &gen], &[]);
        let r = post(gw.port, "/v1/embeddings", r#"{"model":"embed-model","input":[[5,6,7],[8,9]]}"#, &[]);
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.header("x-smg-routed-worker-id"), Some(emb.grpc_url().as_str()));
        let v = r.json();
        assert_eq!(v["object"].as_str(), Some("list"));
        assert_eq!(v["model"].as_str(), Some("embed-model"));
        let data = v["data"].as_array().unwrap();
        assert_eq!(data.len(), 2);
        for (i, ids) in [&[5u32, 6, 7][..], &[8, 9]].iter().enumerate() {
            assert_eq!(data[i]["index"].as_u64(), Some(i as u64));
            let got: Vec<f32> =
                data[i]["embedding"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect();
            assert_eq!(got, vector(ids, 8), "input {i}: the engine's vector, in input order");
        }
        assert_eq!(v["usage"]["prompt_tokens"].as_u64(), Some(5));
        assert_eq!(v["usage"]["total_tokens"].as_u64(), Some(5));
        // Text is tokenized by the gateway; base64 is the little-endian f32s; dimensions truncate.
        let r = post(
            gw.port,
            "/v1/embeddings",
            r#"{"model":"embed-model","input":"hello world","encoding_format":"base64","dimensions":4}"#,
            &[],
        );
        assert_eq!(r.status, 200, "{}", r.text());
        let b64 = r.json()["data"][0]["embedding"].as_str().unwrap().to_string();
        assert_eq!(b64.len(), 24, "4 floats: 16 bytes of base64 ({b64})");
        assert!(r.json()["usage"]["prompt_tokens"].as_u64().unwrap() >= 2, "{}", r.text());
        let r = post(gw.port, "/v1/embeddings", r#"{"model":"embed-model","input":[]}"#, &[]);
        assert_eq!(r.status, 400, "{}", r.text());
        let r = post(gw.port, "/v1/embeddings", r#"{"model":"embed-model","input":"x","dimensions":9}"#, &[]);
        assert_eq!(r.status, 400, "more dimensions than the model has: {}", r.text());
        // A generation model's gRPC workers do not embed: the contract's code, not a 501.
        let r = post(gw.port, "/v1/embeddings", r#"{"model":"gen-model","input":"x"}"#, &[]);
        assert_eq!(r.status, 503, "{}", r.text());
        assert_eq!(r.json()["error"]["code"].as_str(), Some("no_available_workers"));
        assert_eq!(gen.served(), 0);
    });
}

/// SGLang's native `/generate` on gRPC workers: `text` or `input_ids` (batched too), SGLang's
/// `sampling_params`, and SGLang's answer shape (`text`, `output_ids`, `meta_info` with its
/// finish reason, counts and log-probability triples); streamed, each event carries the
/// sample's whole text so far and its new ids.
#[test]
fn generate_speaks_sglangs_native_shape_on_grpc_workers() {
    use smg_loadtest::sim::tokenizer::{token_text, IM_END_ID};
    let text_of = |ids: &sonic_rs::Value| -> String {
        ids.as_array().unwrap().iter().map(|i| token_text(i.as_u64().unwrap() as u32)).collect()
    };
    both_drivers(|legacy| {
        let sim = Sim::start(MODEL, FAST);
        let gw = support::sim::grpc_gateway(legacy, &[&sim], &[]);
        let r = post(
            gw.port,
            "/generate",
            r#"{"text":"hello","sampling_params":{"max_new_tokens":4,"temperature":0}}"#,
            &[],
        );
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.header("x-smg-routed-worker-id"), Some(sim.grpc_url().as_str()));
        let v = r.json();
        assert_eq!(v["output_ids"].as_array().unwrap().len(), 4);
        assert_eq!(v["text"].as_str(), Some(text_of(&v["output_ids"]).as_str()), "the ids, decoded");
        let m = &v["meta_info"];
        assert!(m["id"].as_str().unwrap().starts_with("gnt-"), "{m:?}");
        assert_eq!(
            (m["finish_reason"]["type"].as_str(), m["finish_reason"]["length"].as_u64()),
            (Some("length"), Some(4))
        );
        assert_eq!(m["completion_tokens"].as_u64(), Some(4));
        assert!(m["prompt_tokens"].as_u64().unwrap() > 0);
        let last = &sim.stats()["grpc"]["last_generate"];
        assert_eq!((last["max_new_tokens"].as_u64(), last["temperature"].as_f64()), (Some(4), Some(0.0)), "{last:?}");

        // The model's own end: a stop, naming the token the engine matched.
        let r = post(gw.port, "/generate", r#"{"input_ids":[5,6,7]}"#, &[]);
        assert_eq!(r.status, 200, "{}", r.text());
        let f = &r.json()["meta_info"]["finish_reason"];
        assert_eq!((f["type"].as_str(), f["matched"].as_u64()), (Some("stop"), Some(u64::from(IM_END_ID))), "{f:?}");

        // A batch of two prompts, two samples each: four objects in order, named by index.
        let r = post(
            gw.port,
            "/generate",
            r#"{"input_ids":[[5,6],[7,8]],"sampling_params":{"max_new_tokens":2,"n":2}}"#,
            &[],
        );
        assert_eq!(r.status, 200, "{}", r.text());
        let all = r.json();
        let all = all.as_array().expect("an array for several samples");
        assert_eq!(all.len(), 4);
        for (i, s) in all.iter().enumerate() {
            assert!(s["meta_info"]["id"].as_str().unwrap().ends_with(&format!("-{i}")), "{s:?}");
            assert_eq!(s["meta_info"]["prompt_tokens"].as_u64(), Some(2));
        }

        // Log-probabilities: one [logprob, id, null] per output token, with alternatives; the
        // prompt's from logprob_start_len, as the engine gives them.
        let r = post(
            gw.port,
            "/generate",
            r#"{"input_ids":[5,6,7],"return_logprob":true,"logprob_start_len":0,"top_logprobs_num":2,"sampling_params":{"max_new_tokens":3}}"#,
            &[],
        );
        assert_eq!(r.status, 200, "{}", r.text());
        let v = r.json();
        let lp = v["meta_info"]["output_token_logprobs"].as_array().unwrap();
        assert_eq!(lp.len(), 3);
        for (k, t) in lp.iter().enumerate() {
            assert_eq!(t[1].as_u64(), v["output_ids"][k].as_u64());
            assert!(t[0].as_f64().unwrap() <= 0.0 && t[2].is_null());
            assert_eq!(v["meta_info"]["output_top_logprobs"][k].as_array().unwrap().len(), 2);
        }
        let input = v["meta_info"]["input_token_logprobs"].as_array().unwrap();
        assert_eq!(input.len(), 3, "{v:?}");
        assert!(input[0][0].is_null(), "the first prompt token has none");
        // The f32 as written (its shortest decimal), read back as an f32.
        let want = smg_loadtest::sim::grpc::generate::token_id_logprob(6, 7);
        assert_eq!((input[2][0].as_f64().map(|x| x as f32), input[2][1].as_u64()), (Some(want), Some(7)));
        let streamed_lp = post(
            gw.port,
            "/generate",
            r#"{"input_ids":[5,6,7],"stream":true,"return_logprob":true,"logprob_start_len":1,"sampling_params":{"max_new_tokens":2}}"#,
            &[],
        );
        let evs = json_events(&streamed_lp);
        assert_eq!(evs[0]["meta_info"]["input_token_logprobs"].as_array().map(|a| a.len()), Some(2), "{evs:?}");
        assert!(evs[1]["meta_info"].get("input_token_logprobs").is_none(), "on the first event only");

        // Streamed: the whole text so far in every event, the new ids, the finish at the end.
        let r =
            post(gw.port, "/generate", r#"{"text":"hello","stream":true,"sampling_params":{"max_new_tokens":3}}"#, &[]);
        assert_eq!(r.status, 200, "{}", r.text());
        let evs = json_events(&r);
        // One event per token, then the finish (the engine's GenerateComplete), as SMG sends.
        assert_eq!(evs.len(), 4, "{}", r.text());
        let mut ids = Vec::new();
        for (k, e) in evs.iter().enumerate() {
            ids.extend(e["output_ids"].as_array().unwrap().iter().map(|i| i.as_u64().unwrap() as u32));
            let so_far: String = ids.iter().map(|&i| token_text(i)).collect();
            assert_eq!(e["text"].as_str(), Some(so_far.as_str()), "event {k}");
            assert_eq!(e["index"].as_u64(), Some(0));
            assert_eq!(e["meta_info"]["finish_reason"].is_null(), k < 3, "event {k}");
        }
        assert_eq!(ids.len(), 3);
        assert_eq!(evs[3]["meta_info"]["finish_reason"]["type"].as_str(), Some("length"));

        let r = post(gw.port, "/generate", r#"{"text":"a","input_ids":[1]}"#, &[]);
        assert_eq!(r.status, 400, "{}", r.text());
    });
}
