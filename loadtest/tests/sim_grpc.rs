//! `smg-sim --grpc` spoken to by an h2 client built from smg-proto (the reference gateway's
//! view is tests/e2e/test_grpc_sim_reference.py): the RPCs, Generate's token stream and its
//! ends (length, stop token, stop_token_ids, n samples, Abort, the client leaving), injected
//! engine errors as gRPC statuses, GetTokenizer's archive, and HTTP/1.1 stats on the same port.

mod common;
mod grpc_client;

use std::time::{Duration, Instant};

use common::*;
use grpc_client::*;
use smg_loadtest::sim::grpc::generate;
use smg_loadtest::sim::tokenizer;
use smg_proto::paths::sglang_scheduler as path;
use smg_proto::scheduler::{self as pb, generate_complete::MatchedStop};
use sonic_rs::{JsonContainerTrait, JsonValueTrait};

fn gen_request(id: &str, stream: bool, sp: pb::SamplingParams) -> pb::GenerateRequest {
    pb::GenerateRequest {
        request_id: id.into(),
        tokenized: Some(pb::TokenizedInput { original_text: String::new(), input_ids: (1..=40).collect() }),
        sampling_params: Some(pb::SamplingParams { temperature: 1.0, top_p: 1.0, top_k: -1, ..sp }),
        stream,
        ..Default::default()
    }
}

#[test]
fn rpcs_and_generate_under_both_drivers() {
    for legacy in DRIVERS {
        let sim = Sim::start(&["--grpc", "--ports", "0", "--model", "sim-grpc", "--output-tokens", "6"], legacy);
        let port = sim.port();
        block_on(async {
            let mut c = connect(port).await;
            let h: Vec<pb::HealthCheckResponse> =
                decode(&call(&mut c, path::HEALTH_CHECK, &pb::HealthCheckRequest {}).await);
            assert!(h[0].healthy);

            let info: Vec<pb::GetModelInfoResponse> =
                decode(&call(&mut c, path::GET_MODEL_INFO, &pb::GetModelInfoRequest {}).await);
            let info = &info[0];
            assert_eq!(info.served_model_name, "sim-grpc");
            assert_eq!(info.max_context_length, 32_768);
            assert_eq!(info.eos_token_ids, vec![tokenizer::IM_END_ID as i32]);
            let dir = std::path::Path::new(&info.tokenizer_path);
            let tj = std::fs::read_to_string(dir.join("tokenizer.json")).expect("tokenizer.json in tokenizer_path");
            assert!(sonic_rs::from_str::<sonic_rs::Value>(&tj).is_ok());
            let cfg: sonic_rs::Value =
                sonic_rs::from_str(&std::fs::read_to_string(dir.join("tokenizer_config.json")).unwrap()).unwrap();
            assert!(cfg["chat_template"].as_str().unwrap().contains("<|im_start|>"));
            assert_eq!(cfg["eos_token"].as_str(), Some("<|im_end|>"));
            let defaults: sonic_rs::Value = sonic_rs::from_str(&info.default_sampling_params_json).unwrap();
            assert!(defaults["temperature"].as_f64().is_some());

            let si: Vec<pb::GetServerInfoResponse> =
                decode(&call(&mut c, path::GET_SERVER_INFO, &pb::GetServerInfoRequest {}).await);
            assert_eq!(si[0].server_type, "grpc");
            let loads: Vec<pb::GetLoadsResponse> =
                decode(&call(&mut c, path::GET_LOADS, &pb::GetLoadsRequest::default()).await);
            assert_eq!(loads[0].loads.len(), 1);
            assert!(loads[0].timestamp.ends_with('Z'));
            let flushed: Vec<smg_proto::common::FlushCacheResponse> =
                decode(&call(&mut c, path::FLUSH_CACHE, &smg_proto::common::FlushCacheRequest::default()).await);
            assert!(flushed[0].success);

            // Non-streaming, no limit: --output-tokens tokens, the last the stop token (not sent).
            let r = call(&mut c, path::GENERATE, &gen_request("a", false, Default::default())).await;
            let (chunks, done) = split(decode(&r));
            assert!(chunks.is_empty());
            assert_eq!(done.len(), 1);
            let d = &done[0];
            assert_eq!((d.finish_reason.as_str(), d.completion_tokens, d.output_ids.len()), ("stop", 6, 5));
            assert_eq!(d.matched_stop, Some(MatchedStop::MatchedTokenId(tokenizer::IM_END_ID)));
            assert_eq!(d.prompt_tokens, 40);
            let text: String = d.output_ids.iter().map(|&t| tokenizer::token_text(t)).collect();
            assert_eq!(text.split(' ').count(), 5, "{text:?}");

            // Streaming with max_new_tokens: one chunk per token, cumulative counts, finish length.
            let sp = pb::SamplingParams { max_new_tokens: Some(4), ..Default::default() };
            let (chunks, done) = split(decode(&call(&mut c, path::GENERATE, &gen_request("b", true, sp)).await));
            assert_eq!(chunks.iter().map(|c| c.completion_tokens).collect::<Vec<_>>(), [1, 2, 3, 4]);
            assert_eq!(done[0].finish_reason, "length");
            let streamed: Vec<u32> = chunks.iter().flat_map(|c| c.token_ids.clone()).collect();
            assert_eq!(streamed, done[0].output_ids);
            // The same request again hits the prefix cache (two whole 16-token blocks of 40).
            let sp = pb::SamplingParams { max_new_tokens: Some(1), ..Default::default() };
            let (_, done) = split(decode(&call(&mut c, path::GENERATE, &gen_request("b2", false, sp)).await));
            assert_eq!(done[0].cached_tokens, 32);
        });
        let stats = http(port, "GET", "/sim/stats", "").json();
        assert_eq!(stats["inference_requests"].as_u64(), Some(3));
        assert_eq!(stats["grpc"]["rpcs"]["Generate"].as_u64(), Some(3));
        assert_eq!(stats["grpc"]["last_generate"]["max_new_tokens"].as_u64(), Some(1));
    }
}

#[test]
fn samples_and_stop_token_ids() {
    let sim = Sim::start(&["--grpc", "--ports", "0", "--output-tokens", "10"], false);
    block_on(async {
        let mut c = connect(sim.port()).await;
        // n = 3: each index streams its own tokens and ends with its own complete.
        let sp = pb::SamplingParams { n: 3, max_new_tokens: Some(5), ..Default::default() };
        let (chunks, done) = split(decode(&call(&mut c, path::GENERATE, &gen_request("n3", true, sp)).await));
        assert_eq!(chunks.len(), 15);
        let mut idx: Vec<u32> = done.iter().map(|d| d.index).collect();
        idx.sort_unstable();
        assert_eq!(idx, [0, 1, 2]);
        for d in &done {
            let mine: Vec<u32> =
                chunks.iter().filter(|c| c.index == d.index).flat_map(|c| c.token_ids.clone()).collect();
            assert_eq!(mine, d.output_ids);
        }
        assert_ne!(done[0].output_ids, done[1].output_ids);

        // A stop_token_ids entry the model produces at position 2 ends the sample there (a
        // request id whose first three words differ, so the stop is not matched earlier).
        let (id, earlier, third) = (0..100)
            .map(|i| {
                let id = format!("stop-{i}");
                let seed = generate::seed_of(&id);
                let earlier = [generate::token_at(seed, 0, 0), generate::token_at(seed, 0, 1)];
                (id, earlier, generate::token_at(seed, 0, 2))
            })
            .find(|(_, earlier, third)| !earlier.contains(third) && earlier[0] != earlier[1])
            .unwrap();
        let sp = pb::SamplingParams { stop_token_ids: vec![third], ..Default::default() };
        let (_, done) = split(decode(&call(&mut c, path::GENERATE, &gen_request(&id, false, sp)).await));
        assert_eq!(done[0].finish_reason, "stop");
        assert_eq!(done[0].output_ids, earlier);
        assert_eq!(done[0].matched_stop, Some(MatchedStop::MatchedTokenId(third)));
        assert_eq!(done[0].completion_tokens, 3);
        // The natural end emits the first stop_token_ids entry instead of <|im_end|>.
        let sp = pb::SamplingParams { stop_token_ids: vec![tokenizer::ENDOFTEXT_ID], ..Default::default() };
        let (_, done) = split(decode(&call(&mut c, path::GENERATE, &gen_request("eot", false, sp)).await));
        assert_eq!(done[0].matched_stop, Some(MatchedStop::MatchedTokenId(tokenizer::ENDOFTEXT_ID)));
        // max_new_tokens 0: no output, finish length.
        let sp = pb::SamplingParams { max_new_tokens: Some(0), ..Default::default() };
        let (_, done) = split(decode(&call(&mut c, path::GENERATE, &gen_request("zero", false, sp)).await));
        assert_eq!((done[0].completion_tokens, done[0].finish_reason.as_str()), (0, "length"));
    });
}

#[test]
fn abort_and_client_leaving_are_observed() {
    let sim = Sim::start(&["--grpc", "--ports", "0", "--itl-ms", "20"], false);
    let port = sim.port();
    block_on(async {
        let mut c = connect(port).await;
        let sp = pb::SamplingParams { max_new_tokens: Some(1000), ..Default::default() };
        let resp = start(&mut c, path::GENERATE, &gen_request("to-abort", true, sp.clone())).await;
        // The abort goes once the first token has come: the request is running at the worker.
        let got = std::rc::Rc::new(std::cell::Cell::new(0));
        let reader = monoio::spawn(finish_counting(resp, got.clone()));
        let until = Instant::now() + patience(Duration::from_secs(5));
        while got.get() == 0 {
            assert!(Instant::now() < until, "the stream to abort never sent a token");
            monoio::time::sleep(Duration::from_millis(5)).await;
        }
        let t0 = Instant::now();
        let ack: Vec<pb::AbortResponse> = decode(
            &call(&mut c, path::ABORT, &pb::AbortRequest { request_id: "to-abort".into(), reason: "test".into() })
                .await,
        );
        assert!(ack[0].success);
        let (chunks, done) = split(decode(&reader.await));
        assert!(t0.elapsed() < patience(Duration::from_millis(500)), "abort took {:?}", t0.elapsed());
        assert!(!chunks.is_empty() && chunks.len() < 100, "{} chunks", chunks.len());
        assert_eq!(done[0].finish_reason, "abort");

        // A client that resets its stream: the call is counted as cancelled.
        let resp = start(&mut c, path::GENERATE, &gen_request("leaver", true, sp)).await;
        let head = resp.await.expect("head");
        let mut body = head.into_body();
        let _ = body.data().await;
        drop(body);
    });
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let stats = http(port, "GET", "/sim/stats", "").json();
        let g = &stats["grpc"];
        if g["cancelled"].as_u64() == Some(1) {
            assert_eq!(g["aborts"].as_u64(), Some(1));
            assert_eq!(g["aborts_hit"].as_u64(), Some(1));
            assert_eq!(g["abort_ids"][0].as_str(), Some("to-abort"));
            assert_eq!(g["in_flight"].as_u64(), Some(0));
            break;
        }
        assert!(Instant::now() < deadline, "the reset stream was never counted: {stats:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn engine_errors_are_grpc_statuses() {
    let sim = Sim::start(&["--grpc", "--ports", "0"], false);
    let port = sim.port();
    block_on(async {
        let mut c = connect(port).await;
        for (name, code) in [("INVALID_ARGUMENT", 3), ("resource_exhausted", 8), ("14", 14)] {
            let mut fields = std::collections::BTreeMap::new();
            fields.insert(
                "sim_error".to_string(),
                prost_types::Value { kind: Some(prost_types::value::Kind::StringValue(name.into())) },
            );
            let sp = pb::SamplingParams { custom_params: Some(prost_types::Struct { fields }), ..Default::default() };
            let r = call(&mut c, path::GENERATE, &gen_request("e", true, sp)).await;
            assert_eq!(r.code, code, "{name}: {}", r.message);
            assert!(r.messages.is_empty());
        }
        let empty = pb::GenerateRequest { request_id: "x".into(), ..Default::default() };
        assert_eq!(call(&mut c, path::GENERATE, &empty).await.code, 3);
        let r = call(&mut c, "/sglang.grpc.scheduler.SglangScheduler/Nope", &pb::HealthCheckRequest {}).await;
        assert_eq!(r.code, 12);
        let r = call(&mut c, "/vllm.grpc.engine.VllmEngine/HealthCheck", &pb::HealthCheckRequest {}).await;
        assert_eq!(r.code, 12);
    });
    // --fail-rate / --fail-status, set at run time, map as gRPC maps HTTP statuses.
    for (status, code) in [(429, 8), (503, 14), (400, 3)] {
        let body = format!("{{\"fail_rate\":1,\"fail_status\":{status}}}");
        assert_eq!(http(port, "POST", "/sim/control", &body).status, 200);
        let r = block_on(async {
            let mut c = connect(port).await;
            call(&mut c, path::GENERATE, &gen_request("f", false, Default::default())).await
        });
        assert_eq!(r.code, code, "fail_status {status}");
    }
    // A stream cut mid-way ends with INTERNAL after the tokens before the cut.
    let ctl = r#"{"fail_rate":0,"truncate_rate":1,"truncate_after_tokens":2}"#;
    assert_eq!(http(port, "POST", "/sim/control", ctl).status, 200);
    let r = block_on(async {
        let mut c = connect(port).await;
        call(&mut c, path::GENERATE, &gen_request("t", true, Default::default())).await
    });
    assert_eq!((r.code, r.messages.len()), (13, 2));
}

#[test]
fn tokenizer_bundle() {
    let sim = Sim::start(&["--grpc", "--ports", "0", "--advertise-tokenizer-path", "/nonexistent/sim"], false);
    block_on(async {
        let mut c = connect(sim.port()).await;
        let info: Vec<pb::GetModelInfoResponse> =
            decode(&call(&mut c, path::GET_MODEL_INFO, &pb::GetModelInfoRequest {}).await);
        assert_eq!(info[0].tokenizer_path, "/nonexistent/sim");
        let chunks: Vec<smg_proto::common::GetTokenizerChunk> =
            decode(&call(&mut c, path::GET_TOKENIZER, &smg_proto::common::GetTokenizerRequest {}).await);
        let zip: Vec<u8> = chunks.iter().flat_map(|c| c.data.clone()).collect();
        use sha2::Digest;
        let hex: String = sha2::Sha256::digest(&zip).iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(chunks.last().unwrap().sha256, hex);
        assert!(chunks[..chunks.len() - 1].iter().all(|c| c.sha256.is_empty()));
        assert_eq!(&zip[..4], b"PK\x03\x04");
        for name in ["tokenizer.json", "tokenizer_config.json"] {
            assert!(zip.windows(name.len()).any(|w| w == name.as_bytes()), "{name} not in the archive");
        }
    });
}

/// The llama.cpp server and model of the end-to-end test (`.ci/llama-worker.sh`, exported by
/// `.ci/run` as LLAMA_SERVER and LLAMA_MODEL, else its cache). None only when neither is
/// there, which the caller reports loudly.
fn llama_files() -> Option<(std::path::PathBuf, std::path::PathBuf)> {
    let cache = std::env::var_os("SMG_CACHE")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/smg"));
    let from_env = std::env::var_os("LLAMA_SERVER").is_some();
    let server = std::env::var_os("LLAMA_SERVER")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| cache.join("llama-server-11434/llama-server"));
    let model = std::env::var_os("LLAMA_MODEL")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| cache.join("SmolLM2-135M-Instruct.Q4_1.gguf"));
    let there = server.exists() && model.exists();
    assert!(
        there || !from_env,
        "LLAMA_SERVER/LLAMA_MODEL set but {} or {} is missing",
        server.display(),
        model.display()
    );
    there.then_some((server, model))
}

struct Llama {
    child: std::process::Child,
    port: u16,
}

impl Drop for Llama {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts llama-server on a port picked here ([`on_a_free_port`]: again on another one when it
/// exits at start). The wait is patient: loading the model beside a release build is slow.
fn start_llama(server: &std::path::Path, model: &std::path::Path) -> Llama {
    on_a_free_port("llama-server", |port| {
        let child = std::process::Command::new(server)
            .args(["-m", model.to_str().unwrap(), "--host", "127.0.0.1", "--port", &port.to_string(), "-c", "2048"])
            .args(["-np", "2", "--log-disable"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("spawn llama-server");
        let mut llama = Llama { child, port };
        let healthy = wait_until(patience(Duration::from_secs(60)), || {
            llama.child.try_wait().unwrap().is_some()
                || http_raw(port, &request_bytes("GET", "/health", ""), Duration::from_secs(2))
                    .is_ok_and(|r| parse_response(&r).status == 200)
        });
        // Health answered by another process on the port counts only while ours still runs.
        if llama.child.try_wait().unwrap().is_some() {
            return None;
        }
        assert!(healthy, "llama-server never became healthy");
        Some(llama)
    })
}

/// `--llama-url`: Generate is served by the real model. A greedy request's tokens through the
/// bridge, streamed and not, are exactly llama-server's own for the same prompt ids.
#[test]
fn generate_through_a_real_llama_cpp_model() {
    let Some((server, model)) = llama_files() else {
        eprintln!("\n!!!!!!!! SKIPPED the llama.cpp bridge: no llama-server or model; run `bash .ci/llama-worker.sh` !!!!!!!!\n");
        return;
    };
    let llama = start_llama(&server, &model);
    let url = format!("http://127.0.0.1:{}", llama.port);
    let prompt = "<|im_start|>user\nName three colours.<|im_end|>\n<|im_start|>assistant\n";
    // llama-server answers these in well under a second on an idle box; a run that shares two
    // cores with a release build has taken over 10 s. A server that never answers is the wrong
    // behaviour the bound catches.
    let slow = Duration::from_secs(60);
    let tok =
        http_within(llama.port, "POST", "/tokenize", &format!(r#"{{"content":{prompt:?},"add_special":false}}"#), slow)
            .json();
    let ids: Vec<u32> = tok["tokens"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap() as u32).collect();
    // llama-server itself, greedy, with the same ids.
    let ids_json = ids.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(",");
    let own = http_within(
        llama.port,
        "POST",
        "/completion",
        &format!(
            r#"{{"prompt":[{ids_json}],"n_predict":24,"temperature":0,"return_tokens":true,"cache_prompt":false}}"#
        ),
        slow,
    )
    .json();
    let mut want: Vec<u32> = own["tokens"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap() as u32).collect();
    // llama.cpp ends its tokens with the EOS it stopped on; an SGLang engine sends no stop token.
    let natural = own["stop_type"].as_str() == Some("eos");
    if natural {
        want.pop();
    }
    assert!(!want.is_empty());
    for legacy in DRIVERS {
        let sim = Sim::start(&["--grpc", "--ports", "0", "--model", "smollm2", "--llama-url", &url], legacy);
        block_on(async {
            let mut c = connect(sim.port()).await;
            let sp = pb::SamplingParams {
                temperature: 0.0,
                top_p: 1.0,
                top_k: -1,
                max_new_tokens: Some(24),
                repetition_penalty: 1.0,
                ..Default::default()
            };
            let req = |id: &str, stream: bool| pb::GenerateRequest {
                request_id: id.into(),
                tokenized: Some(pb::TokenizedInput { original_text: String::new(), input_ids: ids.clone() }),
                sampling_params: Some(sp.clone()),
                stream,
                ..Default::default()
            };
            let (chunks, done) = split(decode(&call(&mut c, path::GENERATE, &req("s", true)).await));
            let streamed: Vec<u32> = chunks.iter().flat_map(|c| c.token_ids.clone()).collect();
            assert_eq!(streamed, want, "streamed tokens differ from llama-server's own");
            assert_eq!(done[0].output_ids, want);
            assert_eq!(done[0].prompt_tokens as usize, ids.len());
            let (chunks, done) = split(decode(&call(&mut c, path::GENERATE, &req("n", false)).await));
            assert!(chunks.is_empty());
            assert_eq!(done[0].output_ids, want, "non-streamed tokens differ from llama-server's own");
            assert_eq!(done[0].finish_reason, if natural { "stop" } else { "length" });
        });
    }
}
