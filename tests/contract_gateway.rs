//! A sample of the request contract through the running gateway (the full table runs
//! in-process in src/contract/tests): exact error bodies, no X-SMG-Error-Code, nothing
//! reaches a worker on rejection, and rewrites reach the worker as splices.

mod support;

use std::io::Write;

use sonic_rs::JsonValueTrait;
use support::*;

fn invalid(msg: &str) -> String {
    format!(r#"{{"error":{{"message":"{msg}","type":"invalid_request_error","code":400}}}}"#)
}

fn parse_error(msg: &str) -> String {
    format!(r#"{{"error":{{"message":"{msg}","type":"invalid_request_error","code":"json_parse_error"}}}}"#)
}

#[test]
fn rejections_have_the_exact_contract_bodies() {
    both_drivers(|legacy| {
        let w = FakeWorker::start("m");
        let url = w.url();
        let gw = Gateway::start(legacy, &["--worker-urls", &url]);
        gw.ready();
        let cases: Vec<(&str, String, String)> = vec![
            (
                "/v1/chat/completions",
                r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"temperature":2.5}"#.into(),
                invalid("temperature must be between 0 and 2"),
            ),
            (
                "/v1/chat/completions",
                r#"{"model":"m","messages":[{"role":"user","content":"hi"},{"role":"root","content":"x"}]}"#.into(),
                invalid("__all__: invalid role: root"),
            ),
            ("/v1/completions", r#"{"model":"m","prompt":"hi","temperature":3}"#.into(), invalid("temperature must be between 0 and 2")),
            (
                "/v1/chat/completions",
                r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"thinking":{"type":"sometimes"}}"#.into(),
                parse_error(
                    "Invalid JSON data: thinking.type: unknown variant `sometimes`, expected one of `enabled`, `disabled`, `adaptive`",
                ),
            ),
        ];
        for (path, body, want) in cases {
            let r = post(gw.port, path, &body, &[]);
            assert_eq!(r.status, 400, "{body}");
            assert_eq!(r.text(), want, "{body}");
            assert_eq!(r.header("x-smg-error-code"), None);
            assert_eq!(r.header("content-type"), Some("application/json"));
        }
        // Not JSON at all, and JSON without the Content-Type header.
        let r = post(gw.port, "/v1/chat/completions", "{nope", &[]);
        assert_eq!((r.status, r.json()["error"]["code"].as_str()), (400, Some("json_parse_error")));
        let mut s = gw.connect();
        let body = r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;
        s.write_all(
            format!("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{body}", body.len())
                .as_bytes(),
        )
        .unwrap();
        let r = read_response(&mut s, &mut Vec::new(), false).unwrap();
        assert_eq!(r.text(), parse_error("Missing Content-Type: application/json header"));
        // The connection stays usable after a 400 from validation.
        s.write_all(post_bytes("/v1/chat/completions", body, &[]).as_bytes()).unwrap();
        assert_eq!(read_response(&mut s, &mut Vec::new(), false).unwrap().status, 200);
        assert_eq!(w.requests().len(), 1, "rejected requests must not reach the worker");
    });
}

#[test]
fn alias_and_profile_rewrites_are_splices() {
    both_drivers(|legacy| {
        let w = FakeWorker::start("org/canonical");
        let kimi = FakeWorker::start("moonshotai/Kimi-K2-Instruct");
        let (u1, u2) = (w.url(), kimi.url());
        let gw = Gateway::start(legacy, &["--worker-urls", &u1, &u2, "--model-alias", "short=org/canonical"]);
        gw.ready_workers(2);
        // Alias: only the model string changes; spacing and number spellings survive.
        let body =
            r#"{ "model" : "short", "messages":[{"role":"user","content":"hi"}], "top_p":0.95, "temperature":1e0 }"#;
        let r = post(gw.port, "/v1/chat/completions", body, &[]);
        assert_eq!(r.status, 200, "{}", r.text());
        let seen = String::from_utf8(w.requests().pop().unwrap().body).unwrap();
        assert_eq!(seen, body.replace("\"short\"", "\"org/canonical\""));
        // Aliases are not listed.
        assert!(!get(gw.port, "/v1/models").text().contains("short"));
        // Every serving route resolves aliases, the canonical id spliced in; an unknown
        // model is 404 model_not_found there too.
        for path in ["/v1/embeddings", "/v1/rerank", "/v1/classify", "/v1/responses", "/v1/messages", "/v1/tokenize"] {
            let body = r#"{"input":"x",  "model": "short","extra":{"model":"short"}}"#;
            let r = post(gw.port, path, body, &[]);
            assert_eq!(r.status, 200, "{path}: {}", r.text());
            let seen = String::from_utf8(w.requests().pop().unwrap().body).unwrap();
            assert_eq!(seen, r#"{"input":"x",  "model": "org/canonical","extra":{"model":"short"}}"#, "{path}");
            let r = post(gw.port, path, r#"{"model":"nope","input":"x"}"#, &[]);
            assert_eq!(r.status, 404, "{path}");
            assert_eq!(r.json()["error"]["code"].as_str(), Some("model_not_found"), "{path}");
        }
        // Kimi: streaming requests get include_usage unless they set it.
        let body = r#"{"model":"moonshotai/Kimi-K2-Instruct","messages":[{"role":"user","content":"hi"}],"stream":true,"fake":"sse","events":1}"#;
        let r = post(gw.port, "/v1/chat/completions", body, &[]);
        assert_eq!(r.status, 200);
        let seen = kimi.requests().pop().unwrap().body;
        let v: sonic_rs::Value = sonic_rs::from_slice(&seen).unwrap();
        assert_eq!(v["stream_options"]["include_usage"].as_bool(), Some(true), "{}", String::from_utf8_lossy(&seen));
        assert!(String::from_utf8_lossy(&seen).starts_with(r#"{"model":"moonshotai/Kimi-K2-Instruct","messages""#));
    });
}
