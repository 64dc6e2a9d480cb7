//! The Responses API on a cloud provider that keeps no state for the gateway, through the
//! binary: smg-sim plays OpenAI's Responses API remembering nothing (a `previous_response_id`
//! or `conversation` sent to it is refused) and answering with every input item it was
//! sent, so each test reads in the answer the history the gateway rebuilt and sent.

// clippy.toml's house rules are the gateway's: a test times a whole request from outside.
#![allow(clippy::disallowed_methods)]

mod support;

use std::time::Duration;

use sonic_rs::{JsonContainerTrait, JsonValueTrait, Value};
use support::responses::*;
use support::sim::Sim;
use support::*;

const MODEL: &str = "gpt-4o";

/// The stand-in provider: one OpenAI key with its model, and the key's file (removed when
/// the test is done).
fn provider(tag: &str) -> (Sim, tempfile::TempPath) {
    let keys = tempfile::Builder::new().prefix(&format!("smg-responses-provider-{tag}-")).tempfile().unwrap();
    std::fs::write(keys.path(), format!(r#"{{"sk-o": {{"provider": "openai", "models": ["{MODEL}"]}}}}"#)).unwrap();
    let keys = keys.into_temp_path();
    (Sim::start(MODEL, &["--provider-keys", keys.to_str().unwrap(), "--ttft-ms", "0", "--itl-ms", "0"]), keys)
}

/// A gateway with the provider registered as OpenAI (its key stored), once its model is served.
fn gateway(legacy: bool, sim: &Sim, args: &[&str]) -> Gateway {
    let gw = Gateway::start(legacy, args);
    let worker = format!(r#"{{"url":"{}","api_key":"sk-o","provider":"openai","runtime_type":"external"}}"#, sim.url());
    let r = post(gw.port, "/workers", &worker, &[]);
    assert_eq!(r.status, 202, "{}", r.text());
    let chat = format!(r#"{{"model":"{MODEL}","messages":[{{"role":"user","content":"hi"}}],"max_tokens":3}}"#);
    let served =
        wait_until(Duration::from_secs(20), || post(gw.port, "/v1/chat/completions", &chat, &[]).status == 200);
    assert!(served, "{MODEL} never served; log:\n{}", gw.log_text());
    gw
}

fn text(object: &Value) -> String {
    object["output"][0]["content"][0]["text"].as_str().unwrap_or_default().to_string()
}

fn turn(port: u16, fields: &str) -> Value {
    ok(&post(port, "/v1/responses", &format!(r#"{{"model":"{MODEL}",{fields}}}"#), &[]))
}

#[test]
fn a_chain_is_kept_by_the_gateway_and_sent_whole() {
    both_drivers(|legacy| {
        let (sim, _keys) = provider(&format!("chain-{legacy}"));
        let gw = gateway(legacy, &sim, &[]);
        let first = turn(gw.port, r#""input":"hi""#);
        assert_eq!(text(&first), "heard user:hi");
        assert_eq!(first["store"].as_bool(), Some(true), "kept: {first:?}");
        let id = first["id"].as_str().unwrap().to_string();
        // Stored as answered, input items listed.
        assert_eq!(ok(&get(gw.port, &format!("/v1/responses/{id}"))), first);
        let items = ok(&get(gw.port, &format!("/v1/responses/{id}/input_items")));
        assert_eq!(items["data"][0]["content"][0]["text"].as_str(), Some("hi"));
        // The provider, which keeps nothing, is sent the history: it would refuse the id.
        let second = turn(gw.port, &format!(r#""input":"again","previous_response_id":"{id}","instructions":"brief""#));
        assert_eq!(text(&second), "heard instructions:brief | user:hi | assistant:heard user:hi | user:again");
        assert_eq!(second["previous_response_id"].as_str(), Some(id.as_str()));
        let id2 = second["id"].as_str().unwrap();
        let third = turn(gw.port, &format!(r#""input":"more","previous_response_id":"{id2}""#));
        assert_eq!(
            text(&third),
            "heard user:hi | assistant:heard user:hi | user:again | \
             assistant:heard instructions:brief | user:hi | assistant:heard user:hi | user:again | user:more"
        );
        // An unknown id is the gateway's refusal: the provider is not asked.
        let asked = sim.served();
        let r = post(
            gw.port,
            "/v1/responses",
            &format!(r#"{{"model":"{MODEL}","input":"x","previous_response_id":"resp_nope"}}"#),
            &[],
        );
        assert_eq!(error_code(&r, 400), "previous_response_not_found");
        assert_eq!(sim.served(), asked, "nothing sent for an unknown previous response");
        // The provider's own tools and items pass through (the gateway runs none of them).
        let own = turn(
            gw.port,
            r#""tools":[{"type":"web_search"}],"input":[{"type":"web_search_call","id":"ws_1","status":"completed"},
                {"role":"user","content":"x"}]"#,
        );
        assert_eq!(text(&own), "heard item:web_search_call | user:x");
        // Not stored when the client says so, and says so.
        let unkept = turn(gw.port, r#""input":"quiet","store":false"#);
        assert_eq!(unkept["store"].as_bool(), Some(false));
        let r = get(gw.port, &format!("/v1/responses/{}", unkept["id"].as_str().unwrap()));
        assert_eq!(error_code(&r, 404), "not_found");
    });
}

#[test]
fn a_streamed_turn_is_patched_kept_and_chained() {
    both_drivers(|legacy| {
        let (sim, _keys) = provider(&format!("stream-{legacy}"));
        let gw = gateway(legacy, &sim, &[]);
        let first = turn(gw.port, r#""input":"hi""#);
        let id = first["id"].as_str().unwrap();
        let body = format!(r#"{{"model":"{MODEL}","input":"next","previous_response_id":"{id}","stream":true}}"#);
        let ev = events(&post(gw.port, "/v1/responses", &body, &[]));
        let names: Vec<&str> = ev.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names.first(), Some(&"response.created"));
        assert_eq!(names.last(), Some(&"response.completed"));
        for (name, data) in &ev {
            assert_eq!(data["type"].as_str(), Some(name.as_str()));
            if let Some(r) = data.get("response") {
                assert_eq!(r["previous_response_id"].as_str(), Some(id), "{name}: {r:?}");
                assert_eq!(r["store"].as_bool(), Some(true), "{name}");
            }
        }
        let deltas: String = ev.iter().filter_map(|(_, d)| d["delta"].as_str()).collect();
        assert_eq!(deltas, "heard user:hi | assistant:heard user:hi | user:next");
        let done = &ev.last().unwrap().1["response"];
        let streamed_id = done["id"].as_str().unwrap();
        // Kept as streamed: read back, and chained from.
        assert_eq!(&ok(&get(gw.port, &format!("/v1/responses/{streamed_id}"))), done);
        let after = turn(gw.port, &format!(r#""input":"end","previous_response_id":"{streamed_id}""#));
        assert_eq!(
            text(&after),
            "heard user:hi | assistant:heard user:hi | user:next | \
             assistant:heard user:hi | assistant:heard user:hi | user:next | user:end"
        );
    });
}

#[test]
fn a_conversation_is_kept_by_the_gateway() {
    both_drivers(|legacy| {
        let (sim, _keys) = provider(&format!("conv-{legacy}"));
        let gw = gateway(legacy, &sim, &[]);
        let conv = ok(&post(gw.port, "/v1/conversations", r#"{"metadata":{"k":"v"}}"#, &[]));
        let cid = conv["id"].as_str().unwrap();
        let first = turn(gw.port, &format!(r#""input":"one","conversation":"{cid}""#));
        assert_eq!(text(&first), "heard user:one");
        assert_eq!(first["conversation"]["id"].as_str(), Some(cid));
        let second = turn(gw.port, &format!(r#""input":"two","conversation":{{"id":"{cid}"}}"#));
        assert_eq!(text(&second), "heard user:one | assistant:heard user:one | user:two");
        let items = ok(&get(gw.port, &format!("/v1/conversations/{cid}/items?order=asc")));
        let roles: Vec<&str> = items["data"].as_array().unwrap().iter().map(|i| i["role"].as_str().unwrap()).collect();
        assert_eq!(roles, ["user", "assistant", "user", "assistant"]);
        let r = post(
            gw.port,
            "/v1/responses",
            &format!(r#"{{"model":"{MODEL}","input":"x","conversation":"conv_none"}}"#),
            &[],
        );
        assert_eq!(error_code(&r, 404), "not_found");
    });
}
