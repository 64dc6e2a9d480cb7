//! POST /v1/decisions through the binary, both drivers: the contract's limits at their bound
//! and past it, the System One translation against an SGLang-runtime simulated worker (the
//! exact mapping of all three question types, repeated names, boolean choice values), the
//! four `unsupported_decisions_request` families, the 502, a backend error kept as sent, the
//! byte-identical forward to a vLLM-runtime worker, 501 and 404; and scoring through the
//! engine on gRPC workers.

mod support;

use sonic_rs::{JsonContainerTrait, JsonValueTrait};
use support::sim::Sim;
use support::{both_drivers, get, post, sha_hex, FakeWorker, Gateway};

const PATH: &str = "/v1/decisions";

fn body(input: &str, questions: &str) -> String {
    format!(r#"{{"model":"m","input":{input},"questions":{questions}}}"#)
}

const PRED: &str = r#"{"type":"predicate","instructions":"On time?"}"#;

fn code(r: &support::Response) -> String {
    let v = r.json();
    let c = &v["error"]["code"];
    c.as_str().map(str::to_owned).unwrap_or_else(|| c.as_i64().map(|n| n.to_string()).unwrap_or_default())
}

#[test]
fn sglang_translation() {
    both_drivers(|legacy| {
        let sim = Sim::start("m", &["--runtime", "sglang"]);
        let gw = Gateway::start(legacy, &["--worker-urls", &sim.url(), "--model-alias", "alias=m"]);
        gw.ready_workers(1);
        let q = r#"[{"type":"predicate","instructions":"On time?"},
            {"type":"choice","name":"s","instructions":"Sentiment?","choices":[{"value":true},{"value":"true","description":"the string"},{"value":"no"}]},
            {"type":"score","name":"s","instructions":"Rate.","levels":[{"label":"poor"},{"label":"fair"},{"label":"good","description":"best"}]}]"#;
        let b = format!(
            r#"{{"model":"alias","input":[{{"role":"user","type":"message","content":[{{"type":"input_text","text":"late"}},{{"type":"input_text","text":"intact"}}]}}],"questions":{q},"safety_identifier":"{}"}}"#,
            "u".repeat(128)
        );
        let r = post(gw.port, PATH, &b, &[]);
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.header("x-smg-routed-worker-id"), Some(sim.url().as_str()), "the answer names its worker");
        let v = r.json();
        assert_eq!(v["model"].as_str(), Some("m"));
        let a = v["answers"].as_array().unwrap();
        assert_eq!(a.len(), 3);
        assert_eq!(a[0]["type"].as_str(), Some("predicate"));
        assert!(a[0]["name"].is_null());
        assert_eq!(a[0]["probability"].as_f64(), Some(0.25));
        assert_eq!(a[1]["type"].as_str(), Some("choice"));
        assert_eq!(a[1]["name"].as_str(), Some("s"));
        // Most probable is the last choice; values keep their JSON types.
        assert_eq!(a[1]["choice"].as_str(), Some("no"));
        let p = a[1]["probabilities"].as_array().unwrap();
        assert_eq!(p[0]["value"].as_bool(), Some(true), "boolean true stays a boolean");
        assert_eq!(p[1]["value"].as_str(), Some("true"), "\"true\" stays a string");
        let want = [1.0 / 6.0, 2.0 / 6.0, 3.0 / 6.0];
        for (j, w) in want.iter().enumerate() {
            assert!((p[j]["probability"].as_f64().unwrap() - w).abs() < 1e-12);
        }
        assert_eq!(a[1]["confidence"].as_f64(), Some(0.5));
        assert_eq!(a[2]["type"].as_str(), Some("score"));
        assert_eq!(a[2]["name"].as_str(), Some("s"), "names repeat");
        let l = a[2]["probabilities"].as_array().unwrap();
        assert_eq!(l[2]["label"].as_str(), Some("good"));
        assert_eq!(l[1]["value"].as_u64(), Some(1));
        let score = a[2]["score"].as_f64().unwrap();
        assert!((score - (0.0 * want[0] + 1.0 * want[1] + 2.0 * want[2])).abs() < 1e-12, "{score}");
        let u = &v["usage"];
        assert_eq!(u["input_tokens"].as_u64(), Some("late\n\nintact".len() as u64));
        assert_eq!(u["output_tokens"].as_u64(), Some(0));
        assert_eq!(u["total_tokens"].as_u64(), u["input_tokens"].as_u64());
        assert_eq!(u["input_tokens_details"]["cached_tokens"].as_u64(), Some(0));
        assert_eq!(u["input_tokens_details"]["cache_write_tokens"].as_u64(), Some(0));
        assert_eq!(u["output_tokens_details"]["reasoning_tokens"].as_u64(), Some(0));

        // The four families, before dispatch.
        let served = sim.served();
        let img =
            r#"[{"role":"user","content":[{"type":"input_image","image_url":"data:image/png;base64,iVBORw0KGgo="}]}]"#;
        let many = format!("[{}]", vec![PRED; 256].join(","));
        let choices = |n: usize| {
            format!(
                r#"[{{"type":"choice","instructions":"x","choices":[{}]}}]"#,
                (0..n).map(|i| format!(r#"{{"value":"c{i}"}}"#)).collect::<Vec<_>>().join(",")
            )
        };
        let levels = |n: usize| {
            format!(
                r#"[{{"type":"score","instructions":"x","levels":[{}]}}]"#,
                (0..n).map(|i| format!(r#"{{"label":"l{i}"}}"#)).collect::<Vec<_>>().join(",")
            )
        };
        for (what, b) in [
            ("image", body(img, &format!("[{PRED}]"))),
            ("unknown top", format!(r#"{{"model":"m","input":"x","questions":[{PRED}],"x_ext":1}}"#)),
            ("unknown in question", body("\"x\"", r#"[{"type":"predicate","instructions":"x","weight":2}]"#)),
            (
                "unknown in choice",
                body("\"x\"", r#"[{"type":"choice","instructions":"x","choices":[{"value":"a","w":1}]}]"#),
            ),
            ("blank evidence", body("\" \\n\"", &format!("[{PRED}]"))),
            ("blank instructions", body("\"x\"", r#"[{"type":"predicate","instructions":"  "}]"#)),
            ("no questions", body("\"x\"", "[]")),
            ("256 questions", body("\"x\"", &many)),
            ("0 choices", body("\"x\"", &choices(0))),
            ("256 choices", body("\"x\"", &choices(256))),
            ("0 levels", body("\"x\"", &levels(0))),
            ("11 levels", body("\"x\"", &levels(11))),
        ] {
            let r = post(gw.port, PATH, &b, &[]);
            assert_eq!((r.status, code(&r)), (400, "unsupported_decisions_request".into()), "{what}: {}", r.text());
            assert_eq!(r.header("x-smg-error-code"), Some("unsupported_decisions_request"));
        }
        assert_eq!(sim.served(), served, "refused before dispatch");
        // At the bounds: 255 questions, 255 choices, 10 levels.
        let many = format!("[{}]", vec![PRED; 255].join(","));
        for b in [body("\"x\"", &many), body("\"x\"", &choices(255)), body("\"x\"", &levels(10))] {
            let r = post(gw.port, PATH, &b, &[]);
            assert_eq!(r.status, 200, "{}", r.text());
        }
        // A reply that does not map, and a backend error kept as sent.
        let r = post(gw.port, PATH, &body("\"sim:bad-reply\"", &format!("[{PRED}]")), &[]);
        assert_eq!((r.status, code(&r)), (502, "invalid_decisions_response".into()), "{}", r.text());
        let r = post(gw.port, PATH, &body("\"sim:error\"", &format!("[{PRED}]")), &[]);
        assert_eq!(r.status, 400, "{}", r.text());
        assert_eq!(r.json()["error"]["message"].as_str(), Some("simulated System One refusal"));
        assert!(r.header("x-smg-error-code").is_none());
    });
}

#[test]
fn contract_limits() {
    both_drivers(|legacy| {
        let sim = Sim::start("m", &["--runtime", "vllm"]);
        let gw = Gateway::start(legacy, &["--worker-urls", &sim.url(), "--max-payload-size", "67108864"]);
        gw.ready_workers(1);
        let ok = |b: &str| {
            let r = post(gw.port, PATH, b, &[]);
            assert_eq!(r.status, 200, "{}", &r.text()[..r.text().len().min(300)]);
        };
        let bad = |b: &str, want: &str| {
            let r = post(gw.port, PATH, b, &[]);
            assert_eq!((r.status, code(&r)), (400, want.to_string()), "{}", &r.text()[..r.text().len().min(300)]);
        };
        let q = format!("[{PRED}]");
        let text =
            |n: usize| format!(r#"[{{"role":"user","content":[{{"type":"input_text","text":"{}"}}]}}]"#, "é".repeat(n));
        ok(&body(&text(10_485_760), &q));
        bad(&body(&text(10_485_761), &q), "400");
        let instr = |n: usize| format!(r#"[{{"type":"predicate","instructions":"{}"}}]"#, "a".repeat(n));
        ok(&body("\"x\"", &instr(1_048_576)));
        bad(&body("\"x\"", &instr(1_048_577)), "400");
        let name = |n: usize| format!(r#"[{{"type":"predicate","instructions":"x","name":"{}"}}]"#, "a".repeat(n));
        ok(&body("\"x\"", &name(1_048_576)));
        bad(&body("\"x\"", &name(1_048_577)), "400");
        let label = |n: usize| {
            format!(
                r#"[{{"type":"score","instructions":"x","levels":[{{"label":"{}","description":"{}"}}]}}]"#,
                "a".repeat(n),
                "d".repeat(n)
            )
        };
        ok(&body("\"x\"", &label(1_048_576)));
        bad(&body("\"x\"", &label(1_048_577)), "400");
        let safety = |n: usize| {
            format!(r#"{{"model":"m","input":"x","questions":{q},"safety_identifier":"{}"}}"#, "s".repeat(n))
        };
        ok(&safety(128));
        bad(&safety(129), "400");
        let imgs = |n: usize| {
            let part = r#"{"type":"input_image","image_url":"data:image/png;base64,iVBORw0KGgo=","detail":"low"}"#;
            format!(r#"[{{"role":"user","content":[{}]}}]"#, vec![part; n].join(","))
        };
        ok(&body(&imgs(128), &q));
        bad(&body(&imgs(129), &q), "400");
        bad(&body(r#"[{"role":"user","content":[{"type":"input_image","image_url":"https://x/a.png"}]}]"#, &q), "400");
        bad(
            &body(
                r#"[{"role":"user","content":[{"type":"input_image","file_id":"file-1","image_url":"data:image/png;base64,AA=="}]}]"#,
                &q,
            ),
            "400",
        );
        // Schema mismatches.
        bad(&body(r#"[{"role":"assistant","content":"x"}]"#, &q), "json_parse_error");
        bad(&body(r#"[{"role":"user","type":"other","content":"x"}]"#, &q), "json_parse_error");
        bad(&body("\"x\"", r#"[{"type":"rank","instructions":"x"}]"#), "json_parse_error");
        bad(&body("\"x\"", r#"[{"type":"choice","instructions":"x","choices":[{"value":1}]}]"#), "json_parse_error");
        bad(&body("\"x\"", r#"[{"type":"predicate"}]"#), "json_parse_error");
        bad(&body("\"x\"", r#"[{"type":"score","instructions":"x","levels":[{"label":true}]}]"#), "json_parse_error");
        bad(&format!(r#"{{"input":"x","questions":{q}}}"#), "json_parse_error");
        bad(
            &body(
                r#"[{"role":"user","content":[{"type":"input_image","image_url":"data:image/png;base64,AA==","detail":"max"}]}]"#,
                &q,
            ),
            "json_parse_error",
        );
    });
}

#[test]
fn other_runtimes_forward_bytes_and_errors() {
    both_drivers(|legacy| {
        let sim = Sim::start("m", &["--runtime", "vllm"]);
        let gw = Gateway::start(legacy, &["--worker-urls", &sim.url()]);
        gw.ready_workers(1);
        let b = r#"{ "model" : "m","input":[{"role":"user","content":[{"type":"input_text","text":"x","x_part":[1, 2.50]}],"x_msg":null}],
  "questions":[{"type":"choice","instructions":"q","choices":[{"value":true,"x_c":{}}],"x_q":1e3}],"x_top":"kept"}"#;
        let r = post(gw.port, PATH, b, &[]);
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.body, b.as_bytes(), "the vLLM worker got (and echoed) the body byte for byte");
        let r = post(gw.port, PATH, &body("\"x\"", &format!("[{PRED}]")).replace("\"m\"", "\"nope\""), &[]);
        assert_eq!((r.status, code(&r)), (404, "model_not_found".into()));
        // An external-provider worker serving the model: no eligible worker.
        let ext = Sim::start("e", &["--runtime", "vllm"]);
        let spec = format!(r#"{{"url":"{}","runtime":"external"}}"#, ext.url());
        let r = post(gw.port, "/workers", &spec, &[]);
        assert!(r.status < 300, "{}", r.text());
        gw.ready_workers(2);
        let r = post(gw.port, PATH, &body("\"x\"", &format!("[{PRED}]")).replace("\"m\"", "\"e\""), &[]);
        assert_eq!((r.status, code(&r)), (501, "decisions_not_supported".into()), "{}", r.text());
    });
}

/// A local engine of unknown make (llama.cpp: `owned_by: llamacpp`, no `/version`, no
/// `/server_info`) is a regular HTTP worker: Decisions go to its own `/v1/decisions` byte for
/// byte, and its answer comes back as is, errors included (not `501`).
#[test]
fn a_worker_of_unknown_make_gets_decisions_byte_for_byte() {
    both_drivers(|legacy| {
        let w = FakeWorker::start("m");
        *w.state.owned_by.lock().unwrap() = Some("llamacpp".into());
        let gw = Gateway::start(legacy, &["--worker-urls", &w.url()]);
        gw.ready_workers(1);
        let listed = get(gw.port, "/workers").json();
        assert_eq!(listed["workers"][0]["runtime_type"].as_str(), Some("unspecified"), "{listed:?}");
        let b = r#"{"model":"m","input":[{"role":"user","content":"x"}],"questions":[{"type":"predicate","instructions":"q","x_q":1}],"x_top":"kept"}"#;
        let r = post(gw.port, PATH, b, &[]);
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.json()["sha"].as_str(), Some(sha_hex(b.as_bytes()).as_str()), "the worker's own answer");
        let rec = w.requests().pop().unwrap();
        assert_eq!((rec.path.as_str(), rec.body.as_slice()), (PATH, b.as_bytes()), "forwarded byte for byte");
        let failing = b.replace("\"x_top\":\"kept\"", "\"fake\":\"error\",\"status\":422");
        let r = post(gw.port, PATH, &failing, &[]);
        assert_eq!(r.status, 422, "the worker's error, as is: {}", r.text());
        assert_eq!(r.json()["error"]["type"].as_str(), Some("BadRequestError"), "{}", r.text());
    });
}

/// The simulator's token id for `text` (one token of its vocabulary).
fn sim_token(text: &str) -> u32 {
    use smg_loadtest::sim::tokenizer as t;
    (0..t::vocab_size() as u32).find(|&i| t::token_text(i) == text).unwrap_or_else(|| panic!("no token {text:?}"))
}

/// On a gRPC worker each question is scored through the engine: one prefill-only Generate call
/// per question with the answer labels in `token_ids_logprob`, and the labels' log-probabilities
/// (renormalized over the labels) are the answer; usage counts every question's prompt, the
/// engine's prefix-cache hits as `cached_tokens`. In a fleet with HTTP workers too, both kinds
/// serve it. What the model cannot score is refused before anything is sent.
#[test]
fn grpc_workers_score_through_the_engine() {
    use smg_loadtest::sim::grpc::generate::token_id_logprob;
    both_drivers(|legacy| {
        let grpc = Sim::start("m", &["--grpc"]);
        let gw = support::sim::grpc_gateway(legacy, &[&grpc], &["--model-alias", "alias=m", "--policy", "round_robin"]);
        let q = r#"[{"type":"predicate","instructions":"On time?"},
            {"type":"choice","name":"s","instructions":"Sentiment?","choices":[{"value":true},{"value":"true","description":"the string"},{"value":"no"}]},
            {"type":"score","name":"s","instructions":"Rate.","levels":[{"label":"poor"},{"label":"fair"},{"label":"good","description":"best"}]}]"#;
        let b =
            format!(r#"{{"model":"alias","input":[{{"role":"user","content":"late but intact"}}],"questions":{q}}}"#);
        let r = post(gw.port, PATH, &b, &[]);
        assert_eq!(r.status, 200, "{}", r.text());
        let v = r.json();
        assert_eq!(v["model"].as_str(), Some("m"));
        // What the simulated engine gives each label after the prompt's last token ("\n").
        let after = sim_token("\n");
        let probs = |labels: &[&str]| {
            let w: Vec<f64> = labels.iter().map(|l| f64::from(token_id_logprob(after, sim_token(l))).exp()).collect();
            let sum: f64 = w.iter().sum();
            w.into_iter().map(|x| x / sum).collect::<Vec<f64>>()
        };
        let close = |got: &sonic_rs::Value, want: f64| (got.as_f64().unwrap() - want).abs() < 1e-6;
        let a = v["answers"].as_array().unwrap();
        assert_eq!(a.len(), 3);
        assert!(a[0]["name"].is_null());
        assert!(close(&a[0]["probability"], probs(&["yes", "no"])[0]), "{:?}", a[0]);
        let want = probs(&["A", "B", "C"]);
        let p = a[1]["probabilities"].as_array().unwrap();
        assert_eq!((p[0]["value"].as_bool(), p[1]["value"].as_str()), (Some(true), Some("true")));
        for j in 0..3 {
            assert!(close(&p[j]["probability"], want[j]), "{j}: {:?} vs {want:?}", p[j]);
        }
        let top = (0..3).fold(0, |b, j| if want[j] > want[b] { j } else { b });
        assert_eq!(a[1]["choice"].to_string(), p[top]["value"].to_string());
        assert!(close(&a[1]["confidence"], want[top]));
        let want = probs(&["0", "1", "2"]);
        assert!(close(&a[2]["score"], want[1] + 2.0 * want[2]), "{:?}", a[2]);
        assert_eq!(a[2]["probabilities"][2]["label"].as_str(), Some("good"));
        let u = &v["usage"];
        let input = u["input_tokens"].as_u64().unwrap();
        assert!(input > 3 * 20, "three prompts over the evidence: {input}");
        assert_eq!((u["output_tokens"].as_u64(), u["total_tokens"].as_u64()), (Some(0), Some(input)));
        // The three prompts share the evidence: the engine's prefix cache hits count.
        assert!(u["input_tokens_details"]["cached_tokens"].as_u64().unwrap() > 0, "{u:?}");
        let last = &grpc.stats()["grpc"]["last_generate"];
        assert_eq!(last["max_new_tokens"].as_u64(), Some(0), "nothing generated: {last:?}");
        assert_eq!((last["return_logprob"].as_bool(), last["stream"].as_bool()), (Some(true), Some(false)));
        let labels: Vec<u64> = ["0", "1", "2"].iter().map(|l| u64::from(sim_token(l))).collect();
        let sent: Vec<u64> = last["token_ids_logprob"].as_array().unwrap().iter().filter_map(|x| x.as_u64()).collect();
        assert_eq!(sent, labels);

        // 27 options: the 27th label ("AA") is two tokens of this vocabulary. Refused, unsent.
        let served = grpc.served();
        let choices: Vec<String> = (0..27).map(|i| format!(r#"{{"value":"v{i}"}}"#)).collect();
        let many = format!(r#"[{{"type":"choice","instructions":"Which?","choices":[{}]}}]"#, choices.join(","));
        let r = post(gw.port, PATH, &body("\"x\"", &many), &[]);
        assert_eq!((r.status, code(&r)), (400, "unsupported_decisions_request".into()), "{}", r.text());
        assert!(r.text().contains("\\\"AA\\\""), "{}", r.text());
        // The SGLang refusals hold on gRPC workers too.
        let r = post(gw.port, PATH, &body("\"   \"", &format!("[{PRED}]")), &[]);
        assert_eq!((r.status, code(&r)), (400, "unsupported_decisions_request".into()), "{}", r.text());
        assert_eq!(grpc.served(), served, "nothing reached the engine");

        // An HTTP worker of the same model joins: Decisions go to both kinds.
        let http = Sim::start("m", &["--runtime", "sglang"]);
        let r = post(gw.port, "/workers", &format!(r#"{{"url":"{}"}}"#, http.url()), &[]);
        assert!(r.status < 300, "{}", r.text());
        gw.ready_workers(2);
        let seen: std::collections::HashSet<String> = (0..8)
            .map(|_| post(gw.port, PATH, &body("\"x\"", &format!("[{PRED}]")), &[]))
            .inspect(|r| assert_eq!(r.status, 200, "{}", r.text()))
            .map(|r| r.header("x-smg-routed-worker-id").unwrap_or_default().to_string())
            .collect();
        assert_eq!(seen.len(), 2, "{seen:?}");
    });
}
