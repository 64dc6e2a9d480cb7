//! Decisions scoring without a socket: prompts and labels on the simulator's tokenizer, and
//! answers from scripted engine rows.

use std::sync::Arc;

use smg_loadtest::sim::tokenizer as sim;
use smg_proto::scheduler::{OutputLogProbs, TopLogProbs};
use sonic_rs::{JsonContainerTrait, JsonValueTrait, Value};

use super::*;

fn model_with(template: Option<&str>) -> GrpcModel {
    let tok = Tokenizer::from_parts(
        sim::tokenizer_json().as_bytes(),
        Some(&sim::tokenizer_config_json()),
        template.map(str::to_string),
    )
    .expect("the simulator's tokenizer");
    GrpcModel {
        tokenizer: Arc::new(tok),
        max_context: Some(4096),
        eos_ids: vec![sim::IM_END_ID],
        supports_vision: false,
        is_generation: true,
        defaults: Default::default(),
        parsers: Default::default(),
        harmony: None,
    }
}

fn model() -> GrpcModel {
    model_with(None)
}

const BODY: &str = r#"{"model":"m","input":"The parcel came late.","questions":[
  {"type":"predicate","instructions":"Was it on time?"},
  {"type":"choice","name":"mood","instructions":"Mood?","choices":[{"value":true},{"value":"true","description":"the word"}]},
  {"type":"score","instructions":"Rate it.","levels":[{"label":"poor"},{"label":"fair"},{"label":"good"}]}]}"#;

fn id(text: &str) -> u32 {
    let ids = model().tokenizer.encode(text, false).unwrap();
    assert_eq!(ids.len(), 1, "{text:?} is one token of the simulator's vocabulary");
    ids[0]
}

#[test]
fn option_letters_run_as_spreadsheet_columns() {
    let got: Vec<String> = [0, 1, 25, 26, 27, 51, 52, 701, 702].into_iter().map(letters).collect();
    assert_eq!(got, ["A", "B", "Z", "AA", "AB", "AZ", "BA", "ZZ", "AAA"]);
}

#[test]
fn each_question_is_its_own_chat_prompt_over_the_evidence_with_one_token_labels() {
    let m = model();
    let q = read(BODY.as_bytes(), "org/m").unwrap();
    assert_eq!(q.items.len(), 3);
    let s = q.prepare(&m).unwrap();
    let texts: Vec<String> = s.prompts.iter().map(|p| m.tokenizer.decode(&p.ids, false)).collect();
    for t in &texts {
        assert!(t.starts_with("<|im_start|>user\nThe parcel came late.\n\n"), "{t}");
        assert!(t.ends_with("<|im_end|>\n<|im_start|>assistant\n"), "{t}");
    }
    assert!(texts[0].contains("Statement: Was it on time?\n") && texts[0].contains("yes or no"), "{}", texts[0]);
    assert!(texts[1].contains("Question: Mood?\nOptions:\nA) true\nB) true - the word\n"), "{}", texts[1]);
    assert!(texts[2].contains("\n0) poor\n1) fair\n2) good\n"), "{}", texts[2]);
    assert_eq!(s.prompts[0].labels, [id("yes"), id("no")]);
    assert_eq!(s.prompts[1].labels, [id("A"), id("B")]);
    assert_eq!(s.prompts[2].labels, [id("0"), id("1"), id("2")]);
    let req = engine_request(&s.prompts[2], "dec-1-2".into(), Some(1));
    let sp = req.sampling_params.as_ref().unwrap();
    assert_eq!(sp.max_new_tokens, Some(0), "prefill only: nothing is generated");
    assert!(req.return_logprob && !req.stream);
    assert_eq!((req.token_ids_logprob.as_slice(), req.logprob_start_len), (s.prompts[2].labels.as_slice(), -1));
    assert_eq!((sp.temperature, sp.top_k, req.data_parallel_rank), (1.0, -1, Some(1)));
}

#[test]
fn labels_the_vocabulary_cannot_give_as_one_token_are_refused_before_dispatch() {
    // 27 options: the 27th is "AA", two tokens in the simulator's vocabulary.
    let choices: Vec<String> = (0..27).map(|i| format!("{{\"value\":\"v{i}\"}}")).collect();
    let body = format!(
        r#"{{"model":"m","input":"x","questions":[{{"type":"choice","instructions":"Which?","choices":[{}]}}]}}"#,
        choices.join(",")
    );
    let e = read(body.as_bytes(), "m").unwrap().prepare(&model()).unwrap_err();
    assert_eq!((e.status, e.code), (400, "unsupported_decisions_request"));
    assert!(e.message.contains("\"AA\""), "{}", e.message);
}

#[test]
fn a_template_that_leaves_a_reasoning_block_open_is_refused() {
    let open = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}<|im_start|>assistant\n<think>\n";
    let e = read(BODY.as_bytes(), "m").unwrap().prepare(&model_with(Some(open))).unwrap_err();
    assert_eq!((e.status, e.code), (400, "unsupported_decisions_request"));
    assert!(e.message.contains("<think>"), "{}", e.message);
    // Closed before the answer (a hybrid model with thinking off): scored.
    let closed = open.replace("<think>\n", "<think>\n\n</think>\n\n");
    assert!(read(BODY.as_bytes(), "m").unwrap().prepare(&model_with(Some(&closed))).is_ok());
}

#[test]
fn the_sglang_refusals_and_the_schema_come_first() {
    let e =
        read(br#"{"model":"m","input":"  ","questions":[{"type":"predicate","instructions":"q"}]}"#, "m").unwrap_err();
    assert_eq!(e.code, "unsupported_decisions_request");
    let e = read(br#"{"model":"m","input":"x","questions":[],"extra":1}"#, "m").unwrap_err();
    assert_eq!(e.code, "unsupported_decisions_request");
    let e = read(br#"{"model":"m","input":"x","questions":[{"type":"guess","instructions":"q"}]}"#, "m").unwrap_err();
    assert_eq!(e.code, "json_parse_error");
}

fn complete(ids: &[u32], values: &[f32], prompt_tokens: u32, cached: u32) -> GenerateComplete {
    GenerateComplete {
        output_logprobs: Some(OutputLogProbs {
            token_ids_logprobs: vec![TopLogProbs { values: values.to_vec(), token_ids: ids.to_vec() }],
            ..Default::default()
        }),
        prompt_tokens,
        cached_tokens: cached,
        finish_reason: "length".into(),
        ..Default::default()
    }
}

#[test]
fn a_row_is_the_labels_probabilities_renormalized_in_label_order() {
    let p = Prompt { ids: vec![1], labels: vec![10, 20] };
    // The engine may order the ids its own way.
    let r = row(&p, &complete(&[20, 10], &[(0.25f32).ln(), (0.5f32).ln()], 7, 3)).unwrap();
    assert!((r.probabilities[0] - 2.0 / 3.0).abs() < 1e-6 && (r.probabilities[1] - 1.0 / 3.0).abs() < 1e-6);
    assert_eq!((r.prompt_tokens, r.cached_tokens), (7, 3));
    let none = |c: GenerateComplete| row(&p, &c).is_none();
    assert!(none(GenerateComplete::default()), "an older servicer sends no rows");
    assert!(none(complete(&[10], &[-1.0], 7, 0)), "a label is missing");
    assert!(none(complete(&[10, 20], &[f32::NEG_INFINITY, f32::NEG_INFINITY], 7, 0)), "nothing finite");
    assert!(none(complete(&[10, 20], &[f32::NAN, -1.0], 7, 0)));
    let mut two = complete(&[10, 20], &[-1.0, -2.0], 7, 0);
    let extra = two.output_logprobs.as_ref().unwrap().token_ids_logprobs[0].clone();
    two.output_logprobs.as_mut().unwrap().token_ids_logprobs.push(extra);
    assert!(none(two), "one row is expected at the answer position");
}

#[test]
fn the_answer_keeps_question_order_names_values_and_sums_usage() {
    let q = read(BODY.as_bytes(), "org/m").unwrap();
    let rows = vec![
        Row { probabilities: vec![0.2, 0.8], prompt_tokens: 40, cached_tokens: 0 },
        Row { probabilities: vec![0.25, 0.75], prompt_tokens: 50, cached_tokens: 30 },
        Row { probabilities: vec![0.1, 0.2, 0.7], prompt_tokens: 60, cached_tokens: 30 },
    ];
    let (body, input) = answer(&q, &rows);
    assert_eq!(input, 150);
    let v: Value = sonic_rs::from_slice(&body).unwrap();
    assert_eq!(v["model"].as_str(), Some("org/m"));
    let a = v["answers"].as_array().unwrap();
    assert_eq!(a[0]["type"].as_str(), Some("predicate"));
    assert!(a[0]["name"].is_null());
    assert_eq!(a[0]["probability"].as_f64(), Some(0.2));
    assert_eq!(a[1]["name"].as_str(), Some("mood"));
    assert_eq!(a[1]["choice"].as_str(), Some("true"), "the string, not the boolean");
    assert_eq!(a[1]["confidence"].as_f64(), Some(0.75));
    let ps = a[1]["probabilities"].as_array().unwrap();
    assert_eq!((ps[0]["value"].as_bool(), ps[1]["value"].as_str()), (Some(true), Some("true")));
    assert_eq!(a[2]["type"].as_str(), Some("score"));
    let score = a[2]["score"].as_f64().unwrap();
    assert!((score - 1.6).abs() < 1e-9, "Σ i·pᵢ = {score}");
    let levels = a[2]["probabilities"].as_array().unwrap();
    assert_eq!((levels[2]["value"].as_u64(), levels[2]["label"].as_str()), (Some(2), Some("good")));
    let u = &v["usage"];
    assert_eq!(
        (u["input_tokens"].as_u64(), u["output_tokens"].as_u64(), u["total_tokens"].as_u64()),
        (Some(150), Some(0), Some(150))
    );
    assert_eq!(u["input_tokens_details"]["cached_tokens"].as_u64(), Some(60));
    assert_eq!(u["output_tokens_details"]["reasoning_tokens"].as_u64(), Some(0));
}
