//! Scripted engine messages through the assembler, with the simulator's byte-level tokenizer:
//! what a client would read, with no socket and no clock.

use std::sync::{Arc, OnceLock};

use smg_loadtest::sim::tokenizer as sim;
use smg_proto::scheduler::generate_response::Response;
use smg_proto::scheduler::{GenerateComplete, GenerateStreamChunk, TopLogProbs};
use sonic_rs::{JsonContainerTrait, JsonValueTrait, Value};

use super::*;
use crate::grpc::model::GrpcModel;
use crate::grpc::output::PassThrough;
use crate::grpc::request;

fn model() -> &'static GrpcModel {
    static M: OnceLock<GrpcModel> = OnceLock::new();
    M.get_or_init(|| {
        let tok = Tokenizer::from_parts(sim::tokenizer_json().as_bytes(), Some(&sim::tokenizer_config_json()), None)
            .expect("the simulator's tokenizer");
        GrpcModel {
            tokenizer: Arc::new(tok),
            max_context: None,
            eos_ids: vec![sim::IM_END_ID],
            supports_vision: false,
            is_generation: true,
            defaults: Default::default(),
            parsers: Default::default(),
            harmony: None,
        }
    })
}

fn tok() -> &'static Tokenizer {
    &model().tokenizer
}

fn prepare(kind: Kind, body: &str) -> Prepared {
    let doc: Value = sonic_rs::from_str(body).unwrap();
    request::prepare(kind, &doc, model()).unwrap()
}

/// Vocabulary entries by their byte-level spelling (`Ġ` a space, `Ã` `©` the two bytes of
/// "é"), one token each.
fn toks(pieces: &[&str]) -> Vec<u32> {
    pieces.iter().map(|p| tok().token_to_id(p).unwrap_or_else(|| panic!("{p:?} is not a token"))).collect()
}

/// `text` as the simulator says it: one token per word, a space leading each word but the
/// first (a leading space leads the first too).
fn words(text: &str) -> Vec<u32> {
    let spelled: Vec<String> = text
        .split(' ')
        .enumerate()
        .filter(|(_, w)| !w.is_empty())
        .map(|(i, w)| if i == 0 { w.to_string() } else { format!("Ġ{w}") })
        .collect();
    toks(&spelled.iter().map(String::as_str).collect::<Vec<_>>())
}

/// Log-probabilities for `ids`: token `k` of the whole output gets −(k+1)/10, and itself as
/// its one alternative.
fn lps(ids: &[u32], first: usize) -> OutputLogProbs {
    let vals: Vec<f32> = (first..first + ids.len()).map(|k| -((k + 1) as f32) / 10.0).collect();
    OutputLogProbs {
        token_logprobs: vals.clone(),
        token_ids: ids.to_vec(),
        top_logprobs: ids
            .iter()
            .zip(&vals)
            .map(|(&id, &v)| TopLogProbs { values: vec![v], token_ids: vec![id] })
            .collect(),
        token_ids_logprobs: vec![],
    }
}

/// A stream chunk of sample `index`; `done` tokens came before it.
fn chunk(index: u32, ids: &[u32], done: usize) -> GenerateResponse {
    GenerateResponse {
        request_id: "r".into(),
        response: Some(Response::Chunk(GenerateStreamChunk {
            token_ids: ids.to_vec(),
            prompt_tokens: 5,
            completion_tokens: (done + ids.len()) as u32,
            cached_tokens: 1,
            output_logprobs: Some(lps(ids, done)),
            index,
            ..Default::default()
        })),
    }
}

/// The end of sample `index` after `total` tokens (`ids`: the whole output, unless streamed).
fn complete(index: u32, ids: &[u32], total: usize, reason: &str) -> GenerateResponse {
    GenerateResponse {
        request_id: "r".into(),
        response: Some(Response::Complete(GenerateComplete {
            output_ids: ids.to_vec(),
            finish_reason: reason.into(),
            prompt_tokens: 5,
            completion_tokens: total as u32,
            cached_tokens: 1,
            output_logprobs: Some(lps(ids, 0)),
            index,
            ..Default::default()
        })),
    }
}

/// What the client got.
#[derive(Debug)]
struct Run {
    /// Each SSE event's JSON, `[DONE]` left out.
    events: Vec<Value>,
    done: bool,
    body: Option<Value>,
    steps: Vec<String>,
    /// `finish`'s error (the engine ended before every choice finished).
    incomplete: Option<Status>,
    usage: Usage,
}

/// Drives the assembler as src/serve/grpc.rs does: a prompt whose messages said Abort gets
/// no more, a failure ends the script with the error events.
fn run(kind: Kind, prep: &Prepared, deepseek: bool, script: Vec<(usize, GenerateResponse)>) -> Run {
    run_with(kind, prep, deepseek, script, |_| Box::new(PassThrough))
}

fn run_with(
    kind: Kind,
    prep: &Prepared,
    deepseek: bool,
    script: Vec<(usize, GenerateResponse)>,
    mut parser: impl FnMut(usize) -> Box<dyn OutputParser>,
) -> Run {
    let meta = Meta { kind, id: "cmpl-1", created: 7, model: "m" };
    let mut asm = Assembler::new(prep, tok(), meta, deepseek, |i| parser(i));
    let mut sse = Vec::new();
    let mut aborted = vec![false; prep.prompts.len()];
    let mut steps = Vec::new();
    let mut failed = false;
    for (p, msg) in script {
        if aborted[p] {
            continue;
        }
        let step = asm.on_message(p, msg);
        steps.push(format!("{step:?}"));
        sse.extend_from_slice(asm.pending());
        asm.sent();
        match step {
            Step::Next => {}
            Step::Abort => aborted[p] = true,
            Step::Failed(s) => {
                asm.fail(&s);
                failed = true;
                break;
            }
        }
    }
    let (mut body, mut incomplete) = (None, None);
    if !failed {
        match asm.finish() {
            Ok(Answer::Events) => {}
            Ok(Answer::Body(b)) => body = Some(sonic_rs::from_slice(&b).unwrap()),
            Err(s) => incomplete = Some(s),
        }
    }
    sse.extend_from_slice(asm.pending());
    let (events, done) = parse_sse(&sse);
    Run { events, done, body, steps, incomplete, usage: asm.usage() }
}

fn parse_sse(sse: &[u8]) -> (Vec<Value>, bool) {
    let s = std::str::from_utf8(sse).unwrap();
    let mut events = Vec::new();
    let mut done = false;
    for e in s.split_terminator("\n\n") {
        let data = e.strip_prefix("data: ").unwrap_or_else(|| panic!("not an SSE event: {e:?}"));
        assert!(!done, "an event after [DONE]");
        if data == "[DONE]" {
            done = true;
        } else {
            events.push(sonic_rs::from_str(data).unwrap());
        }
    }
    (events, done)
}

impl Run {
    /// Choice `i`'s entries, event by event.
    fn choice(&self, i: u64) -> impl Iterator<Item = &Value> {
        self.events.iter().flat_map(move |e| {
            e["choices"].as_array().into_iter().flat_map(|a| a.iter()).filter(move |c| c["index"].as_u64() == Some(i))
        })
    }

    /// Choice `i`'s streamed text.
    fn text(&self, i: u64) -> String {
        self.choice(i).filter_map(|c| c["delta"]["content"].as_str().or(c["text"].as_str())).collect()
    }

    fn finish(&self, i: u64) -> Vec<String> {
        self.choice(i).filter_map(|c| c["finish_reason"].as_str().map(str::to_string)).collect()
    }

    /// Each event's `usage`: "-" absent, "null", else its completion_tokens.
    fn usages(&self) -> Vec<String> {
        self.events
            .iter()
            .map(|e| match e.get("usage") {
                None => "-".to_string(),
                Some(u) if u.is_null() => "null".to_string(),
                Some(u) => u["completion_tokens"].as_u64().unwrap().to_string(),
            })
            .collect()
    }

    /// Choice `i`'s text in the whole body.
    fn body_text(&self, i: usize) -> String {
        let c = &self.body.as_ref().expect("a body")["choices"][i];
        c["message"]["content"].as_str().or(c["text"].as_str()).unwrap().to_string()
    }

    /// Completions' logprobs of choice `i`, chunks laid end to end: tokens and offsets.
    fn legacy_logprobs(&self, i: u64) -> (Vec<String>, Vec<u64>) {
        let (mut tokens, mut offsets) = (Vec::new(), Vec::new());
        for c in self.choice(i) {
            let lp = &c["logprobs"];
            if lp.is_null() {
                continue;
            }
            tokens.extend(lp["tokens"].as_array().unwrap().iter().map(|t| t.as_str().unwrap().to_string()));
            offsets.extend(lp["text_offset"].as_array().unwrap().iter().map(|o| o.as_u64().unwrap()));
        }
        (tokens, offsets)
    }
}

/// A streamed sample: its tokens in messages of the given sizes, then the engine's end.
fn streamed(index: u32, tokens: &[u32], sizes: &[usize], reason: &str) -> Vec<GenerateResponse> {
    let mut out = Vec::new();
    let mut at = 0;
    for &s in sizes {
        out.push(chunk(index, &tokens[at..at + s], at));
        at += s;
    }
    out.push(complete(index, &[], at, reason));
    out
}

fn on(p: usize, msgs: Vec<GenerateResponse>) -> Vec<(usize, GenerateResponse)> {
    msgs.into_iter().map(|m| (p, m)).collect()
}

#[test]
fn chat_streams_a_role_chunk_then_text_then_the_finish() {
    let prep = prepare(Kind::Chat, r#"{"messages":[{"role":"user","content":"hi"}],"stream":true}"#);
    let out = words("hello world the");
    let r = run(Kind::Chat, &prep, false, on(0, streamed(0, &out, &[1, 2], "length")));
    let first = &r.events[0]["choices"][0];
    assert_eq!(first["delta"]["role"].as_str(), Some("assistant"));
    assert_eq!(first["delta"]["content"].as_str(), Some(""));
    assert_eq!(r.events[0]["object"].as_str(), Some("chat.completion.chunk"));
    assert_eq!(r.text(0), "hello world the");
    assert_eq!(r.finish(0), ["length"]);
    assert_eq!(r.usages(), ["-"; 4], "no usage asked for");
    assert!(r.done && r.body.is_none() && r.incomplete.is_none());
    assert_eq!(r.steps, ["Next"; 3]);
    assert_eq!((r.usage.prompt, r.usage.cached, r.usage.completion), (5, 1, 3));
}

#[test]
fn a_whole_body_for_chat_and_completions() {
    let out = words("hello world");
    let prep = prepare(Kind::Chat, r#"{"messages":[{"role":"user","content":"hi"}]}"#);
    let r = run(Kind::Chat, &prep, false, vec![(0, complete(0, &out, 2, "stop"))]);
    let b = r.body.as_ref().unwrap();
    assert_eq!(b["object"].as_str(), Some("chat.completion"));
    assert_eq!(r.body_text(0), "hello world");
    assert_eq!(b["choices"][0]["finish_reason"].as_str(), Some("stop"));
    assert!(b["choices"][0]["logprobs"].is_null());
    assert_eq!(b["usage"]["total_tokens"].as_u64(), Some(7));
    assert!(r.events.is_empty() && !r.done);

    let prep = prepare(Kind::Completions, r#"{"prompt":"say"}"#);
    let out = words(" hello world");
    let r = run(Kind::Completions, &prep, false, vec![(0, complete(0, &out, 2, "length"))]);
    // A completion continues its prompt: its first token keeps its leading space.
    assert_eq!(r.body_text(0), " hello world");
    assert_eq!(r.body.as_ref().unwrap()["choices"][0]["finish_reason"].as_str(), Some("length"));
    assert_eq!(r.body.as_ref().unwrap()["object"].as_str(), Some("text_completion"));
}

#[test]
fn n_two_with_interleaved_samples() {
    let prep = prepare(Kind::Chat, r#"{"messages":[{"role":"user","content":"hi"}],"stream":true,"n":2}"#);
    let (a, b) = (words("hello world"), words("the river"));
    let script = vec![
        (0, chunk(1, &b[..1], 0)),
        (0, chunk(0, &a[..1], 0)),
        (0, chunk(0, &a[1..], 1)),
        (0, chunk(1, &b[1..], 1)),
        (0, complete(1, &[], 2, "stop")),
        (0, complete(0, &[], 2, "length")),
    ];
    let r = run(Kind::Chat, &prep, false, script);
    assert_eq!((r.text(0), r.text(1)), ("hello world".into(), "the river".into()));
    assert_eq!((r.finish(0), r.finish(1)), (vec!["length".to_string()], vec!["stop".to_string()]));
    assert_eq!(r.choice(1).filter(|c| c["delta"]["role"].as_str().is_some()).count(), 1, "one role chunk each");
    assert_eq!(r.choice(0).filter(|c| c["delta"]["role"].as_str().is_some()).count(), 1);
    assert_eq!(r.usage.completion, 4);

    // Not streamed: SGLang's Completes all say index 0; arrival order numbers them.
    let prep = prepare(Kind::Chat, r#"{"messages":[{"role":"user","content":"hi"}],"n":2}"#);
    let script = vec![(0, complete(0, &a, 2, "stop")), (0, complete(0, &b, 2, "length"))];
    let r = run(Kind::Chat, &prep, false, script);
    assert_eq!((r.body_text(0), r.body_text(1)), ("hello world".into(), "the river".into()));
    let c = &r.body.as_ref().unwrap()["choices"];
    assert_eq!((c[0]["index"].as_u64(), c[1]["index"].as_u64()), (Some(0), Some(1)));
    assert_eq!(c[1]["finish_reason"].as_str(), Some("length"));
}

#[test]
fn a_completions_batch_numbers_choices_by_prompt_then_sample() {
    let body = r#"{"prompt":["say","tell"],"n":2,"stream":true}"#;
    let prep = prepare(Kind::Completions, body);
    assert_eq!(prep.prompts.len(), 2);
    let (a, b) = (words(" hello"), words(" world"));
    let mut script = Vec::new();
    for (p, t) in [(1, &b), (0, &a)] {
        script.extend(on(p, streamed(1, t, &[1], "stop")));
        script.extend(on(p, streamed(0, t, &[1], "length")));
    }
    let r = run(Kind::Completions, &prep, false, script);
    assert_eq!([r.text(0), r.text(1), r.text(2), r.text(3)], [" hello", " hello", " world", " world"]);
    assert_eq!(r.finish(3), ["stop"]);
    assert_eq!(r.finish(2), ["length"]);
    // Each prompt's counters once, each sample's completion tokens.
    assert_eq!((r.usage.prompt, r.usage.cached, r.usage.completion), (10, 2, 4));

    let prep = prepare(Kind::Completions, r#"{"prompt":["say","tell"]}"#);
    let script = vec![(1, complete(0, &b, 1, "stop")), (0, complete(0, &a, 1, "stop"))];
    let r = run(Kind::Completions, &prep, false, script);
    assert_eq!((r.body_text(0), r.body_text(1)), (" hello".into(), " world".into()));
    assert_eq!(r.body.as_ref().unwrap()["usage"]["prompt_tokens"].as_u64(), Some(10));
}

/// Every way of cutting `tokens` into consecutive non-empty messages.
fn cuts(len: usize) -> impl Iterator<Item = Vec<usize>> {
    (0..1u32 << (len - 1)).map(move |mask| {
        let mut sizes = vec![1];
        for j in 0..len - 1 {
            if mask & (1 << j) != 0 {
                sizes.push(1);
            } else {
                *sizes.last_mut().unwrap() += 1;
            }
        }
        sizes
    })
}

#[test]
fn the_same_tokens_cut_at_every_message_boundary_read_the_same() {
    // "é" is two byte tokens (half a character per token); "END" three.
    let tokens = toks(&["hello", "Ġworld", "Ġ", "Ã", "©", "Ġ", "E", "N", "D", "Ġthe"]);
    // What the request adds, the text, the finish reason, and how many tokens' log-probabilities
    // are shown (up to the one that completed the stop).
    let cases = [
        ("", "hello world é END the", "length", 10),
        (r#","stop":"END""#, "hello world é ", "stop", 9),
        (r#","stop":["é E","zz"]"#, "hello world ", "stop", 7),
        (r#","stop":"END","no_stop_trim":true"#, "hello world é END", "stop", 9),
    ];
    for (extra, want, reason, shown) in cases {
        for kind in [Kind::Chat, Kind::Completions] {
            let body = match kind {
                Kind::Chat => format!(r#"{{"messages":[{{"role":"user","content":"hi"}}],"stream":true{extra}}}"#),
                Kind::Completions | Kind::Generate => {
                    format!(r#"{{"prompt":"say","stream":true,"logprobs":1{extra}}}"#)
                }
            };
            let prep = prepare(kind, &body);
            // Not streamed: the reference.
            let whole = prepare(kind, &body.replace(r#""stream":true"#, r#""stream":false"#));
            let r = run(kind, &whole, false, vec![(0, complete(0, &tokens, tokens.len(), "length"))]);
            assert_eq!(r.body_text(0), want, "{extra}");
            let mut reference = None;
            for sizes in cuts(tokens.len()) {
                let r = run(kind, &prep, false, on(0, streamed(0, &tokens, &sizes, "length")));
                let got = (r.text(0), r.finish(0), r.legacy_logprobs(0), r.done, r.usage);
                assert_eq!(got.0, want, "{extra} {kind:?} cut {sizes:?}");
                assert_eq!(got.1, [reason], "{extra} {kind:?} cut {sizes:?}");
                let lp_tokens = if kind == Kind::Completions { shown } else { 0 };
                assert_eq!(got.2 .0.len(), lp_tokens, "{extra} {kind:?} cut {sizes:?}");
                // A stop the gateway found ends the engine request early.
                assert_eq!(r.steps.last().unwrap() == "Abort", reason == "stop", "{extra} {sizes:?}");
                let reference = reference.get_or_insert_with(|| got.clone());
                if reason == "stop" {
                    // The token count is the engine's, up to the message the stop was in.
                    assert_eq!((&got.0, &got.1, &got.2), (&reference.0, &reference.1, &reference.2), "{sizes:?}");
                } else {
                    assert_eq!(&got, reference, "{extra} {kind:?} cut {sizes:?}");
                }
            }
        }
    }
}

#[test]
fn a_stop_in_one_sample_waits_for_the_others_before_aborting() {
    let prep = prepare(Kind::Chat, r#"{"messages":[{"role":"user","content":"hi"}],"stream":true,"n":2,"stop":"END"}"#);
    let (a, b) = (toks(&["hello", "Ġ", "E", "N", "D", "Ġworld"]), words("the river"));
    let script = vec![
        (0, chunk(0, &a, 0)),
        (0, chunk(1, &b, 0)),
        (0, complete(1, &[], b.len(), "stop")),
        (0, chunk(0, &a, a.len())),
    ];
    let r = run(Kind::Chat, &prep, false, script);
    assert_eq!(r.steps, ["Next", "Next", "Abort"], "sample 1's end finished both");
    assert_eq!((r.text(0), r.text(1)), ("hello ".into(), "the river".into()));
    assert!(r.incomplete.is_none() && r.done);
}

#[test]
fn chat_logprobs_go_with_the_text_they_released() {
    let body = r#"{"messages":[{"role":"user","content":"hi"}],"stream":true,"logprobs":true,"top_logprobs":1}"#;
    let prep = prepare(Kind::Chat, body);
    let t = toks(&["Ã", "©", "Ġhello"]);
    // é's first byte releases no text: its log-probability waits for the second's chunk.
    let r = run(Kind::Chat, &prep, false, on(0, streamed(0, &t, &[1, 1, 1], "stop")));
    let with_text: Vec<&Value> =
        r.choice(0).filter(|c| c["delta"]["content"].as_str().is_some_and(|s| !s.is_empty())).collect();
    assert_eq!(with_text.len(), 2);
    let content = with_text[0]["logprobs"]["content"].as_array().unwrap();
    assert_eq!(content.len(), 2);
    assert_eq!(content[0]["bytes"].as_array().unwrap().len(), 1, "a token's own bytes");
    assert_eq!(content[1]["logprob"].as_f64().map(|v| (v * 10.0).round()), Some(-2.0));
    assert_eq!(content[1]["top_logprobs"].as_array().unwrap().len(), 1);
    let last = r.choice(0).last().unwrap();
    assert_eq!(last["finish_reason"].as_str(), Some("stop"));
    assert!(last["logprobs"]["content"].is_null(), "nothing left for the finish chunk");

    let prep = prepare(Kind::Chat, r#"{"messages":[{"role":"user","content":"hi"}],"logprobs":true}"#);
    let r = run(Kind::Chat, &prep, false, vec![(0, complete(0, &t, t.len(), "stop"))]);
    let content = r.body.as_ref().unwrap()["choices"][0]["logprobs"]["content"].as_array().unwrap().len();
    assert_eq!(content, t.len());
}

#[test]
fn completions_logprobs_count_offsets_from_the_echo() {
    let prep = prepare(Kind::Completions, r#"{"prompt":"say","echo":true,"logprobs":0}"#);
    let t = words(" hello world");
    let r = run(Kind::Completions, &prep, false, vec![(0, complete(0, &t, t.len(), "stop"))]);
    assert_eq!(r.body_text(0), "say hello world");
    let lp = &r.body.as_ref().unwrap()["choices"][0]["logprobs"];
    let offsets: Vec<u64> = lp["text_offset"].as_array().unwrap().iter().map(|o| o.as_u64().unwrap()).collect();
    assert_eq!(offsets, [3, 9]);
    assert!(lp["top_logprobs"].is_null(), "none asked for");
    assert_eq!(lp["tokens"].as_array().unwrap().len(), 2);
}

#[test]
fn echo_and_suffix_frame_each_choice() {
    let body = r#"{"prompt":["say","tell"],"echo":true,"suffix":"!","stream":true}"#;
    let prep = prepare(Kind::Completions, body);
    let t = words(" hello world");
    let mut script = on(0, streamed(0, &t, &[1, 1], "stop"));
    script.extend(on(1, streamed(0, &t, &[2], "length")));
    let r = run(Kind::Completions, &prep, false, script);
    assert_eq!((r.text(0), r.text(1)), ("say hello world!".into(), "tell hello world!".into()));
    assert_eq!(r.choice(0).next().unwrap()["text"].as_str(), Some("say hello"), "the echo leads the first chunk");
    assert_eq!(r.choice(0).last().unwrap()["text"].as_str(), Some("!"), "the suffix ends the finish chunk");

    let prep = prepare(Kind::Completions, r#"{"prompt":"say","echo":true,"suffix":"!"}"#);
    let r = run(Kind::Completions, &prep, false, vec![(0, complete(0, &t, 2, "stop"))]);
    assert_eq!(r.body_text(0), "say hello world!");
}

#[test]
fn include_usage_adds_one_usage_chunk_at_the_end() {
    let body = r#"{"messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true}}"#;
    let prep = prepare(Kind::Chat, body);
    let r = run(Kind::Chat, &prep, false, on(0, streamed(0, &words("hello world"), &[1, 1], "stop")));
    assert_eq!(r.usages(), ["-", "-", "-", "-", "2"]);
    let last = r.events.last().unwrap();
    assert!(last["choices"].as_array().unwrap().is_empty());
    assert_eq!(last["usage"]["prompt_tokens"].as_u64(), Some(5));
    assert!(r.done);
}

#[test]
fn continuous_usage_stats_put_the_running_usage_on_every_chunk() {
    let body = r#"{"messages":[{"role":"user","content":"hi"}],"stream":true,
        "stream_options":{"include_usage":true,"continuous_usage_stats":true}}"#;
    let prep = prepare(Kind::Chat, body);
    let r = run(Kind::Chat, &prep, false, on(0, streamed(0, &words("hello world"), &[1, 1], "stop")));
    assert_eq!(r.usages(), ["1", "1", "2", "2", "2"], "role, hello, world, finish, the usage chunk");
}

#[test]
fn deepseeks_usage_is_null_until_the_last_finish_chunk() {
    let body = r#"{"messages":[{"role":"user","content":"hi"}],"stream":true,"n":2,
        "stream_options":{"include_usage":true}}"#;
    let prep = prepare(Kind::Chat, body);
    let t = words("hello world");
    let script = vec![
        (0, chunk(0, &t, 0)),
        (0, chunk(1, &t[..1], 0)),
        (0, complete(0, &[], 2, "stop")),
        (0, chunk(1, &t[1..], 1)),
        (0, complete(1, &[], 2, "length")),
    ];
    let r = run(Kind::Chat, &prep, true, script.clone());
    let u = r.usages();
    assert_eq!(u.len(), 7, "two role chunks, three of text, two finishes, no usage-only chunk");
    assert!(u[..6].iter().all(|x| x == "null"), "{u:?}");
    assert_eq!(u[6], "4");
    assert_eq!(r.events[6]["choices"][0]["finish_reason"].as_str(), Some("length"));
    assert!(r.done);

    // Not asked for: absent before, still on the last finish chunk.
    let prep = prepare(Kind::Chat, r#"{"messages":[{"role":"user","content":"hi"}],"stream":true,"n":2}"#);
    let r = run(Kind::Chat, &prep, true, script);
    assert_eq!(r.usages(), ["-", "-", "-", "-", "-", "-", "4"]);

    // Not streamed: the ordinary body.
    let prep = prepare(Kind::Chat, r#"{"messages":[{"role":"user","content":"hi"}]}"#);
    let r = run(Kind::Chat, &prep, true, vec![(0, complete(0, &t, 2, "stop"))]);
    assert_eq!(r.body.as_ref().unwrap()["usage"]["completion_tokens"].as_u64(), Some(2));
}

#[test]
fn finish_reasons_pass_and_an_engine_error_fails_the_response() {
    let body = r#"{"messages":[{"role":"user","content":"hi"}],"stream":true}"#;
    let prep = prepare(Kind::Chat, body);
    let t = words("hello");
    for (engine, client) in [("", "stop"), ("stop", "stop"), ("length", "length"), ("abort", "abort")] {
        let r = run(Kind::Chat, &prep, false, on(0, streamed(0, &t, &[1], engine)));
        assert_eq!(r.finish(0), [client], "{engine:?}");
    }
    let r = run(Kind::Chat, &prep, false, on(0, streamed(0, &t, &[1], "error")));
    assert!(r.steps.last().unwrap().starts_with("Failed"), "{:?}", r.steps);
    assert_eq!(r.text(0), "hello", "what was released before stays sent");
    let err = r.events.last().unwrap();
    assert_eq!(err["error"]["type"].as_str(), Some("internal_error"));
    assert!(err["error"]["message"].as_str().unwrap().starts_with("Stream error: "));
    assert!(r.done);
}

#[test]
fn an_engine_that_ends_before_every_choice_finished_is_an_error() {
    let prep = prepare(Kind::Chat, r#"{"messages":[{"role":"user","content":"hi"}],"stream":true,"n":2}"#);
    let t = words("hello");
    let r = run(Kind::Chat, &prep, false, on(0, streamed(0, &t, &[1], "stop")));
    let s = r.incomplete.expect("sample 1 never finished");
    assert_eq!(s.code, Code::INTERNAL);
    assert!(!r.done, "no [DONE]: the caller sends the error events");

    let prep = prepare(Kind::Completions, r#"{"prompt":["a","b"]}"#);
    let r = run(Kind::Completions, &prep, false, vec![(0, complete(0, &t, 1, "stop"))]);
    assert!(r.incomplete.is_some() && r.body.is_none());
}

/// Holds every piece until the end and brackets the whole: a parser may release text later
/// than it came, and `finish` is called once.
struct Bracket(String);

impl OutputParser for Bracket {
    fn push(&mut self, text: &str, _: &mut Parsed) {
        self.0.push_str(text);
    }

    fn finish(&mut self, out: &mut Parsed) {
        out.content.push('[');
        out.content.push_str(&self.0);
        out.content.push(']');
        self.0 = "finished twice".into();
    }
}

#[test]
fn each_choice_has_its_own_output_parser() {
    let prep = prepare(Kind::Chat, r#"{"messages":[{"role":"user","content":"hi"}],"stream":true,"n":2}"#);
    let t = words("hello world");
    let mut script = on(0, streamed(0, &t, &[1, 1], "stop"));
    script.extend(on(0, streamed(1, &t, &[2], "stop")));
    let r = run_with(Kind::Chat, &prep, false, script, |i| {
        if i == 0 {
            Box::new(Bracket(String::new()))
        } else {
            Box::new(PassThrough)
        }
    });
    assert_eq!((r.text(0), r.text(1)), ("[hello world]".into(), "hello world".into()));
    // Held text makes no chunk: role, then the finish chunk with everything.
    assert_eq!(r.choice(0).count(), 2);

    let prep = prepare(Kind::Chat, r#"{"messages":[{"role":"user","content":"hi"}]}"#);
    let r =
        run_with(Kind::Chat, &prep, false, vec![(0, complete(0, &t, 2, "stop"))], |_| Box::new(Bracket(String::new())));
    assert_eq!(r.body_text(0), "[hello world]");
}

/// Its first word is reasoning, the rest (from the space on) content; at the end, `calls`
/// calls `f0`, `f1`, ….
struct Thinker {
    answering: bool,
    calls: usize,
}

impl OutputParser for Thinker {
    fn push(&mut self, text: &str, out: &mut Parsed) {
        let split = if self.answering { 0 } else { text.find(' ').unwrap_or(text.len()) };
        out.reasoning.push_str(&text[..split]);
        out.content.push_str(&text[split..]);
        self.answering |= split < text.len();
    }

    fn finish(&mut self, out: &mut Parsed) {
        for k in 0..self.calls {
            out.calls.push(smg_parsers::Call { name: format!("f{k}"), arguments: r#"{"a":"é"}"#.into() });
        }
    }
}

fn thinker(calls: usize) -> impl FnMut(usize) -> Box<dyn OutputParser> {
    move |_| Box::new(Thinker { answering: false, calls })
}

#[test]
fn reasoning_and_calls_stream_as_their_own_fields() {
    let t = words("the river");
    let body = r#"{"messages":[{"role":"user","content":"hi"}],"stream":true}"#;
    let r =
        run_with(Kind::Chat, &prepare(Kind::Chat, body), false, on(0, streamed(0, &t, &[1, 1], "stop")), thinker(2));
    let deltas: Vec<&Value> = r.choice(0).map(|c| &c["delta"]).collect();
    let reasoning: String = deltas.iter().filter_map(|d| d["reasoning_content"].as_str()).collect();
    assert_eq!((reasoning.as_str(), r.text(0).as_str()), ("the", " river"));
    let calls: Vec<&Value> = deltas.iter().filter_map(|d| d["tool_calls"].as_array()).flat_map(|a| a.iter()).collect();
    assert_eq!(calls.len(), 2);
    for (k, c) in calls.iter().enumerate() {
        assert_eq!(c["index"].as_u64(), Some(k as u64));
        assert!(c["id"].as_str().unwrap().starts_with("call_"));
        assert_eq!(c["type"].as_str(), Some("function"));
        assert_eq!(c["function"]["name"].as_str(), Some(format!("f{k}").as_str()));
        assert_eq!(c["function"]["arguments"].as_str(), Some(r#"{"a":"é"}"#));
    }
    assert_ne!(calls[0]["id"].as_str(), calls[1]["id"].as_str());
    assert_eq!(r.finish(0), ["tool_calls"], "once, on the last chunk");

    // parallel_tool_calls: false keeps the first; stream_reasoning: false holds the reasoning
    // until the content comes, then sends it in the same delta.
    let body = r#"{"messages":[{"role":"user","content":"hi"}],"stream":true,"parallel_tool_calls":false,"stream_reasoning":false}"#;
    let r =
        run_with(Kind::Chat, &prepare(Kind::Chat, body), false, on(0, streamed(0, &t, &[1, 1], "stop")), thinker(2));
    let both: Vec<&Value> = r.choice(0).map(|c| &c["delta"]).filter(|d| d.get("reasoning_content").is_some()).collect();
    assert_eq!(both.len(), 1);
    assert_eq!((both[0]["reasoning_content"].as_str(), both[0]["content"].as_str()), (Some("the"), Some(" river")));
    let n: usize = r.choice(0).filter_map(|c| c["delta"]["tool_calls"].as_array()).map(|a| a.len()).sum();
    assert_eq!(n, 1);

    // A cut reply keeps `length`.
    let r =
        run_with(Kind::Chat, &prepare(Kind::Chat, body), false, on(0, streamed(0, &t, &[1, 1], "length")), thinker(1));
    assert_eq!(r.finish(0), ["length"]);
}

#[test]
fn reasoning_and_calls_in_the_whole_body() {
    let t = words("the river");
    let prep = prepare(Kind::Chat, r#"{"messages":[{"role":"user","content":"hi"}]}"#);
    let r = run_with(Kind::Chat, &prep, false, vec![(0, complete(0, &t, 2, "stop"))], thinker(1));
    let body = r.body.unwrap();
    let m = &body["choices"][0]["message"];
    assert_eq!(m["reasoning_content"].as_str(), Some("the"));
    assert_eq!(m["content"].as_str(), Some(" river"));
    let c = &m["tool_calls"][0];
    assert!(c.get("index").is_none(), "a whole body's calls carry no index");
    assert_eq!((c["function"]["name"].as_str(), c["type"].as_str()), (Some("f0"), Some("function")));
    assert_eq!(body["choices"][0]["finish_reason"].as_str(), Some("tool_calls"));

    // Only calls: content is null.
    let one = words("the");
    let r = run_with(Kind::Chat, &prep, false, vec![(0, complete(0, &one, 1, "stop"))], thinker(1));
    assert!(r.body.unwrap()["choices"][0]["message"]["content"].is_null());
}

/// `/generate`: the same tokens cut at every message boundary give the same text, every event
/// the whole text so far, and a stop string the gateway found named as the finish's `matched`.
#[test]
fn generate_streams_the_whole_text_so_far_at_every_cut() {
    let tokens = toks(&["hello", "Ġworld", "Ġ", "Ã", "©", "Ġ", "E", "N", "D", "Ġthe"]);
    let cases = [("", "hello world é END the", "length"), (r#","stop":"END""#, "hello world é ", "stop")];
    for (extra, want, reason) in cases {
        let body = format!(r#"{{"text":"say","stream":true,"sampling_params":{{"max_new_tokens":10{extra}}}}}"#);
        let prep = prepare(Kind::Generate, &body);
        let whole = prepare(Kind::Generate, &body.replace(r#""stream":true"#, r#""stream":false"#));
        let r = run(Kind::Generate, &whole, false, vec![(0, complete(0, &tokens, tokens.len(), "length"))]);
        let b = r.body.as_ref().unwrap();
        assert_eq!(b["text"].as_str(), Some(want), "{extra}");
        assert_eq!(b["output_ids"].as_array().unwrap().len(), tokens.len(), "every id the engine gave");
        assert_eq!(b["meta_info"]["finish_reason"]["type"].as_str(), Some(reason));
        if reason == "stop" {
            assert_eq!(b["meta_info"]["finish_reason"]["matched"].as_str(), Some("END"));
        }
        for sizes in cuts(tokens.len()) {
            let r = run(Kind::Generate, &prep, false, on(0, streamed(0, &tokens, &sizes, "length")));
            assert!(r.done, "{sizes:?}");
            let mut last = String::new();
            for e in &r.events {
                let t = e["text"].as_str().unwrap().to_string();
                assert!(t.starts_with(&last), "the text only grows: {last:?} then {t:?} {sizes:?}");
                last = t;
            }
            let end = r.events.last().unwrap();
            assert_eq!(end["text"].as_str(), Some(want), "{extra} {sizes:?}");
            assert_eq!(end["meta_info"]["finish_reason"]["type"].as_str(), Some(reason), "{sizes:?}");
        }
    }
}

/// The simulator's tokenizer as a gpt-oss model's: Harmony's special tokens found.
fn harmony_model() -> &'static GrpcModel {
    static M: OnceLock<GrpcModel> = OnceLock::new();
    M.get_or_init(|| {
        let tok = Arc::clone(&model().tokenizer);
        let harmony = crate::grpc::harmony::HarmonyTokens::detect(&["openai/gpt-oss-20b"], &[], "", &tok);
        assert!(harmony.is_some(), "the simulator's vocabulary has Harmony's tokens");
        GrpcModel { tokenizer: tok, harmony, ..clone_model(model()) }
    })
}

fn clone_model(m: &GrpcModel) -> GrpcModel {
    GrpcModel {
        tokenizer: Arc::clone(&m.tokenizer),
        max_context: m.max_context,
        eos_ids: m.eos_ids.clone(),
        supports_vision: m.supports_vision,
        is_generation: m.is_generation,
        defaults: m.defaults,
        parsers: m.parsers,
        harmony: m.harmony,
    }
}

#[test]
fn a_harmony_answer_reads_as_reasoning_a_call_and_counted_reasoning_tokens() {
    let m = harmony_model();
    let tools = r#""tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}]"#;
    let body = format!(
        r#"{{"messages":[{{"role":"user","content":"Weather?"}}],{tools},"stream":true,"reasoning_effort":"xhigh"}}"#
    );
    let doc: Value = sonic_rs::from_str(&body).unwrap();
    let prep = request::prepare(Kind::Chat, &doc, m).unwrap();
    let prompt = m.tokenizer.decode(&prep.prompts[0], false);
    assert!(prompt.contains("Reasoning: high") && prompt.ends_with("<|start|>assistant"), "{prompt}");
    assert!(prompt.contains("type get_weather = (_: {\ncity?: string,\n}) => any;"), "{prompt}");
    let h = m.harmony.unwrap();
    assert!(
        !prep.skip_special
            && prep.params.stop_token_ids.contains(&h.call)
            && prep.params.stop_token_ids.contains(&h.ret)
    );

    // The simulated model's answer: its reasoning ("The user asks about X." is 6 word tokens
    // and a byte per other character), then the call, whose <|call|> the engine trimmed.
    let answer = smg_loadtest::sim::grpc::markup::harmony_text("r1", &prep.prompts[0]);
    let answer = answer.strip_suffix("<|call|>").unwrap();
    let tokens = m.tokenizer.encode(answer, false).unwrap();
    let reasoning = answer.split("<|message|>").nth(1).unwrap().split("<|end|>").next().unwrap();
    let reasoning_tokens = m.tokenizer.encode(reasoning, false).unwrap().len() as u64;
    let plan = &prep.output;
    let make = |_: usize| plan.parser();
    let whole = {
        let doc: Value = sonic_rs::from_str(&body.replace(r#""stream":true"#, r#""stream":false"#)).unwrap();
        let prep = request::prepare(Kind::Chat, &doc, m).unwrap();
        let plan = prep.output.clone();
        let r = run_with_tok(&m.tokenizer, &prep, vec![(0, complete(0, &tokens, tokens.len(), "stop"))], move |_| {
            plan.parser()
        });
        r.body.unwrap()
    };
    let msg = &whole["choices"][0]["message"];
    assert_eq!(msg["reasoning_content"].as_str(), Some(reasoning));
    assert!(msg["content"].is_null() || msg["content"].as_str() == Some(""), "{msg:?}");
    assert_eq!(msg["tool_calls"][0]["function"]["name"].as_str(), Some("get_weather"));
    let args: Value = sonic_rs::from_str(msg["tool_calls"][0]["function"]["arguments"].as_str().unwrap()).unwrap();
    assert!(args["city"].is_str());
    assert_eq!(whole["choices"][0]["finish_reason"].as_str(), Some("tool_calls"));
    assert_eq!(whole["usage"]["completion_tokens_details"]["reasoning_tokens"].as_u64(), Some(reasoning_tokens));

    // Streamed, cut into messages of every size from 1 to 7 tokens: the same fields.
    for size in 1..=7 {
        let sizes: Vec<usize> = (0..tokens.len()).step_by(size).map(|a| size.min(tokens.len() - a)).collect();
        let r = run_with_tok(&m.tokenizer, &prep, on(0, streamed(0, &tokens, &sizes, "stop")), make);
        let deltas: Vec<&Value> = r.choice(0).map(|c| &c["delta"]).collect();
        let streamed_reasoning: String = deltas.iter().filter_map(|d| d["reasoning_content"].as_str()).collect();
        assert_eq!(streamed_reasoning, reasoning, "size {size}");
        assert_eq!(r.text(0), "", "no markup leaks into content (size {size})");
        let calls: Vec<&Value> =
            deltas.iter().filter_map(|d| d["tool_calls"].as_array()).flat_map(|a| a.iter()).collect();
        assert_eq!(calls.len(), 1, "size {size}");
        assert_eq!(r.finish(0), ["tool_calls"]);
        assert_eq!(r.usage.reasoning, reasoning_tokens, "size {size}");
    }
}

/// `run_with` on another model's tokenizer.
fn run_with_tok(
    tok: &Tokenizer,
    prep: &Prepared,
    script: Vec<(usize, GenerateResponse)>,
    mut parser: impl FnMut(usize) -> Box<dyn OutputParser>,
) -> Run {
    let meta = Meta { kind: Kind::Chat, id: "cmpl-1", created: 7, model: "m" };
    let mut asm = Assembler::new(prep, tok, meta, false, |i| parser(i));
    let mut sse = Vec::new();
    let mut body = None;
    for (p, msg) in script {
        let step = asm.on_message(p, msg);
        assert!(matches!(step, Step::Next | Step::Abort), "{step:?}");
        sse.extend_from_slice(asm.pending());
        asm.sent();
    }
    if let Ok(Answer::Body(b)) = asm.finish() {
        body = Some(sonic_rs::from_slice(&b).unwrap());
    }
    sse.extend_from_slice(asm.pending());
    let (events, done) = parse_sse(&sse);
    Run { events, done, body, steps: Vec::new(), incomplete: None, usage: asm.usage() }
}
