//! The Responses API served by the gateway on gRPC workers, through the real binary against
//! the simulated scheduler (`smg-sim --grpc`): turns answered and stored, chaining by
//! `previous_response_id`, the event stream, conversations and their items, function tools,
//! and the refusals the contract names.
// A test's threads are not shards: they read the clock and wait.
#![allow(clippy::disallowed_methods)]

mod support;

use sonic_rs::{JsonContainerTrait, JsonValueTrait, Value};
use support::responses::*;
use support::sim::{grpc_gateway as gateway, Sim};
use support::*;

const MODEL: &str = "sim-model";
const FAST: &[&str] = &["--grpc", "--ttft-ms", "0", "--itl-ms", "0", "--output-tokens", "6"];

fn output_text(v: &Value) -> String {
    let mut text = String::new();
    for item in v["output"].as_array().unwrap().iter() {
        if item["type"].as_str() == Some("message") {
            for part in item["content"].as_array().unwrap().iter() {
                text.push_str(part["text"].as_str().unwrap_or_default());
            }
        }
    }
    text
}

#[test]
fn a_turn_is_answered_stored_listed_chained_and_deleted() {
    both_drivers(|legacy| {
        let sim = Sim::start(MODEL, FAST);
        let gw = gateway(legacy, &[&sim], &[]);
        let body = format!(
            r#"{{"model":"{MODEL}","input":"Tell me a story","instructions":"Be brief","max_output_tokens":4,"temperature":0.3,"metadata":{{"k":"v"}}}}"#
        );
        let r = post(gw.port, "/v1/responses", &body, &[]);
        assert_eq!(r.header("x-smg-routed-worker-id"), None, "Responses answers do not name their worker");
        let first = ok(&r);
        let id = first["id"].as_str().unwrap().to_string();
        assert!(id.starts_with("resp_"), "{id}");
        assert_eq!(first["object"].as_str(), Some("response"));
        // The output token limit cut it.
        assert_eq!(first["status"].as_str(), Some("incomplete"));
        assert_eq!(first["incomplete_details"]["reason"].as_str(), Some("max_output_tokens"));
        assert_eq!(first["model"].as_str(), Some(MODEL));
        assert_eq!(first["store"].as_bool(), Some(true));
        assert_eq!(first["instructions"].as_str(), Some("Be brief"));
        assert_eq!(first["metadata"]["k"].as_str(), Some("v"));
        assert!(!output_text(&first).is_empty(), "{first:?}");
        let usage = &first["usage"];
        let (input, output) = (usage["input_tokens"].as_u64().unwrap(), usage["output_tokens"].as_u64().unwrap());
        assert_eq!(output, 4);
        assert_eq!(usage["total_tokens"].as_u64(), Some(input + output));
        // The engine was asked with the request's sampling values.
        let last = sim.stats()["grpc"]["last_generate"].clone();
        assert_eq!(last["max_new_tokens"].as_u64(), Some(4), "{last:?}");
        assert!((last["temperature"].as_f64().unwrap() - 0.3).abs() < 1e-6, "{last:?}");
        assert_eq!(last["input_tokens"].as_u64(), Some(input));

        // Stored: GET answers the same object; its input items are listed with ids.
        let got = ok(&get(gw.port, &format!("/v1/responses/{id}")));
        assert_eq!(got, first);
        let items = ok(&get(gw.port, &format!("/v1/responses/{id}/input_items")));
        let data = items["data"].as_array().unwrap();
        assert_eq!(data.len(), 1);
        assert_eq!(data[0]["role"].as_str(), Some("user"));
        assert_eq!(data[0]["content"][0]["text"].as_str(), Some("Tell me a story"));
        assert_eq!(items["first_id"], data[0]["id"]);
        assert_eq!(items["last_id"], data[0]["id"]);
        assert_eq!(items["has_more"].as_bool(), Some(false));
        // Paged as asked (OpenAI's limit, order, after).
        let three = format!(
            r#"{{"model":"{MODEL}","input":[{{"role":"user","content":"a"}},{{"role":"assistant","content":"b"}},{{"role":"user","content":"c"}}]}}"#
        );
        let v = ok(&post(gw.port, "/v1/responses", &three, &[]));
        let path = format!("/v1/responses/{}/input_items", v["id"].as_str().unwrap());
        let page = ok(&get(gw.port, &format!("{path}?order=desc&limit=2")));
        let texts: Vec<&str> =
            page["data"].as_array().unwrap().iter().map(|i| i["content"][0]["text"].as_str().unwrap()).collect();
        assert_eq!(texts, ["c", "b"]);
        assert_eq!(page["has_more"].as_bool(), Some(true));
        let after = page["last_id"].as_str().unwrap();
        let rest = ok(&get(gw.port, &format!("{path}?order=desc&after={after}")));
        assert_eq!(rest["data"][0]["content"][0]["text"].as_str(), Some("a"));
        assert_eq!(rest["has_more"].as_bool(), Some(false));

        // Chained: the engine reads the earlier input and output before the new input.
        let body = format!(r#"{{"model":"{MODEL}","input":"And then?","previous_response_id":"{id}"}}"#);
        let second = ok(&post(gw.port, "/v1/responses", &body, &[]));
        assert_eq!(second["previous_response_id"].as_str(), Some(id.as_str()));
        assert!(second["instructions"].is_null(), "earlier instructions are not carried");
        let chained = engine_prompt(&sim);
        let alone = {
            let body = format!(r#"{{"model":"{MODEL}","input":"And then?","store":false}}"#);
            let v = ok(&post(gw.port, "/v1/responses", &body, &[]));
            assert_eq!(v["store"].as_bool(), Some(false));
            // Not stored: not found.
            let unstored = v["id"].as_str().unwrap();
            assert_eq!(error_code(&get(gw.port, &format!("/v1/responses/{unstored}")), 404), "not_found");
            engine_prompt(&sim)
        };
        assert!(chained >= alone + output, "the history reached the engine: {chained} vs {alone} alone");

        // Deleted: gone, and nothing chains off it.
        let del = ok(&call(gw.port, "DELETE", &format!("/v1/responses/{id}"), None, &[]));
        assert_eq!(del["object"].as_str(), Some("response.deleted"));
        assert_eq!(del["deleted"].as_bool(), Some(true));
        assert_eq!(error_code(&get(gw.port, &format!("/v1/responses/{id}")), 404), "not_found");
        assert_eq!(error_code(&call(gw.port, "DELETE", &format!("/v1/responses/{id}"), None, &[]), 404), "not_found");
        let served = sim.served();
        let r = post(gw.port, "/v1/responses", &body, &[]);
        assert_eq!(error_code(&r, 400), "previous_response_not_found");
        assert_eq!(sim.served(), served, "nothing generated for a refused chain");
    });
}

#[test]
fn refusals_name_their_codes_and_generate_nothing() {
    both_drivers(|legacy| {
        let sim = Sim::start(MODEL, FAST);
        let gw = gateway(legacy, &[&sim], &[]);
        let p = |body: &str| post(gw.port, "/v1/responses", body, &[]);
        let served = sim.served();
        let cases = [
            (
                format!(r#"{{"model":"{MODEL}","input":"x","previous_response_id":"resp_nope"}}"#),
                400,
                "previous_response_not_found",
            ),
            (
                format!(r#"{{"model":"{MODEL}","input":"x","previous_response_id":"resp_1","conversation":"conv_1"}}"#),
                400,
                "mutually_exclusive_parameters",
            ),
            (
                format!(r#"{{"model":"{MODEL}","input":"x","conversation":"invalid-id"}}"#),
                400,
                "invalid_conversation_id",
            ),
            (format!(r#"{{"model":"{MODEL}","input":"x","conversation":"conv_nope"}}"#), 404, "not_found"),
            (r#"{"model":"no-such-model","input":"x"}"#.to_string(), 404, "model_not_found"),
            (format!(r#"{{"model":"{MODEL}"}}"#), 400, "invalid_request_error"),
        ];
        for (body, status, code) in cases {
            assert_eq!(error_code(&p(&body), status), code, "{body}");
        }
        assert_eq!(sim.served(), served, "nothing generated");
        assert_eq!(error_code(&get(gw.port, "/v1/responses/resp_unknown"), 404), "not_found");
        assert_eq!(call(gw.port, "PUT", "/v1/responses/resp_1", Some("{}"), &[]).status, 405);
        // The gateway still serves.
        ok(&p(&format!(r#"{{"model":"{MODEL}","input":"x"}}"#)));
    });
}

#[test]
fn a_streamed_turn_reports_each_step_in_order_and_is_stored() {
    both_drivers(|legacy| {
        let sim = Sim::start(MODEL, FAST);
        let gw = gateway(legacy, &[&sim], &[]);
        let body = format!(r#"{{"model":"{MODEL}","input":"Stream it","stream":true}}"#);
        let ev = events(&post(gw.port, "/v1/responses", &body, &[]));
        assert_eq!(r#type(&ev[0]), "response.created");
        for (i, (name, data)) in ev.iter().enumerate() {
            assert_eq!(data["type"].as_str(), Some(name.as_str()), "the event name is its type");
            assert_eq!(data["sequence_number"].as_u64(), Some(i as u64), "contiguous from 0");
        }
        let kinds: Vec<&str> = ev.iter().map(|(n, _)| n.as_str()).collect();
        let deltas = kinds.iter().filter(|k| **k == "response.output_text.delta").count();
        assert!(deltas >= 1, "{kinds:?}");
        let mut want = vec![
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
        ];
        want.extend(std::iter::repeat_n("response.output_text.delta", deltas));
        want.extend([
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed",
        ]);
        assert_eq!(kinds, want);
        let id = ev[0].1["response"]["id"].as_str().unwrap().to_string();
        assert_eq!(ev[0].1["response"]["status"].as_str(), Some("in_progress"));
        let done = &ev.last().unwrap().1["response"];
        assert_eq!(done["id"].as_str(), Some(id.as_str()), "one id from created to completed");
        assert_eq!(done["status"].as_str(), Some("completed"));
        let streamed: String = ev
            .iter()
            .filter(|(n, _)| n == "response.output_text.delta")
            .map(|(_, d)| d["delta"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(streamed, output_text(done));
        assert_eq!(ev[kinds.len() - 4].1["text"].as_str(), Some(streamed.as_str()));
        assert_eq!(done["usage"]["output_tokens"].as_u64(), Some(6));
        // Stored as the stream reported it.
        let got = ok(&get(gw.port, &format!("/v1/responses/{id}")));
        assert_eq!(&got, done);
    });
}

fn r#type(e: &(String, Value)) -> &str {
    e.1["type"].as_str().unwrap()
}

#[test]
fn conversations_keep_their_items_and_turns_carry_them() {
    both_drivers(|legacy| {
        let sim = Sim::start(MODEL, FAST);
        let gw = gateway(legacy, &[&sim], &[]);
        let conv = ok(&post(gw.port, "/v1/conversations", r#"{"metadata":{"topic":"demo","drop":"me"}}"#, &[]));
        let cid = conv["id"].as_str().unwrap().to_string();
        assert!(cid.starts_with("conv_"), "{cid}");
        assert_eq!(conv["object"].as_str(), Some("conversation"));
        assert_eq!(conv["metadata"]["topic"].as_str(), Some("demo"));
        assert_eq!(ok(&get(gw.port, &format!("/v1/conversations/{cid}"))), conv);
        // A metadata update merges; null deletes.
        let up =
            ok(&post(gw.port, &format!("/v1/conversations/{cid}"), r#"{"metadata":{"drop":null,"more":"x"}}"#, &[]));
        assert_eq!(up["metadata"]["topic"].as_str(), Some("demo"));
        assert_eq!(up["metadata"]["more"].as_str(), Some("x"));
        assert!(up["metadata"].get("drop").is_none(), "{up:?}");

        // Items: added, listed ascending and descending, read and deleted one by one.
        let items = r#"{"items":[{"type":"message","role":"user","content":"first"},{"type":"message","role":"assistant","content":"second"}]}"#;
        let added = ok(&post(gw.port, &format!("/v1/conversations/{cid}/items"), items, &[]));
        let ids: Vec<String> =
            added["data"].as_array().unwrap().iter().map(|i| i["id"].as_str().unwrap().to_string()).collect();
        assert_eq!(ids.len(), 2);
        let list = |q: &str| ok(&get(gw.port, &format!("/v1/conversations/{cid}/items{q}")));
        let order = |v: &Value| -> Vec<String> {
            v["data"].as_array().unwrap().iter().map(|i| i["id"].as_str().unwrap().to_string()).collect()
        };
        assert_eq!(order(&list("?order=asc")), ids);
        assert_eq!(order(&list("")), ids.iter().rev().cloned().collect::<Vec<_>>(), "descending by default");
        let page = list("?order=asc&limit=1");
        assert_eq!(order(&page), ids[..1]);
        assert_eq!(page["has_more"].as_bool(), Some(true));
        assert_eq!(order(&list(&format!("?order=asc&after={}", ids[0]))), ids[1..]);
        let one = ok(&get(gw.port, &format!("/v1/conversations/{cid}/items/{}", ids[1])));
        assert_eq!(one["content"][0]["text"].as_str(), Some("second"));

        // A turn in the conversation reads its items, and adds its own.
        let body = format!(r#"{{"model":"{MODEL}","input":"third","conversation":"{cid}"}}"#);
        let turn = ok(&post(gw.port, "/v1/responses", &body, &[]));
        assert_eq!(turn["conversation"]["id"].as_str(), Some(cid.as_str()));
        let with_history = engine_prompt(&sim);
        ok(&post(gw.port, "/v1/responses", &format!(r#"{{"model":"{MODEL}","input":"third","store":false}}"#), &[]));
        assert!(with_history > engine_prompt(&sim), "the conversation's items reached the engine");
        let after = order(&list("?order=asc"));
        assert_eq!(after.len(), 4, "the turn's input and output joined: {after:?}");
        assert_eq!(after[..2], ids[..]);

        let del = ok(&call(gw.port, "DELETE", &format!("/v1/conversations/{cid}/items/{}", ids[0]), None, &[]));
        assert_eq!(del["id"].as_str(), Some(cid.as_str()));
        assert_eq!(order(&list("?order=asc")).len(), 3);
        assert_eq!(error_code(&get(gw.port, &format!("/v1/conversations/{cid}/items/{}", ids[0])), 404), "not_found");

        // Deleted: 404 everywhere, and a turn in it is refused.
        let gone = ok(&call(gw.port, "DELETE", &format!("/v1/conversations/{cid}"), None, &[]));
        assert_eq!(gone["object"].as_str(), Some("conversation.deleted"));
        assert_eq!(gone["deleted"].as_bool(), Some(true));
        assert_eq!(error_code(&get(gw.port, &format!("/v1/conversations/{cid}")), 404), "not_found");
        assert_eq!(error_code(&get(gw.port, &format!("/v1/conversations/{cid}/items")), 404), "not_found");
        assert_eq!(error_code(&post(gw.port, "/v1/responses", &body, &[]), 404), "not_found");
        // Bad bodies.
        assert_eq!(
            error_code(&post(gw.port, "/v1/conversations", r#"{"metadata":"x"}"#, &[]), 400),
            "invalid_request_error"
        );
        let many = (0..17).map(|i| format!("\"k{i}\":\"v\"")).collect::<Vec<_>>().join(",");
        let r = post(gw.port, "/v1/conversations", &format!(r#"{{"metadata":{{{many}}}}}"#), &[]);
        assert_eq!(error_code(&r, 400), "invalid_request_error");
    });
}

const WEATHER: &str = r#"{"type":"function","name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}"#;

#[test]
fn a_function_call_comes_out_as_an_item_and_its_output_goes_back_in() {
    both_drivers(|legacy| {
        let model = "Qwen/Qwen3-8B";
        let mut flags = FAST.to_vec();
        flags.extend_from_slice(&["--tool-call-markup", "qwen"]);
        let sim = Sim::start(model, &flags);
        let gw = gateway(legacy, &[&sim], &[]);
        for stream in [false, true] {
            let body =
                format!(r#"{{"model":"{model}","input":"Weather in Paris?","tools":[{WEATHER}],"stream":{stream}}}"#);
            let r = post(gw.port, "/v1/responses", &body, &[]);
            let done = if stream { events(&r).last().unwrap().1["response"].clone() } else { ok(&r) };
            let calls: Vec<&Value> = done["output"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|i| i["type"].as_str() == Some("function_call"))
                .collect();
            assert_eq!(calls.len(), 1, "stream {stream}: {done:?}");
            let call = calls[0];
            assert_eq!(call["name"].as_str(), Some("get_weather"));
            let args: Value = sonic_rs::from_str(call["arguments"].as_str().unwrap()).unwrap();
            assert!(args["city"].as_str().is_some(), "{args:?}");
            let call_id = call["call_id"].as_str().unwrap();
            assert!(!call_id.is_empty());
            assert_eq!(done["tools"][0]["name"].as_str(), Some("get_weather"));
            let id = done["id"].as_str().unwrap();
            let before = engine_prompt(&sim);
            // The tool's output, after the call, by previous_response_id.
            let body = format!(
                r#"{{"model":"{model}","previous_response_id":"{id}","tools":[{WEATHER}],"input":[{{"type":"function_call_output","call_id":"{call_id}","output":"{{\"temp\":21}}"}}]}}"#
            );
            let next = ok(&post(gw.port, "/v1/responses", &body, &[]));
            assert_eq!(next["status"].as_str(), Some("completed"));
            assert!(engine_prompt(&sim) > before, "the call and its output reached the engine");
            let items = ok(&get(gw.port, &format!("/v1/responses/{}/input_items", next["id"].as_str().unwrap())));
            assert_eq!(items["data"][0]["type"].as_str(), Some("function_call_output"));
        }
    });
}

#[test]
fn without_storage_turns_are_served_and_nothing_is_kept() {
    both_drivers(|legacy| {
        let sim = Sim::start(MODEL, FAST);
        let gw = gateway(legacy, &[&sim], &["--history-backend", "none"]);
        let v = ok(&post(gw.port, "/v1/responses", &format!(r#"{{"model":"{MODEL}","input":"x"}}"#), &[]));
        let id = v["id"].as_str().unwrap();
        assert_eq!(v["store"].as_bool(), Some(false), "a response that was not stored does not say it was");
        assert_eq!(error_code(&get(gw.port, &format!("/v1/responses/{id}")), 404), "not_found");
        let body = format!(r#"{{"model":"{MODEL}","input":"x","previous_response_id":"{id}"}}"#);
        assert_eq!(error_code(&post(gw.port, "/v1/responses", &body, &[]), 400), "previous_response_not_found");
    });
}
