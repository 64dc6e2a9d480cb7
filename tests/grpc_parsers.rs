//! Reasoning and tool-call parsing on gRPC workers, through the real binary against
//! `smg-sim --grpc` answering in each model family's markup (`--reasoning-markup`,
//! `--tool-call-markup`; one byte token per byte, so every marker arrives cut at every
//! byte): the parsers chosen by the model's name or by flag, `reasoning_content` and
//! `tool_calls` streamed and not, the request fields that turn them off, and `tool_choice`'s
//! constraints.

mod support;

use sonic_rs::{JsonContainerTrait, JsonValueTrait, Value};
use support::sim::{grpc_gateway as gateway, tokenizer_dir_with_template, Sim};
use support::*;

const FAST: &[&str] = &["--grpc", "--ttft-ms", "0", "--itl-ms", "0"];
const CITIES: &[&str] = &["Paris", "東京", "São Paulo", "Zürich", "New York"];

/// A model id as its publisher names it, the reasoning and tool-call families the gateway
/// picks for it by name, and so the markup the simulated model writes.
const FAMILIES: &[(&str, Option<&str>, &str)] = &[
    ("Qwen/Qwen3-8B", Some("qwen3"), "qwen"),
    ("Qwen/Qwen3-Coder-30B-A3B-Instruct", Some("qwen3"), "qwen_coder"),
    ("deepseek-ai/DeepSeek-V3", None, "deepseek"),
    ("deepseek-ai/DeepSeek-V3.1", Some("deepseek_v31"), "deepseek31"),
    ("moonshotai/Kimi-K2-Instruct", Some("kimi"), "kimik2"),
    ("zai-org/GLM-4.5", Some("glm45"), "glm45_moe"),
    ("meta-llama/Llama-3.2-3B-Instruct", None, "llama"),
    ("meta-llama/Llama-4-Scout-17B-16E-Instruct", None, "pythonic"),
    ("mistralai/Mistral-7B-Instruct-v0.3", None, "mistral"),
    ("MiniMaxAI/MiniMax-M2", Some("minimax"), "minimax_m2"),
    ("stepfun-ai/step3", Some("step3"), "step3"),
];

fn sim_for(model: &str, reasoning: Option<&str>, tools: &str) -> Sim {
    let mut flags = FAST.to_vec();
    if let Some(r) = reasoning {
        flags.extend_from_slice(&["--reasoning-markup", r]);
    }
    flags.extend_from_slice(&["--tool-call-markup", tools]);
    Sim::start(model, &flags)
}

const WEATHER: &str = r#"{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}"#;

fn chat(model: &str, extra: &str) -> String {
    format!(r#"{{"model":"{model}","messages":[{{"role":"user","content":"Weather?"}}]{extra}}}"#)
}

fn with_tools(model: &str, extra: &str) -> String {
    chat(model, &format!(r#","tools":[{WEATHER}]{extra}"#))
}

/// What one answer said, non-streamed or joined from its stream.
#[derive(Debug, Default)]
struct Said {
    content: String,
    reasoning: String,
    /// (id, name, arguments).
    calls: Vec<(String, String, String)>,
    finish: Vec<String>,
}

fn said(r: &Response, stream: bool) -> Said {
    assert_eq!(r.status, 200, "{}", r.text());
    let mut s = Said::default();
    if !stream {
        let v = r.json();
        let c = &v["choices"][0];
        let m = &c["message"];
        s.content = m["content"].as_str().unwrap_or_default().to_string();
        s.reasoning = m["reasoning_content"].as_str().unwrap_or_default().to_string();
        for call in m["tool_calls"].as_array().into_iter().flat_map(|a| a.iter()) {
            assert_eq!(call["type"].as_str(), Some("function"));
            let f = &call["function"];
            let (id, name) = (call["id"].as_str().unwrap(), f["name"].as_str().unwrap());
            s.calls.push((id.into(), name.into(), f["arguments"].as_str().unwrap().into()));
        }
        s.finish.push(c["finish_reason"].as_str().unwrap().to_string());
        return s;
    }
    let text = r.text();
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    for e in text.split_terminator("\n\n").filter(|e| *e != "data: [DONE]") {
        let v: Value = sonic_rs::from_str(e.strip_prefix("data: ").unwrap()).unwrap();
        for c in v["choices"].as_array().into_iter().flat_map(|a| a.iter()) {
            let d = &c["delta"];
            s.content.push_str(d["content"].as_str().unwrap_or_default());
            s.reasoning.push_str(d["reasoning_content"].as_str().unwrap_or_default());
            for call in d["tool_calls"].as_array().into_iter().flat_map(|a| a.iter()) {
                let k = call["index"].as_u64().unwrap() as usize;
                let f = &call["function"];
                if k == s.calls.len() {
                    // A call's first delta carries its id, type and name.
                    assert_eq!(call["type"].as_str(), Some("function"), "{e}");
                    let (id, name) = (call["id"].as_str().unwrap(), f["name"].as_str().unwrap());
                    s.calls.push((id.into(), name.into(), String::new()));
                }
                s.calls[k].2.push_str(f["arguments"].as_str().unwrap_or_default());
            }
            if let Some(f) = c["finish_reason"].as_str() {
                s.finish.push(f.to_string());
            }
        }
    }
    s
}

/// The one call is get_weather of a city the simulator names; returns the city.
fn weather_call(s: &Said, what: &str) -> String {
    assert_eq!(s.calls.len(), 1, "{what}: {s:?}");
    let (id, name, args) = &s.calls[0];
    assert_eq!(name, "get_weather", "{what}");
    assert!(!id.is_empty(), "{what}");
    let v: Value = sonic_rs::from_str(args).unwrap_or_else(|e| panic!("{what}: arguments {args:?}: {e}"));
    let city = v["city"].as_str().unwrap_or_else(|| panic!("{what}: {args}")).to_string();
    assert!(CITIES.contains(&city.as_str()), "{what}: {city}");
    city
}

#[test]
fn each_family_by_model_name_gives_reasoning_and_calls_streamed_and_not() {
    both_drivers(|legacy| {
        let sims: Vec<Sim> = FAMILIES.iter().map(|(m, r, t)| sim_for(m, *r, t)).collect();
        let gw = gateway(legacy, &sims.iter().collect::<Vec<_>>(), &[]);
        for &(model, reasoning, tools) in FAMILIES {
            for stream in [false, true] {
                let what = format!("{model} stream {stream}");
                let r =
                    post(gw.port, "/v1/chat/completions", &with_tools(model, &format!(r#","stream":{stream}"#)), &[]);
                let s = said(&r, stream);
                let city = weather_call(&s, &what);
                assert_eq!(s.finish, ["tool_calls"], "{what}: once, on the last chunk");
                let alone = smg_parsers::markup::stands_alone(tools);
                let answer = if alone { "" } else { "Let me look that up." };
                match reasoning {
                    Some(_) => {
                        assert_eq!(s.reasoning, format!("The user asks about {city}."), "{what}");
                        assert_eq!(s.content, format!("\n\n{answer}"), "{what}");
                    }
                    None => {
                        assert_eq!(s.reasoning, "", "{what}");
                        assert_eq!(s.content, answer, "{what}");
                    }
                }
                for marker in ["<think>", "</think>", "◁think▷", "◁/think▷"] {
                    assert!(!s.reasoning.contains(marker) && !s.content.contains(marker), "{what}: {s:?}");
                }
            }
        }
    });
}

#[test]
fn requests_turn_parsing_off_and_undeclared_calls_stay_text() {
    both_drivers(|legacy| {
        let qwen = sim_for("Qwen/Qwen3-8B", Some("qwen3"), "qwen");
        let gw = gateway(legacy, &[&qwen], &[]);
        let m = "Qwen/Qwen3-8B";
        for stream in [false, true] {
            let st = format!(r#","stream":{stream}"#);
            // No tools offered, or tool_choice none: the markup stays content.
            for body in [chat(m, &st), with_tools(m, &format!(r#"{st},"tool_choice":"none""#))] {
                let s = said(&post(gw.port, "/v1/chat/completions", &body, &[]), stream);
                assert!(s.calls.is_empty(), "{s:?}");
                assert!(
                    s.content.starts_with("\n\nLet me look that up.<tool_call>\n{\"name\": \"get_weather\""),
                    "{s:?}"
                );
                assert!(s.content.ends_with("}\n</tool_call>"), "{s:?}");
                assert_eq!(s.finish, ["stop"]);
                assert!(s.reasoning.starts_with("The user asks about "), "{s:?}");
            }
            // A call to a function the request does not offer is not a call.
            let other = WEATHER.replace("get_weather", "get_time");
            let body = chat(m, &format!(r#"{st},"tools":[{other}]"#));
            let s = said(&post(gw.port, "/v1/chat/completions", &body, &[]), stream);
            assert!(s.calls.is_empty() && s.content.contains("<tool_call>"), "{s:?}");
            assert_eq!(s.finish, ["stop"]);
            // separate_reasoning: false keeps the think block in the text.
            let s = said(
                &post(
                    gw.port,
                    "/v1/chat/completions",
                    &with_tools(m, &format!(r#"{st},"separate_reasoning":false"#)),
                    &[],
                ),
                stream,
            );
            assert!(s.content.starts_with("<think>The user asks about ") && s.reasoning.is_empty(), "{s:?}");
            weather_call(&s, "separate_reasoning false");
        }
        // stream_reasoning: false sends the reasoning in one piece.
        let body = with_tools(m, r#","stream":true,"stream_reasoning":false"#);
        let text = post(gw.port, "/v1/chat/completions", &body, &[]).text();
        assert_eq!(text.matches("\"reasoning_content\"").count(), 1, "{text}");
        let per_byte = post(gw.port, "/v1/chat/completions", &with_tools(m, r#","stream":true"#), &[]).text();
        assert!(per_byte.matches("\"reasoning_content\"").count() > 1, "streamed as it comes: {per_byte}");
    });
}

#[test]
fn flags_choose_the_parsers_and_unknown_names_stop_the_start() {
    for (flag, known) in [("--reasoning-parser", "deepseek_r1"), ("--tool-call-parser", "kimik2")] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_smg"))
            .args(["launch", "--worker-urls", "grpc://127.0.0.1:1", flag, "nope"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{flag} nope: started");
        assert!(err.contains(&format!("{flag}: unknown parser 'nope' (known: ")) && err.contains(known), "{err}");
    }
    both_drivers(|legacy| {
        // A model of no known family: its text is untouched without flags …
        let plain = sim_for("sim-model", Some("deepseek_r1"), "json");
        let gw = gateway(legacy, &[&plain], &[]);
        let s = said(&post(gw.port, "/v1/chat/completions", &with_tools("sim-model", ""), &[]), false);
        assert!(s.content.starts_with("<think>") && s.calls.is_empty() && s.reasoning.is_empty(), "{s:?}");
        drop(gw);
        // … and parsed by the families the flags name.
        let gw = gateway(legacy, &[&plain], &["--reasoning-parser", "deepseek_r1", "--tool-call-parser", "json"]);
        for stream in [false, true] {
            let s = said(
                &post(
                    gw.port,
                    "/v1/chat/completions",
                    &with_tools("sim-model", &format!(r#","stream":{stream}"#)),
                    &[],
                ),
                stream,
            );
            let city = weather_call(&s, "json by flag");
            assert_eq!(s.reasoning, format!("The user asks about {city}."));
            // The json family reads the whole answer as the call list: the blank line after the
            // think block goes with it.
            assert_eq!(s.content, "");
            assert_eq!(s.finish, ["tool_calls"]);
            assert!(s.calls[0].0.starts_with("call_") && s.calls[0].0.len() == 29, "{:?}", s.calls[0]);
        }
    });
}

#[test]
fn minimax_answers_are_scanned_for_calls_without_tools() {
    both_drivers(|legacy| {
        let minimax = sim_for("MiniMaxAI/MiniMax-M2", Some("minimax"), "minimax_m2");
        let gw = gateway(legacy, &[&minimax], &[]);
        for stream in [false, true] {
            let body = chat("MiniMaxAI/MiniMax-M2", &format!(r#","stream":{stream}"#));
            let s = said(&post(gw.port, "/v1/chat/completions", &body, &[]), stream);
            weather_call(&s, "minimax without tools");
            assert_eq!(s.finish, ["tool_calls"]);
        }
    });
}

#[test]
fn kimi_call_ids_count_the_calls_already_in_the_conversation() {
    both_drivers(|legacy| {
        let kimi = sim_for("moonshotai/Kimi-K2-Instruct", Some("kimi"), "kimik2");
        let gw = gateway(legacy, &[&kimi], &[]);
        let history = r#""messages":[{"role":"user","content":"Weather?"},
            {"role":"assistant","content":"","tool_calls":[{"id":"functions.get_weather:0","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},
            {"role":"tool","tool_call_id":"functions.get_weather:0","content":"sunny"},
            {"role":"user","content":"And tomorrow?"}]"#;
        for stream in [false, true] {
            let body =
                format!(r#"{{"model":"moonshotai/Kimi-K2-Instruct",{history},"tools":[{WEATHER}],"stream":{stream}}}"#);
            let s = said(&post(gw.port, "/v1/chat/completions", &body, &[]), stream);
            weather_call(&s, "kimi");
            assert_eq!(s.calls[0].0, "functions.get_weather:1", "stream {stream}");
            // The profile's rule: tools declared on a content-less system message are offered.
            let body = format!(
                r#"{{"model":"moonshotai/Kimi-K2-Instruct","messages":[{{"role":"system","tools":[{WEATHER}]}},{{"role":"user","content":"Weather?"}}],"stream":{stream}}}"#
            );
            let s = said(&post(gw.port, "/v1/chat/completions", &body, &[]), stream);
            weather_call(&s, "kimi, system tools");
            assert_eq!(s.calls[0].0, "functions.get_weather:0");
        }
    });
}

#[test]
fn a_forced_call_sends_one_json_schema_and_reads_the_constrained_answer() {
    both_drivers(|legacy| {
        let sim = Sim::start("Qwen/Qwen3-8B", FAST);
        let gw = gateway(legacy, &[&sim], &[]);
        let m = "Qwen/Qwen3-8B";
        let last = || sim.stats()["grpc"]["last_generate"].clone();
        // Named: the engine holds the function's parameter schema, and its answer (the bare
        // arguments, here said through sim_output) is the call.
        let output = r#","custom_params":{"sim_output":"{\"city\": \"Zürich\"}"}"#;
        for stream in [false, true] {
            let body = with_tools(
                m,
                &format!(
                    r#","tool_choice":{{"type":"function","function":{{"name":"get_weather"}}}},"stream":{stream}{output}"#
                ),
            );
            let s = said(&post(gw.port, "/v1/chat/completions", &body, &[]), stream);
            assert_eq!(weather_call(&s, "named"), "Zürich");
            assert_eq!(s.finish, ["tool_calls"]);
            let l = last();
            assert_eq!(l["constraint"].as_str(), Some("json_schema"));
            let schema: Value = sonic_rs::from_str(l["constraint_text"].as_str().unwrap()).unwrap();
            assert_eq!(schema["properties"]["city"]["type"].as_str(), Some("string"), "{schema:?}");
        }
        // Required: an array of {name, parameters} over the offered tools.
        let output =
            r#","custom_params":{"sim_output":"[{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}]"}"#;
        let body = with_tools(m, &format!(r#","tool_choice":"required"{output}"#));
        let s = said(&post(gw.port, "/v1/chat/completions", &body, &[]), false);
        assert_eq!(weather_call(&s, "required"), "Paris");
        let schema: Value = sonic_rs::from_str(last()["constraint_text"].as_str().unwrap()).unwrap();
        assert_eq!(schema["type"].as_str(), Some("array"));
        let any = schema["items"]["anyOf"].as_array().unwrap();
        assert_eq!(any.len(), 1);
        assert_eq!(any[0]["properties"]["name"]["enum"][0].as_str(), Some("get_weather"));
        assert_eq!(any[0]["properties"]["parameters"]["properties"]["city"]["type"].as_str(), Some("string"));
        // Auto: no constraint.
        post(gw.port, "/v1/chat/completions", &with_tools(m, ""), &[]);
        assert!(last()["constraint"].is_null());
    });
}

#[test]
fn a_template_that_opens_the_think_block_starts_the_answer_inside_it() {
    // DeepSeek-R1's template has no thinking toggle and always ends the prompt with an open
    // `<think>`: the model's answer starts in the middle of its reasoning.
    let dir = tokenizer_dir_with_template("{% for m in messages %}{{ m.content }}{% endfor %}<think>\n");
    both_drivers(|legacy| {
        let sim = Sim::start("deepseek-ai/DeepSeek-R1", FAST);
        let gw = gateway(legacy, &[&sim], &["--tokenizer-path", dir.to_str().unwrap()]);
        let said_ = r#","custom_params":{"sim_output":"I ponder.</think>\n\nAnswer."}"#;
        for stream in [false, true] {
            let body = chat("deepseek-ai/DeepSeek-R1", &format!(r#"{said_},"stream":{stream}"#));
            let s = said(&post(gw.port, "/v1/chat/completions", &body, &[]), stream);
            assert_eq!((s.reasoning.as_str(), s.content.as_str()), ("I ponder.", "\n\nAnswer."), "stream {stream}");
        }
    });
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn gpt_oss_renders_harmony_and_reads_its_channels() {
    both_drivers(|legacy| {
        // A gpt-oss model: the simulator answers in Harmony (special tokens as their ids),
        // calling get_weather when the prompt declares it.
        let m = "openai/gpt-oss-20b";
        let sim = Sim::start(m, FAST);
        let gw = gateway(legacy, &[&sim], &[]);
        for stream in [false, true] {
            let st = if stream {
                r#","stream":true,"stream_options":{"include_usage":true}"#.to_string()
            } else {
                String::new()
            };
            let what = format!("stream {stream}");
            let r = post(gw.port, "/v1/chat/completions", &with_tools(m, &st), &[]);
            let s = said(&r, stream);
            let city = weather_call(&s, &what);
            assert_eq!(s.reasoning, format!("The user asks about {city}."), "{what}");
            assert_eq!((s.content.as_str(), s.finish.as_slice()), ("", &["tool_calls".to_string()][..]), "{what}");
            // No tools: the final channel is the content.
            let s = said(&post(gw.port, "/v1/chat/completions", &chat(m, &st), &[]), stream);
            assert!(s.calls.is_empty(), "{what}: {s:?}");
            assert!(s.reasoning.starts_with("The user asks about "), "{what}: {s:?}");
            assert!(
                s.content.starts_with("The weather in ") && s.content.ends_with(" is mild today."),
                "{what}: {s:?}"
            );
            assert_eq!(s.finish, ["stop"], "{what}");
            for text in [&s.content, &s.reasoning] {
                assert!(!text.contains("<|"), "{what}: no Harmony token reaches the answer: {s:?}");
            }
        }
        // separate_reasoning: false: the reasoning is content (before the answer), no marker.
        for stream in [false, true] {
            let body = chat(m, &format!(r#","stream":{stream},"separate_reasoning":false"#));
            let s = said(&post(gw.port, "/v1/chat/completions", &body, &[]), stream);
            assert!(s.reasoning.is_empty(), "{s:?}");
            assert!(s.content.starts_with("The user asks about ") && s.content.ends_with(" is mild today."), "{s:?}");
            assert!(!s.content.contains("<|"), "{s:?}");
        }
        // The gateway counts the reasoning tokens (the simulator says one token a byte).
        let v = post(gw.port, "/v1/chat/completions", &chat(m, ""), &[]).json();
        let reasoning = v["usage"]["completion_tokens_details"]["reasoning_tokens"].as_u64();
        let text = v["choices"][0]["message"]["reasoning_content"].as_str().unwrap_or_default();
        assert_eq!(reasoning, Some(text.len() as u64), "{v:?}");

        // The prompt is Harmony, rendered by the gateway (the simulator echoes it): effort
        // clamped to Harmony's levels, the tools as a TypeScript namespace.
        for (effort, level) in [("xhigh", "high"), ("minimal", "low"), ("none", "low"), ("turbo", "medium")] {
            let body = with_tools(
                m,
                &format!(
                    r#","reasoning_effort":"{effort}","custom_params":{{"sim_echo_prompt":true}},"separate_reasoning":false"#
                ),
            );
            let v = post(gw.port, "/v1/chat/completions", &body, &[]).json();
            let echoed = format!(
                "{}{}",
                v["choices"][0]["message"]["reasoning_content"].as_str().unwrap_or(""),
                v["choices"][0]["message"]["content"].as_str().unwrap_or("")
            );
            assert!(echoed.contains(&format!("Reasoning: {level}\n")), "{effort}: {echoed}");
            assert!(
                echoed.contains("namespace functions {\n\ntype get_weather = (_: {\ncity: string,\n}) => any;"),
                "{echoed}"
            );
        }

        // What has no Harmony form: 400 harmony_build_failed, nothing generated.
        let image = r#"{"model":"openai/gpt-oss-20b","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,AA=="}}]}]}"#;
        let r = post(gw.port, "/v1/chat/completions", image, &[]);
        assert_eq!(r.status, 400, "{}", r.text());
        assert_eq!(r.json()["error"]["code"].as_str(), Some("harmony_build_failed"), "{}", r.text());
    });
}
