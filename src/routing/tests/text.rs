//! Body scanning: routing text, token ids, namespace and rid, in any key order.

use crate::routing::{body_rid, namespace, parse_sglang_loads, routing_text, scan_body, RoutingSignal, TextSource};

#[test]
fn chat_text_is_messages_in_order_with_text_parts() {
    let body = br#"{"model":"m","messages":[
        {"role":"system","content":"You are helpful."},
        {"role":"user","content":[{"type":"text","text":"Hi "},{"type":"image_url","image_url":{"url":"data:x"}},{"type":"text","text":"there \u00e9\n"}]},
        {"role":"assistant","content":null,"tool_calls":[]}
    ],"stream":true}"#;
    assert_eq!(routing_text(TextSource::Chat, body).as_deref(), Some("You are helpful.\nHi there é\n\n\n"));
}

#[test]
fn chat_text_does_not_depend_on_key_order() {
    let a = br#"{"model":"m","stream":false,"messages":[{"role":"user","content":"hello"}]}"#;
    let b = br#"{"messages":[{"content":"hello","role":"user"}],"stream":false,"model":"m"}"#;
    assert_eq!(routing_text(TextSource::Chat, a), routing_text(TextSource::Chat, b));
    assert_eq!(routing_text(TextSource::Chat, a).as_deref(), Some("hello\n"));
}

#[test]
fn message_boundaries_are_kept() {
    let a = br#"{"messages":[{"role":"user","content":"ab"},{"role":"user","content":"c"}]}"#;
    let b = br#"{"messages":[{"role":"user","content":"a"},{"role":"user","content":"bc"}]}"#;
    assert_ne!(routing_text(TextSource::Chat, a), routing_text(TextSource::Chat, b));
}

#[test]
fn completion_prompt_forms() {
    let s = br#"{"model":"m","prompt":"Once upon"}"#;
    assert_eq!(routing_text(TextSource::Completion, s).as_deref(), Some("Once upon"));
    let list = br#"{"prompt":["a","b"],"model":"m"}"#;
    assert_eq!(routing_text(TextSource::Completion, list).as_deref(), Some("a\nb"));
    let ids = br#"{"prompt":[1,2,3]}"#;
    assert_eq!(
        scan_body(TextSource::Completion, ids).and_then(|b| b.signal),
        Some(RoutingSignal::Tokens(vec![1, 2, 3]))
    );
    let nested = br#"{"prompt":[[7,8],[9]]}"#;
    assert_eq!(
        scan_body(TextSource::Completion, nested).and_then(|b| b.signal),
        Some(RoutingSignal::Tokens(vec![7, 8]))
    );
    let too_big = br#"{"prompt":[1,4294967296]}"#;
    assert_eq!(scan_body(TextSource::Completion, too_big).and_then(|b| b.signal), None);
}

#[test]
fn generate_text_or_input_ids() {
    let t = br#"{"text":"The capital of France is","sampling_params":{"max_new_tokens":8}}"#;
    assert_eq!(routing_text(TextSource::Generate, t).as_deref(), Some("The capital of France is"));
    for body in [&br#"{"text":"x","input_ids":[5,6]}"#[..], br#"{"input_ids":[5,6],"text":"x"}"#] {
        assert_eq!(
            scan_body(TextSource::Generate, body).and_then(|b| b.signal),
            Some(RoutingSignal::Tokens(vec![5, 6]))
        );
    }
}

#[test]
fn namespace_separates_lora_salt_and_extra_key() {
    let plain = br#"{"messages":[]}"#;
    assert_eq!(namespace(plain), None);
    let lora = namespace(br#"{"lora_path":"a","messages":[]}"#);
    let salt = namespace(br#"{"cache_salt":"a","messages":[]}"#);
    let extra = namespace(br#"{"extra_key":"a","messages":[]}"#);
    assert!(lora.is_some() && salt.is_some() && extra.is_some());
    assert_ne!(lora, salt);
    assert_ne!(salt, extra);
    assert_ne!(lora, extra);
    let both = namespace(br#"{"cache_salt":"s","lora_path":"a"}"#);
    let both_again = namespace(br#"{"lora_path":"a","cache_salt":"s"}"#);
    assert_eq!(both, both_again);
    assert_ne!(both, lora);
    // null means unset.
    assert_eq!(namespace(br#"{"lora_path":null}"#), None);
}

#[test]
fn rid_string_or_first_of_list() {
    assert_eq!(body_rid(br#"{"rid":"conv_t2"}"#).as_deref(), Some("conv_t2"));
    assert_eq!(body_rid(br#"{"rid":["a_t1","b"]}"#).as_deref(), Some("a_t1"));
    assert_eq!(body_rid(br#"{"rid":5}"#), None);
}

#[test]
fn bad_bodies_are_none() {
    assert_eq!(scan_body(TextSource::Chat, b"[1,2]"), None);
    assert_eq!(scan_body(TextSource::Chat, b"{\"messages\":[{"), None);
    assert_eq!(routing_text(TextSource::Chat, b""), None);
}

#[test]
fn sglang_loads_sum_ranks() {
    let body = br#"{"timestamp":"t","dp_rank_count":2,"loads":[
        {"dp_rank":0,"num_running_reqs":3,"num_waiting_reqs":1,"num_total_reqs":4,"token_usage":0.5},
        {"dp_rank":1,"num_running_reqs":2,"num_waiting_reqs":0,"num_total_reqs":2}]}"#;
    assert_eq!(parse_sglang_loads(body), Some(6));
    let no_total = br#"{"loads":[{"dp_rank":0,"num_running_reqs":3,"num_waiting_reqs":4}]}"#;
    assert_eq!(parse_sglang_loads(no_total), Some(7));
    assert_eq!(parse_sglang_loads(br#"{"loads":[]}"#), None);
    assert_eq!(parse_sglang_loads(br#"{"loads":[{"dp_rank":0}]}"#), None);
    assert_eq!(parse_sglang_loads(br#"{"load":3}"#), None);
    assert_eq!(parse_sglang_loads(b"not json"), None);
    let all = crate::routing::parse_engine_load(body, None).unwrap();
    assert_eq!((all.total, all.waiting, all.token_usage), (6, 1, Some(0.5)));
    let one = crate::routing::parse_engine_load(body, Some(1)).unwrap();
    assert_eq!((one.total, one.waiting, one.token_usage), (2, 0, None));
    assert_eq!(crate::routing::parse_engine_load(body, Some(5)), None);
}
