//! Prefill/decode pairs through the binary, both drivers, against smg-sim's PD roles: SGLang
//! pairs (both legs at once with the bootstrap fields, batches included) and vLLM pairs
//! (prefill first, its `kv_transfer_params` relayed), JSON and SSE answers from the decode;
//! the roles as `/workers` shows them; a prefill that fails (its status and message kept, a
//! 400 not retried), one that is unreachable (fails fast, the other prefill takes the retry),
//! the routes a pair does not serve, and a prefill and a decode killed mid-load on every
//! pair shape (SGLang and vLLM over HTTP, SGLang over gRPC).

// clippy.toml's house rules are the gateway's: a test's threads are not shards and may block.
#![allow(clippy::disallowed_methods)]

mod support;

use std::time::{Duration, Instant};

use sonic_rs::{JsonContainerTrait, JsonValueTrait};
use support::pd::{chat, decode, decode_of, pd_gateway, prefill, prefill_of, stat};
use support::sim::Sim;
use support::{both_drivers, free_port, get, patience, post, Gateway};

/// SSE `data:` payloads of a streamed answer.
fn events(text: &str) -> Vec<String> {
    text.lines().filter_map(|l| l.strip_prefix("data: ")).map(str::to_owned).collect()
}

#[test]
fn sglang_pairs_answer_from_the_decode() {
    both_drivers(|legacy| {
        let (p, bport) = prefill(&[]);
        let d = decode(patience(Duration::from_secs(5)), &[]);
        let gw_metrics = free_port();
        let gw = pd_gateway(
            legacy,
            &[(p.url(), Some(bport))],
            &[d.url()],
            &["--cores", "2", "--prometheus-port", &gw_metrics.to_string()],
        );

        let r = post(gw.port, "/v1/chat/completions", &chat(""), &[]);
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.header("x-smg-routed-worker-id"), Some(d.url().as_str()), "names the decode");
        assert_eq!(r.json()["usage"]["completion_tokens"].as_u64(), Some(4));
        assert_eq!((stat(&p, "handoffs_served"), stat(&d, "handoffs_waited")), (1, 1), "the KV went over once");

        let r = post(gw.port, "/v1/chat/completions", &chat(r#","stream":true"#), &[]);
        assert_eq!(r.status, 200, "{}", r.text());
        let ev = events(&r.text());
        assert_eq!(ev.last().map(String::as_str), Some("[DONE]"), "{ev:?}");

        // Batches: one room per item, every item handed over.
        let r = post(gw.port, "/v1/completions", r#"{"model":"m","prompt":["a b","c d","e f"],"max_tokens":2}"#, &[]);
        assert_eq!(r.status, 200, "{}", r.text());
        let r = post(gw.port, "/v1/chat/completions", &chat(r#","n":2"#), &[]);
        assert_eq!(r.status, 200, "{}", r.text());
        let r = post(gw.port, "/generate", r#"{"text":"hi","sampling_params":{"max_new_tokens":3}}"#, &[]);
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(stat(&p, "handoffs_served"), 2 + 3 + 2 + 1, "one room per item");

        // The prompt's log-probabilities are the prefill's: merged in front of the decode's
        // (empty) list, whole and in every streamed event.
        let lp = r#"{"text":"four score and seven years","return_logprob":true,"logprob_start_len":0,"sampling_params":{"max_new_tokens":3}"#;
        let r = post(gw.port, "/generate", &format!("{lp}}}"), &[]);
        assert_eq!(r.status, 200, "{}", r.text());
        let meta = &r.json()["meta_info"];
        let prompt = meta["prompt_tokens"].as_u64().unwrap() as usize;
        assert!(prompt > 1);
        assert_eq!(meta["input_token_logprobs"].as_array().map(|a| a.len()), Some(prompt), "{}", r.text());
        assert_eq!(meta["output_token_logprobs"].as_array().map(|a| a.len()), Some(3), "the decode's own");
        let r = post(gw.port, "/generate", &format!(r#"{lp},"stream":true}}"#), &[]);
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.header("x-smg-routed-worker-id"), Some(d.url().as_str()));
        let ev = events(&r.text());
        let docs: Vec<sonic_rs::Value> =
            ev.iter().filter(|e| *e != "[DONE]").map(|e| sonic_rs::from_str(e).unwrap()).collect();
        assert!(!docs.is_empty());
        for doc in &docs {
            assert_eq!(doc["meta_info"]["input_token_logprobs"].as_array().map(|a| a.len()), Some(prompt), "{doc:?}");
        }

        // The roles, as SMG shows them.
        let w = get(gw.port, "/workers").json();
        let roles: Vec<(String, Option<u64>)> = w["workers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|w| (w["worker_type"].as_str().unwrap().to_owned(), w["bootstrap_port"].as_u64()))
            .collect();
        assert_eq!(roles, [("prefill".to_owned(), Some(u64::from(bport))), ("decode".to_owned(), None)]);
        assert_eq!(w["stats"]["prefill_count"].as_u64(), Some(1));
        assert_eq!(w["stats"]["decode_count"].as_u64(), Some(1));
        let metrics_port = gw_metrics;
        for role in ["prefill", "decode"] {
            let series = format!(r#"smg_worker_pool_size{{worker_type="{role}",connection_mode="http",model="m"}}"#);
            let shown = support::wait_until(patience(Duration::from_secs(5)), || {
                support::metric(metrics_port, &series) == Some(1.0)
            });
            assert!(shown, "{series}: {:?}", support::metric(metrics_port, &series));
        }
        let models = get(gw.port, "/v1/models").json();
        assert_eq!(models["data"][0]["id"].as_str(), Some("m"));

        // What a pair does not serve, and a model it does not know.
        let r = post(
            gw.port,
            "/v1/decisions",
            r#"{"model":"m","input":"x","questions":[{"type":"predicate","instructions":"ok?"}]}"#,
            &[],
        );
        assert_eq!(
            (r.status, r.json()["error"]["code"].as_str().map(str::to_owned)),
            (501, Some("decisions_not_supported".into()))
        );
        let form = "--b\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nm\r\n--b\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\nContent-Type: audio/wav\r\n\r\nRIFF\r\n--b--\r\n";
        let r = {
            use std::io::Write;
            let mut c = std::net::TcpStream::connect(("127.0.0.1", gw.port)).unwrap();
            c.set_read_timeout(Some(patience(Duration::from_secs(10)))).unwrap();
            let head = format!(
                "POST /v1/audio/transcriptions HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; boundary=b\r\nContent-Length: {}\r\n\r\n",
                form.len()
            );
            c.write_all(format!("{head}{form}").as_bytes()).unwrap();
            support::read_response(&mut c, &mut Vec::new(), false).unwrap()
        };
        assert_eq!(
            (r.status, r.json()["error"]["code"].as_str().map(str::to_owned)),
            (501, Some("not_implemented".into())),
            "{}",
            r.text()
        );
        let r = post(gw.port, "/v1/chat/completions", &chat("").replace("\"m\"", "\"nope\""), &[]);
        assert_eq!(
            (r.status, r.json()["error"]["code"].as_str().map(str::to_owned)),
            (404, Some("model_not_found".into()))
        );
    });
}

#[test]
fn vllm_pairs_relay_the_prefills_transfer_params() {
    both_drivers(|legacy| {
        let (p, _) = prefill(&["--runtime", "vllm"]);
        let d = decode(patience(Duration::from_secs(5)), &["--runtime", "vllm"]);
        let gw = pd_gateway(legacy, &[(p.url(), None)], &[d.url()], &["--cores", "2"]);
        let r = post(gw.port, "/v1/chat/completions", &chat(r#","max_completion_tokens":4"#), &[]);
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(
            r.json()["usage"]["completion_tokens"].as_u64(),
            Some(4),
            "the decode's tokens, not the prefill's one"
        );
        let r = post(
            gw.port,
            "/v1/completions",
            r#"{"model":"m","prompt":"once upon","max_tokens":3,"stream":true,"stream_options":{"include_usage":true}}"#,
            &[],
        );
        assert_eq!(r.status, 200, "{}", r.text());
        let ev = events(&r.text());
        assert_eq!(ev.last().map(String::as_str), Some("[DONE]"), "{ev:?}");
        assert!(ev.iter().any(|e| e.contains("\"completion_tokens\":3")), "{ev:?}");
        assert_eq!((stat(&p, "handoffs_served"), stat(&d, "handoffs_waited")), (2, 2));
    });
}

#[test]
fn a_failed_prefill_keeps_its_status_and_an_unreachable_one_fails_fast() {
    both_drivers(|legacy| {
        // A prefill that refuses the request: its 400 and message, not retried.
        let (p, bport) = prefill(&["--fail-rate", "1", "--fail-status", "400"]);
        let handoff = patience(Duration::from_secs(20));
        let d = decode(handoff, &[]);
        let gw = pd_gateway(legacy, &[(p.url(), Some(bport))], &[d.url()], &["--cores", "1"]);
        let r = post(gw.port, "/v1/chat/completions", &chat(""), &[]);
        assert_eq!(r.status, 400, "{}", r.text());
        let e = r.json();
        assert_eq!(e["error"]["code"].as_str(), Some("prefill_bad_request"), "{}", r.text());
        assert!(e["error"]["message"].as_str().unwrap().starts_with("Prefill server error (400): "), "{}", r.text());
        assert_eq!(stat(&p, "failed"), 1, "a prefill 400 is not retried");
        drop(gw);

        // Two prefills, one gone: the retry takes the other, and nobody waits for KV from the
        // dead one (the decode's handoff timeout is the cost of getting this wrong).
        let (alive, alive_port) = prefill(&[]);
        let (dead, dead_port) = prefill(&[]);
        let gw = pd_gateway(
            legacy,
            &[(dead.url(), Some(dead_port)), (alive.url(), Some(alive_port))],
            &[d.url()],
            &["--prefill-policy", "round_robin", "--retry-initial-backoff-ms", "1", "--cores", "1"],
        );
        dead.die();
        for _ in 0..4 {
            let t = Instant::now();
            let r = post(gw.port, "/v1/chat/completions", &chat(""), &[]);
            assert_eq!(r.status, 200, "{}", r.text());
            assert!(t.elapsed() < handoff / 2, "waited {:?} on a dead prefill", t.elapsed());
        }
        // With retries off, the dead prefill's failure is the answer, at once.
        drop(gw);
        let (gone, gone_port) = prefill(&[]);
        let gw =
            pd_gateway(legacy, &[(gone.url(), Some(gone_port))], &[d.url()], &["--disable-retries", "--cores", "1"]);
        gone.die();
        let t = Instant::now();
        let r = post(gw.port, "/v1/chat/completions", &chat(""), &[]);
        assert_eq!(r.status, 502, "{}", r.text());
        assert!(r.text().contains(&gone.url()), "names the prefill: {}", r.text());
        assert!(t.elapsed() < handoff / 2, "waited {:?} on a dead prefill", t.elapsed());
    });
}

#[test]
fn grpc_pairs_tokenize_once_and_say_which_leg_failed() {
    both_drivers(|legacy| {
        const MODEL: &str = "sim-model";
        let body = |extra: &str| chat(extra).replace(r#""model":"m""#, &format!(r#""model":"{MODEL}""#));
        let (p, bport) = prefill_of(MODEL, &["--grpc"]);
        let d = decode_of(MODEL, patience(Duration::from_secs(5)), &["--grpc"]);
        let (pu, du) = (p.grpc_url(), d.grpc_url());
        let gw = pd_gateway(legacy, &[(pu.clone(), Some(bport))], std::slice::from_ref(&du), &["--cores", "2"]);
        let r = post(gw.port, "/v1/chat/completions", &body(""), &[]);
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.header("x-smg-routed-worker-id"), Some(du.as_str()), "names the decode");
        assert_eq!(r.json()["usage"]["completion_tokens"].as_u64(), Some(4));
        let r = post(gw.port, "/v1/chat/completions", &body(r#","stream":true"#), &[]);
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(events(&r.text()).last().map(String::as_str), Some("[DONE]"));
        let r = post(
            gw.port,
            "/v1/completions",
            &format!(r#"{{"model":"{MODEL}","prompt":["one two","three four"],"max_tokens":2}}"#),
            &[],
        );
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.json()["choices"].as_array().map(|a| a.len()), Some(2));
        assert_eq!((stat(&p, "handoffs_served"), stat(&d, "handoffs_waited")), (4, 4), "one room per prompt");

        // A decode gone: its leg's code; then the prefill gone: its leg's code.
        d.die();
        let r = post(gw.port, "/v1/chat/completions", &body(""), &[]);
        assert_eq!(r.json()["error"]["code"].as_str(), Some("decode_worker_failed_to_start"), "{}", r.text());
        drop(gw);
        let d2 = decode_of(MODEL, patience(Duration::from_secs(20)), &["--grpc"]);
        let gw =
            pd_gateway(legacy, &[(pu.clone(), Some(bport))], &[d2.grpc_url()], &["--disable-retries", "--cores", "1"]);
        p.die();
        let t = Instant::now();
        let r = post(gw.port, "/v1/chat/completions", &body(""), &[]);
        assert_eq!(r.json()["error"]["code"].as_str(), Some("prefill_worker_failed_to_start"), "{}", r.text());
        assert!(r.status >= 500, "{}", r.status);
        assert!(t.elapsed() < patience(Duration::from_secs(10)), "waited {:?} on a dead prefill", t.elapsed());
    });
}

#[test]
fn each_role_is_routed_by_its_own_policy() {
    both_drivers(|legacy| {
        let (p1, b1) = prefill(&[]);
        let (p2, b2) = prefill(&[]);
        let (d1, d2) = (decode(patience(Duration::from_secs(5)), &[]), decode(patience(Duration::from_secs(5)), &[]));
        let gw = pd_gateway(
            legacy,
            &[(p1.url(), Some(b1)), (p2.url(), Some(b2))],
            &[d1.url(), d2.url()],
            &["--prefill-policy", "cache_aware", "--decode-policy", "round_robin", "--cores", "1"],
        );
        // One conversation, turn after turn: its prefix stays on one prefill worker, while
        // the decodes take turns.
        let mut history = String::from("You are a careful assistant who answers in full sentences.");
        for turn in 0..6 {
            history.push_str(&format!(" Question {turn}: what comes next?"));
            let body =
                format!(r#"{{"model":"m","messages":[{{"role":"user","content":"{history}"}}],"max_tokens":2}}"#);
            let r = post(gw.port, "/v1/chat/completions", &body, &[]);
            assert_eq!(r.status, 200, "{}", r.text());
        }
        let served = (stat(&p1, "handoffs_served"), stat(&p2, "handoffs_served"));
        assert!(served == (6, 0) || served == (0, 6), "one prefill keeps the conversation: {served:?}");
        assert_eq!((stat(&d1, "handoffs_waited"), stat(&d2, "handoffs_waited")), (3, 3), "the decodes alternate");
        drop(gw);

        // --dp-aware: each role's ranks are routed entries of their own, each leg told its rank.
        let (p, b) = prefill(&["--dp-size", "2"]);
        let d = decode(patience(Duration::from_secs(5)), &["--dp-size", "2"]);
        let gw = Gateway::start(
            legacy,
            &[
                "--pd-disaggregation",
                "--prefill",
                &p.url(),
                &b.to_string(),
                "--decode",
                &d.url(),
                "--dp-aware",
                "--policy",
                "round_robin",
                "--cores",
                "1",
            ],
        );
        gw.ready_workers(4);
        for _ in 0..4 {
            let r = post(gw.port, "/v1/chat/completions", &chat(""), &[]);
            assert_eq!(r.status, 200, "{}", r.text());
        }
        let ranks = |s: &Sim| -> Vec<u64> {
            s.stats()["dp_rank_requests"].as_array().unwrap().iter().map(|c| c.as_u64().unwrap()).collect()
        };
        assert_eq!((ranks(&p), ranks(&d)), (vec![2, 2], vec![2, 2]));
    });
}

/// The pair shapes a fleet can have: SGLang or vLLM over HTTP, SGLang over gRPC.
#[derive(Clone, Copy, Debug)]
enum Shape {
    Sglang,
    Vllm,
    Grpc,
}

#[test]
fn a_prefill_and_a_decode_killed_mid_load_lose_no_request() {
    for shape in [Shape::Sglang, Shape::Vllm, Shape::Grpc] {
        both_drivers(|legacy| killed_mid_load(shape, legacy));
    }
}

/// Two prefills and two decodes of `shape` under 8 clients' load; one prefill dies, then
/// one decode: every request is answered, a failed leg is retried on the survivors.
fn killed_mid_load(shape: Shape, legacy: bool) {
    let (model, extra): (&str, &[&str]) = match shape {
        Shape::Sglang => ("m", &[]),
        Shape::Vllm => ("m", &["--runtime", "vllm"]),
        Shape::Grpc => ("sim-model", &["--grpc"]),
    };
    let with = |flags: &[&'static str]| -> Vec<&'static str> { flags.iter().chain(extra).copied().collect() };
    let (p1, b1) = prefill_of(model, &with(&["--ttft-ms", "20"]));
    let (p2, b2) = prefill_of(model, &with(&["--ttft-ms", "20"]));
    let handoff = patience(Duration::from_secs(10));
    let (d1, d2) =
        (decode_of(model, handoff, &with(&["--itl-ms", "5"])), decode_of(model, handoff, &with(&["--itl-ms", "5"])));
    let url = |s: &Sim| if matches!(shape, Shape::Grpc) { s.grpc_url() } else { s.url() };
    let port = |b: u16| if matches!(shape, Shape::Vllm) { None } else { Some(b) };
    let gw = pd_gateway(
        legacy,
        &[(url(&p1), port(b1)), (url(&p2), port(b2))],
        &[url(&d1), url(&d2)],
        &["--policy", "round_robin", "--retry-initial-backoff-ms", "1", "--cores", "2"],
    );
    let body = move |extra: &str| chat(extra).replace(r#""model":"m""#, &format!(r#""model":"{model}""#));
    let done = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let gw_port = gw.port;
    let clients: Vec<_> = (0..8)
        .map(|i| {
            let done = done.clone();
            std::thread::spawn(move || {
                let mut outcomes = Vec::new();
                for n in 0..12 {
                    let stream = if (i + n) % 2 == 0 { r#","stream":true"# } else { "" };
                    let r = post(gw_port, "/v1/chat/completions", &body(stream), &[]);
                    outcomes.push((r.status, r.text()));
                    done.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                outcomes
            })
        })
        .collect();
    let at = |n: usize| {
        support::wait_until(patience(Duration::from_secs(20)), || done.load(std::sync::atomic::Ordering::Relaxed) >= n)
    };
    assert!(at(16), "{shape:?}");
    p1.die();
    assert!(at(40), "{shape:?}");
    d1.die();
    let outcomes: Vec<(u16, String)> = clients.into_iter().flat_map(|c| c.join().unwrap()).collect();
    assert_eq!(outcomes.len(), 96, "{shape:?}: every request answered");
    for (status, text) in &outcomes {
        match status {
            // A whole answer: a JSON completion, or a stream that ended with [DONE]; a
            // stream the dying decode was sending may be cut, never silently.
            200 => assert!(
                text.contains("\"choices\"") || text.contains("data: [DONE]") || text.contains("\"error\""),
                "{shape:?}: {text}"
            ),
            _ => assert!(text.contains("\"code\""), "{shape:?}: a clear error: {status} {text}"),
        }
    }
    let ok = outcomes.iter().filter(|(s, _)| *s == 200).count();
    // Right: all 96 (a failed leg is retried elsewhere; a cut stream still said 200). Wrong
    // (no failover): about half of the ~56 after the kills fail, some 68 left. Halfway: 82.
    assert!(ok >= 82, "{shape:?}: retries carried the requests the dead workers failed: {ok}/96 answered 200");
    // The survivors serve on.
    let r = post(gw.port, "/v1/chat/completions", &body(""), &[]);
    assert_eq!(r.status, 200, "{shape:?}: {}", r.text());
}
