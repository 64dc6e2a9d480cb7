//! smg-sim's HTTP surface under both drivers: endpoints, JSON and SSE shapes, framing (chunked bodies, pipelining).

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::*;
use sonic_rs::{JsonContainerTrait, JsonValueTrait};

#[test]
fn endpoints_and_shapes() {
    for legacy in DRIVERS {
        let sim = Sim::start(&["--ports", "0", "--worker", "0:vmodel:vllm", "--model", "sim-model"], legacy);
        let (p, v) = (sim.ports[0], sim.ports[1]);

        assert_eq!(http(p, "GET", "/health", "").status, 200);
        assert_eq!(http(p, "GET", "/health_generate", "").status, 200);
        let models = http(p, "GET", "/v1/models", "").json();
        assert_eq!(models["data"][0]["id"].as_str(), Some("sim-model"));
        assert_eq!(models["data"][0]["owned_by"].as_str(), Some("sglang"));
        let vm = http(v, "GET", "/v1/models", "").json();
        assert_eq!(vm["data"][0]["owned_by"].as_str(), Some("vllm"));
        assert_eq!(vm["data"][0]["id"].as_str(), Some("vmodel"));
        for path in ["/get_model_info", "/model_info"] {
            assert_eq!(http(p, "GET", path, "").json()["model_path"].as_str(), Some("sim-model"));
        }
        for path in ["/get_server_info", "/server_info"] {
            assert!(http(p, "GET", path, "").json()["max_running_requests"].as_u64().is_some());
        }
        let loads = http(p, "GET", "/v1/loads", "").json();
        let l0 = &loads["loads"][0];
        for key in ["num_running_reqs", "num_waiting_reqs", "token_usage", "max_running_requests", "cache_hit_rate"] {
            assert!(!l0[key].is_null(), "{key} missing in {loads:?}");
        }
        // SGLang-only endpoints are absent on a vLLM worker.
        assert_eq!(http(v, "POST", "/generate", "{}").status, 404);
        assert_eq!(http(v, "GET", "/v1/loads", "").status, 404);
        assert_eq!(http(p, "GET", "/nope", "").status, 404);
        assert_eq!(http(p, "GET", "/v1/chat/completions", "").status, 405);
        assert_eq!(http(p, "POST", "/v1/chat/completions", "{not json").status, 400);

        // Non-streaming chat.
        let r = http(p, "POST", "/v1/chat/completions", &chat_body(r#","max_tokens":5"#));
        assert_eq!(r.status, 200);
        assert!(r.head.to_ascii_lowercase().contains(&format!("x-sim-port: {p}")));
        let j = r.json();
        assert_eq!(j["object"].as_str(), Some("chat.completion"));
        assert_eq!(j["choices"][0]["message"]["content"].as_str(), Some(" hi hi hi hi hi"));
        assert_eq!(j["choices"][0]["finish_reason"].as_str(), Some("length"));
        assert_eq!(j["usage"]["completion_tokens"].as_u64(), Some(5));
        assert!(j["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().is_some());

        // Streaming chat: role first, one event per token, finish, usage, [DONE].
        let r = http(
            p,
            "POST",
            "/v1/chat/completions",
            &chat_body(r#","max_tokens":4,"stream":true,"stream_options":{"include_usage":true}"#),
        );
        assert!(r.head.contains("text/event-stream"));
        let text = r.text();
        let events: Vec<&str> = text.split("\n\n").filter(|e| !e.is_empty()).collect();
        assert_eq!(events.len(), 1 + 4 + 1 + 1 + 1, "{text}");
        let ev =
            |i: usize| -> sonic_rs::Value { sonic_rs::from_str(events[i].strip_prefix("data: ").unwrap()).unwrap() };
        assert_eq!(ev(0)["choices"][0]["delta"]["role"].as_str(), Some("assistant"));
        for i in 1..=4 {
            assert_eq!(ev(i)["choices"][0]["delta"]["content"].as_str(), Some(" hi"));
            assert_eq!(ev(i)["object"].as_str(), Some("chat.completion.chunk"));
        }
        assert_eq!(ev(5)["choices"][0]["finish_reason"].as_str(), Some("length"));
        assert_eq!(ev(6)["choices"].as_array().unwrap().len(), 0);
        assert_eq!(ev(6)["usage"]["completion_tokens"].as_u64(), Some(4));
        assert_eq!(events[7], "data: [DONE]");

        // Without include_usage there is no usage chunk; default length is --output-tokens (16), finish "stop".
        let r = http(p, "POST", "/v1/chat/completions", &chat_body(r#","stream":true"#));
        let text = r.text();
        assert!(!text.contains("\"usage\""));
        assert_eq!(count(text.as_bytes(), b"\"content\":\" hi\""), 16);
        assert!(text.contains("\"finish_reason\":\"stop\""));

        // Completions, /generate, embeddings, flush.
        let j = http(p, "POST", "/v1/completions", r#"{"model":"m","prompt":"abc","max_tokens":2}"#).json();
        assert_eq!(j["choices"][0]["text"].as_str(), Some(" hi hi"));
        let r = http(p, "POST", "/v1/completions", r#"{"prompt":"abc","max_tokens":2,"stream":true}"#);
        assert!(r.text().contains("\"object\":\"text_completion\"") && r.text().ends_with("data: [DONE]\n\n"));
        let j = http(p, "POST", "/generate", r#"{"text":"abc","sampling_params":{"max_new_tokens":3}}"#).json();
        assert_eq!(j["text"].as_str(), Some(" hi hi hi"));
        assert_eq!(j["meta_info"]["completion_tokens"].as_u64(), Some(3));
        let r = http(p, "POST", "/generate", r#"{"text":"abc","sampling_params":{"max_new_tokens":3},"stream":true}"#);
        assert_eq!(count(r.text().as_bytes(), b"data: {\"text\""), 3);
        let j = http(p, "POST", "/v1/embeddings", r#"{"model":"m","input":"abc"}"#).json();
        assert_eq!(j["data"][0]["embedding"].as_array().unwrap().len(), 16);
        assert_eq!(http(p, "POST", "/flush_cache", "").status, 200);
        assert_eq!(http(v, "POST", "/reset_prefix_cache", "").status, 200);
    }
}

/// SSE events of a body, without the `data: ` prefix.
fn events(text: &str) -> Vec<&str> {
    text.split("\n\n").filter(|e| !e.is_empty()).map(|e| e.strip_prefix("data: ").unwrap_or(e)).collect()
}

/// `meta_info[key]`'s triples.
fn triples<'a>(v: &'a sonic_rs::Value, key: &str) -> Vec<&'a sonic_rs::Value> {
    v["meta_info"][key].as_array().unwrap_or_else(|| panic!("no {key} in {v:?}")).iter().collect()
}

/// Each `[logprob, token_id, null]` entry: an id, a logprob ≤ 0 (null where `null_ok`), no text.
fn check_triples(list: &[&sonic_rs::Value], first_null: bool) {
    for (i, t) in list.iter().enumerate() {
        assert_eq!(t.as_array().map(|a| a.len()), Some(3), "{t:?}");
        assert!(t[1].as_u64().is_some() && t[2].is_null(), "{t:?}");
        if i == 0 && first_null {
            assert!(t[0].is_null(), "the first prompt entry is null, as SGLang pads it: {t:?}");
        } else {
            assert!(t[0].as_f64().is_some_and(|lp| lp <= 0.0), "{t:?}");
        }
    }
}

#[test]
fn generate_logprobs() {
    for legacy in DRIVERS {
        let sim = Sim::start(&["--ports", "0"], legacy);
        let p = sim.port();
        let gen = |extra: &str| {
            let body =
                format!(r#"{{"text":"a prompt of several tokens","sampling_params":{{"max_new_tokens":3}}{extra}}}"#);
            http(p, "POST", "/generate", &body)
        };
        // Without return_logprob: neither list.
        let j = gen("").json();
        assert!(
            j["meta_info"].get("input_token_logprobs").is_none()
                && j["meta_info"].get("output_token_logprobs").is_none()
        );
        let prompt_tokens = j["meta_info"]["prompt_tokens"].as_u64().unwrap() as usize;
        assert!(prompt_tokens > 2);

        // SGLang's default logprob_start_len (-1): the last prompt token only.
        let j = gen(r#","return_logprob":true"#).json();
        let input = triples(&j, "input_token_logprobs");
        assert_eq!(input.len(), 1, "{j:?}");
        check_triples(&input, true);
        let output = triples(&j, "output_token_logprobs");
        assert_eq!(output.len(), 3);
        check_triples(&output, false);

        // From the prompt's start: one entry per prompt token, the same on every call.
        let whole = gen(r#","return_logprob":true,"logprob_start_len":0"#).json();
        let input = triples(&whole, "input_token_logprobs");
        assert_eq!(input.len(), prompt_tokens);
        check_triples(&input, true);
        assert_eq!(
            whole["meta_info"]["input_token_logprobs"],
            gen(r#","return_logprob":true,"logprob_start_len":0"#).json()["meta_info"]["input_token_logprobs"]
        );
        let from1 = gen(r#","return_logprob":true,"logprob_start_len":1"#).json();
        let tail = triples(&from1, "input_token_logprobs");
        assert_eq!(tail.len(), prompt_tokens - 1);
        assert_eq!(tail[1..], input[2..], "fixed by the position");
        assert_eq!(tail[0][1], input[1][1]);

        // Streamed: every chunk has the whole input list and the output ones so far.
        let r = gen(r#","return_logprob":true,"logprob_start_len":0,"stream":true"#);
        let text = r.text();
        let ev = events(&text);
        assert_eq!(ev.len(), 4, "{text}");
        for (k, e) in ev[..3].iter().enumerate() {
            let chunk: sonic_rs::Value = sonic_rs::from_str(e).unwrap();
            assert_eq!(chunk["meta_info"]["input_token_logprobs"], whole["meta_info"]["input_token_logprobs"]);
            let out = triples(&chunk, "output_token_logprobs");
            assert_eq!(out.len(), k + 1, "{e}");
            assert_eq!(out[..], triples(&whole, "output_token_logprobs")[..k + 1]);
        }

        // A start at or past the prompt's end is SGLang's 400.
        let r = gen(&format!(r#","return_logprob":true,"logprob_start_len":{prompt_tokens}"#));
        assert_eq!(r.status, 400, "{}", r.text());
        assert!(r.json()["error"]["message"].as_str().unwrap().contains("logprob_start_len"));
    }
}

#[test]
fn keep_alive_pipelining_and_chunked_bodies() {
    for legacy in DRIVERS {
        let sim = Sim::start(&["--ports", "0"], legacy);
        let mut s = TcpStream::connect(("127.0.0.1", sim.port())).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let body = r#"{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":2}"#;
        // Two requests in one write: one Content-Length, one chunked (split oddly), then a GET.
        let mut req =
            format!("POST /v1/chat/completions HTTP/1.1\r\nhost: t\r\ncontent-length: {}\r\n\r\n{body}", body.len());
        let (a, b) = body.split_at(7);
        req.push_str(&format!(
            "POST /v1/chat/completions HTTP/1.1\r\nhost: t\r\ntransfer-encoding: chunked\r\n\r\n{:x}\r\n{a}\r\n{:x}\r\n{b}\r\n0\r\n\r\n",
            a.len(),
            b.len()
        ));
        req.push_str("GET /health HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n");
        s.write_all(req.as_bytes()).unwrap();
        let mut out = Vec::new();
        s.read_to_end(&mut out).unwrap();
        let text = String::from_utf8_lossy(&out);
        assert_eq!(text.matches("HTTP/1.1 200 OK").count(), 3, "{text}");
        assert_eq!(text.matches("\"content\":\" hi hi\"").count(), 2, "{text}");
        assert!(text.contains("connection: close"));

        // Expect: 100-continue gets an interim response before the body is sent.
        let mut s = TcpStream::connect(("127.0.0.1", sim.port())).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(
            format!(
                "POST /v1/chat/completions HTTP/1.1\r\nhost: t\r\nexpect: 100-continue\r\nconnection: close\r\ncontent-length: {}\r\n\r\n",
                body.len()
            )
            .as_bytes(),
        )
        .unwrap();
        let mut interim = [0u8; 25];
        s.read_exact(&mut interim).unwrap();
        assert_eq!(&interim, b"HTTP/1.1 100 Continue\r\n\r\n");
        s.write_all(body.as_bytes()).unwrap();
        let mut out = Vec::new();
        s.read_to_end(&mut out).unwrap();
        assert_eq!(parse_response(&out).status, 200);

        // Oversized bodies are refused.
        let sim2 = Sim::start(&["--ports", "0", "--max-body", "100"], legacy);
        let big = format!(r#"{{"prompt":"{}"}}"#, "x".repeat(200));
        assert_eq!(http(sim2.port(), "POST", "/v1/completions", &big).status, 413);
    }
}

#[test]
fn many_ports_many_threads() {
    for legacy in DRIVERS {
        let sim = Sim::start(&["--ports", "0,0,0,0", "--threads", "2"], legacy);
        assert_eq!(sim.ports.len(), 4);
        for &p in &sim.ports {
            let r = http(p, "POST", "/v1/chat/completions", &chat_body(""));
            assert_eq!(r.status, 200);
            assert!(r.head.contains(&format!("x-sim-port: {p}")));
        }
    }
}

#[test]
fn runtime_detection_surfaces() {
    for legacy in DRIVERS {
        let sim =
            Sim::start(&["--ports", "0", "--worker", "0:vmodel:vllm", "--dp-size", "3", "--max-running", "12"], legacy);
        let (p, v) = (sim.ports[0], sim.ports[1]);
        // vLLM answers /version; SGLang does not, but has /server_info with its DP and batch sizes.
        let ver = http(v, "GET", "/version", "").json();
        assert!(ver["version"].as_str().is_some_and(|s| s.starts_with("0.")), "{ver:?}");
        assert_eq!(http(p, "GET", "/version", "").status, 404);
        assert_eq!(http(v, "GET", "/server_info", "").status, 404);
        for path in ["/server_info", "/get_server_info"] {
            let info = http(p, "GET", path, "").json();
            assert_eq!(info["dp_size"].as_u64(), Some(3));
            assert_eq!(info["max_running_requests"].as_u64(), Some(12));
        }
        assert_eq!(http(p, "GET", "/v1/models", "").json()["data"][0]["owned_by"].as_str(), Some("sglang"));
        assert_eq!(http(v, "GET", "/v1/models", "").json()["data"][0]["owned_by"].as_str(), Some("vllm"));
    }
}

#[test]
fn data_parallel_rank_is_counted_per_rank() {
    for legacy in DRIVERS {
        let sim = Sim::start(&["--ports", "0", "--dp-size", "2"], legacy);
        let p = sim.port();
        for rank in [0, 1, 1] {
            let body = chat_body(&format!(r#","data_parallel_rank":{rank}"#));
            assert_eq!(http(p, "POST", "/v1/chat/completions", &body).status, 200);
        }
        let gen = r#"{"text":"abc","data_parallel_rank":1,"stream":true}"#;
        assert_eq!(http(p, "POST", "/generate", gen).status, 200);
        // No rank: served, but counted on no rank.
        assert_eq!(http(p, "POST", "/v1/chat/completions", &chat_body("")).status, 200);
        for bad in ["2", "-1"] {
            let r = http(p, "POST", "/v1/chat/completions", &chat_body(&format!(r#","data_parallel_rank":{bad}"#)));
            assert_eq!(r.status, 400, "rank {bad}");
            assert!(r.json()["error"]["message"].as_str().unwrap().contains("data_parallel_rank"));
        }
        let st = http(p, "GET", "/sim/stats", "").json();
        let ranks: Vec<u64> = st["dp_rank_requests"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
        assert_eq!(ranks, [1, 3]);
        assert_eq!(st["inference_requests"].as_u64(), Some(5));
    }
}
