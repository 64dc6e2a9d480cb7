//! Rewrites: each profile default and rewrite, aliases, and bodies that must stay untouched.

use super::super::{inspect, Aliases, Endpoint};
use super::{chat, forwarded};

fn none() -> Aliases {
    Aliases::default()
}

/// Forwarded body must still be valid JSON.
fn fw(body: &str) -> String {
    let out = forwarded(body, &none());
    sonic_rs::from_str::<sonic_rs::Value>(&out).unwrap_or_else(|e| panic!("{out}: {e}"));
    out
}

#[test]
fn a_plain_body_needs_no_edits() {
    let body = "{ \"messages\" : [ {\"role\":\"user\",\"content\":\"hi\"} ],\n  \"model\": \"m\", \"top_p\": 0.95 }";
    let insp = chat(body).unwrap();
    assert!(insp.edits.is_empty());
    assert!(insp.warnings.is_empty());
    assert_eq!(insp.model, "m");
    assert!(!insp.stream);
}

#[test]
fn alias_is_resolved_and_written_into_the_body() {
    let aliases = Aliases::parse(&["fast=org/Big-Model-70B", "cheap=org/small"]).unwrap();
    let body = r#"{"model": "fast", "messages":[{"role":"user","content":"hi"}], "temperature": 0.70}"#;
    let insp = inspect(Endpoint::ChatCompletions, body.as_bytes(), true, &aliases).unwrap();
    assert_eq!(insp.model, "org/Big-Model-70B");
    assert_eq!(
        forwarded(body, &aliases),
        r#"{"model": "org/Big-Model-70B", "messages":[{"role":"user","content":"hi"}], "temperature": 0.70}"#
    );
    let comp = r#"{"prompt":"x","model":"cheap","stream":true}"#;
    let insp = inspect(Endpoint::Completions, comp.as_bytes(), true, &aliases).unwrap();
    assert_eq!((insp.model.as_str(), insp.stream), ("org/small", true));
    assert_eq!(
        super::super::apply(comp.as_bytes(), &insp.edits),
        br#"{"prompt":"x","model":"org/small","stream":true}"#
    );
    // Not an alias: untouched.
    let insp = inspect(
        Endpoint::ChatCompletions,
        br#"{"model":"org/small","messages":[{"role":"user","content":"x"}]}"#,
        true,
        &aliases,
    )
    .unwrap();
    assert!(insp.edits.is_empty());
}

#[test]
fn alias_parsing() {
    assert!(Aliases::parse(&["a"]).is_err());
    assert!(Aliases::parse(&["=b"]).is_err());
    assert!(Aliases::parse(&["a="]).is_err());
    assert!(Aliases::parse(&["a=b", "a=c"]).is_err());
    assert!(Aliases::parse(&["a=a"]).is_err());
    let a = Aliases::parse(&["a=b", "a=b"]).unwrap();
    assert_eq!(a.resolve("a"), Some("b"));
    assert_eq!(a.resolve("b"), None);
}

#[test]
fn profile_selection_ignores_aliases() {
    // The alias names a MiniMax model, but selection reads the name as sent.
    let aliases = Aliases::parse(&["mm=MiniMax-M3"]).unwrap();
    let body = r#"{"model":"mm","messages":[{"role":"user","content":"hi"},{"role":"root","content":"x"}]}"#;
    let err = inspect(Endpoint::ChatCompletions, body.as_bytes(), true, &aliases).unwrap_err();
    assert_eq!(err.message(), "__all__: invalid role: root");
}

#[test]
fn numeric_reasoning_effort_becomes_a_string() {
    let b =
        |e: &str| format!(r#"{{"model":"m","messages":[{{"role":"user","content":"hi"}}],"reasoning_effort":{e}}}"#);
    assert_eq!(fw(&b("5")), b(r#""5""#));
    assert_eq!(fw(&b("2.5")), b(r#""2.5""#));
    assert_eq!(fw(&b("1e2")), b(r#""100""#));
    assert!(chat(&b(r#""high""#)).unwrap().edits.is_empty());
}

#[test]
fn kimi_streams_get_include_usage() {
    let b = |extra: &str| format!(r#"{{"model":"kimi-k2","messages":[{{"role":"user","content":"hi"}}]{extra}}}"#);
    assert_eq!(fw(&b(r#","stream":true"#)), b(r#","stream":true,"stream_options":{"include_usage":true}"#));
    assert_eq!(
        fw(&b(r#","stream":true,"stream_options":{}"#)),
        b(r#","stream":true,"stream_options":{"include_usage":true}"#)
    );
    assert_eq!(
        fw(&b(r#","stream_options":{ "x":1 },"stream":true"#)),
        b(r#","stream_options":{ "x":1,"include_usage":true },"stream":true"#)
    );
    assert_eq!(
        fw(&b(r#","stream":true,"stream_options":null"#)),
        b(r#","stream":true,"stream_options":{"include_usage":true}"#)
    );
    assert_eq!(
        fw(&b(r#","stream":true,"stream_options":{"include_usage":null}"#)),
        b(r#","stream":true,"stream_options":{"include_usage":true}"#)
    );
    // An explicit false is kept, and non-streaming requests are untouched.
    assert!(chat(&b(r#","stream":true,"stream_options":{"include_usage":false}"#)).unwrap().edits.is_empty());
    assert!(chat(&b("")).unwrap().edits.is_empty());
    assert!(chat(&b(r#","stream":true,"stream_options":{"include_usage":true}"#)).unwrap().stream);
}

#[test]
fn kimi_k3_gets_contract_defaults() {
    let b = |extra: &str| {
        format!(r#"{{"model":"moonshotai/Kimi-K3","messages":[{{"role":"user","content":"hi"}}]{extra}}}"#)
    };
    assert_eq!(fw(&b("")), b(r#","temperature":1.0,"top_p":0.95,"presence_penalty":0,"frequency_penalty":0,"n":1"#));
    assert_eq!(
        fw(&b(r#","temperature":0.6,"n":null,"stream":true"#)),
        b(
            r#","temperature":0.6,"n":1,"stream":true,"stream_options":{"include_usage":true},"top_p":0.95,"presence_penalty":0,"frequency_penalty":0"#
        )
    );
}

#[test]
fn minimax_root_messages_move_to_the_front_as_system() {
    let body = r#"{"model":"MiniMax-M3","messages":[ {"role":"user","content":"hi"}, {"role":"root","content":"A"},{"content":"B","role":"root"} ]}"#;
    assert_eq!(
        fw(body),
        r#"{"model":"MiniMax-M3","messages":[ {"role":"system","content":"A"},{"content":"B","role":"system"},{"role":"user","content":"hi"} ]}"#
    );
    // Already in front: only the role changes.
    let body = r#"{"model":"MiniMax-M3","messages":[{"role":"root","content":"A"}, {"role":"user","content":"hi"}]}"#;
    assert_eq!(
        fw(body),
        r#"{"model":"MiniMax-M3","messages":[{"role":"system","content":"A"}, {"role":"user","content":"hi"}]}"#
    );
    // Combined with a dropped foreign field inside a moved message.
    let body = r#"{"model":"MiniMax-M3","messages":[{"role":"user","content":"hi","tools":[]},{"role":"root","content":"A"}]}"#;
    let insp = chat(body).unwrap();
    assert_eq!(insp.warnings.len(), 1);
    assert_eq!(
        fw(body),
        r#"{"model":"MiniMax-M3","messages":[{"role":"system","content":"A"},{"role":"user","content":"hi"}]}"#
    );
}

#[test]
fn foreign_message_tools_are_dropped_with_one_warning() {
    let t = r#"[{"type":"function","function":{"name":"f"}}]"#;
    let body = format!(
        r#"{{"model":"gpt-4o","messages":[{{"tools":{t},"role":"system","content":""}},{{"role":"developer","tools":{t},"content":"d"}},{{"role":"user","content":"hi","tools":{t}}},{{"role":"assistant","tools":null}}]}}"#
    );
    let insp = chat(&body).unwrap();
    assert_eq!(insp.warnings.len(), 1, "{:?}", insp.warnings);
    let w = &insp.warnings[0];
    assert!(w.contains("dropped=3") && w.contains("roles=developer,system,user") && w.contains("model=gpt-4o"), "{w}");
    assert_eq!(
        fw(&body),
        r#"{"model":"gpt-4o","messages":[{"role":"system","content":""},{"role":"developer","content":"d"},{"role":"user","content":"hi"},{"role":"assistant"}]}"#
    );
    // Kimi keeps them.
    let kimi = format!(
        r#"{{"model":"kimi-k2","messages":[{{"tools":{t},"role":"system"}},{{"role":"user","content":"hi"}}]}}"#
    );
    assert!(chat(&kimi).is_ok_and(|i| i.warnings.is_empty() && i.edits.is_empty()));
}

#[test]
fn zai_rewrites() {
    let b = |model: &str, extra: &str| {
        format!(r#"{{"model":"{model}","messages":[{{"role":"user","content":"hi"}}]{extra}}}"#)
    };
    assert_eq!(
        fw(&b("glm-4.5", r#","thinking":{"type":"enabled","clear_thinking":false}"#)),
        b(
            "glm-4.5",
            r#","thinking":{"type":"enabled","clear_thinking":false},"chat_template_kwargs":{"clear_thinking":false}"#
        )
    );
    assert_eq!(
        fw(&b("glm-4.5", r#","chat_template_kwargs":{"a":1},"thinking":{"clear_thinking":true}"#)),
        b("glm-4.5", r#","chat_template_kwargs":{"a":1,"clear_thinking":true},"thinking":{"clear_thinking":true}"#)
    );
    // An explicit kwarg wins.
    assert!(chat(&b(
        "glm-4.5",
        r#","chat_template_kwargs":{"clear_thinking":false},"thinking":{"clear_thinking":true}"#
    ))
    .unwrap()
    .edits
    .is_empty());
    // tool_stream is dropped wherever it sits.
    assert_eq!(fw(&b("glm-4.5", r#","tool_stream":true"#)), b("glm-4.5", ""));
    assert_eq!(
        fw(r#"{"tool_stream": true, "model":"glm-4.5","messages":[{"role":"user","content":"hi"}]}"#),
        r#"{"model":"glm-4.5","messages":[{"role":"user","content":"hi"}]}"#
    );
    // GLM-4.6 / 4.7 / 5.x get sampling defaults; other GLMs do not.
    assert_eq!(fw(&b("zai-org/GLM-4.6", "")), b("zai-org/GLM-4.6", r#","temperature":1.0,"top_p":0.95"#));
    assert_eq!(fw(&b("GLM-5.3-Flash", r#","top_p":0.5"#)), b("GLM-5.3-Flash", r#","top_p":0.5,"temperature":1.0"#));
    assert!(chat(&b("glm-4.5", "")).unwrap().edits.is_empty());
    // Last-member removal next to an insert.
    assert_eq!(
        fw(&b("glm-4.7", r#","temperature":0.2,"tool_stream":false"#)),
        b("glm-4.7", r#","temperature":0.2,"top_p":0.95"#)
    );
}

#[test]
fn deepseek_rewrites() {
    let b = |model: &str, extra: &str| {
        format!(r#"{{"model":"{model}","messages":[{{"role":"user","content":"hi"}}]{extra}}}"#)
    };
    let v4 = "deepseek-v4-pro";
    let v41 = "deepseek-v4.1-flash";
    assert_eq!(fw(&b(v4, "")), b(v4, r#","chat_template_kwargs":{"thinking":true}"#));
    assert_eq!(
        fw(&b(v4, r#","reasoning_effort":"minimal","thinking":{"effort":"medium"}"#)),
        b(v4, r#","reasoning_effort":"low","thinking":{"effort":"high"},"chat_template_kwargs":{"thinking":true}"#)
    );
    assert_eq!(
        fw(&b(v4, r#","reasoning_effort":"xhigh""#)),
        b(v4, r#","reasoning_effort":"high","chat_template_kwargs":{"thinking":true}"#)
    );
    assert_eq!(
        fw(&b(v41, r#","reasoning_effort":"xhigh""#)),
        b(v41, r#","reasoning_effort":"xhigh","chat_template_kwargs":{"thinking":true}"#)
    );
    assert_eq!(
        fw(&b(v4, r#","thinking":{"type":"disabled"}"#)),
        b(v4, r#","thinking":{"type":"disabled"},"chat_template_kwargs":{"thinking":false}"#)
    );
    assert_eq!(
        fw(&b(v4, r#","reasoning_effort":"none","chat_template_kwargs":{"x":1}"#)),
        b(v4, r#","reasoning_effort":"none","chat_template_kwargs":{"x":1,"thinking":false}"#)
    );
    assert_eq!(
        fw(&b(v4, r#","chat_template_kwargs":{"thinking":null,"enable_thinking":false}"#)),
        b(v4, r#","chat_template_kwargs":{"thinking":false,"enable_thinking":false}"#)
    );
    assert_eq!(fw(&b(v4, r#","chat_template_kwargs":null"#)), b(v4, r#","chat_template_kwargs":{"thinking":true}"#));
    assert!(chat(&b(v4, r#","chat_template_kwargs":{"thinking":true}"#)).unwrap().edits.is_empty());
}

#[test]
fn pretty_printed_bodies_keep_their_layout() {
    let body = "{\n  \"messages\": [\n    {\"role\": \"user\", \"content\": \"hi\"}\n  ],\n  \"model\": \"kimi-k3\",\n  \"top_p\": 0.95,\n  \"max_tokens\": 1000,\n  \"metadata\": {\"w\": 1.50e0}\n}";
    let out = fw(body);
    assert_eq!(
        out,
        "{\n  \"messages\": [\n    {\"role\": \"user\", \"content\": \"hi\"}\n  ],\n  \"model\": \"kimi-k3\",\n  \"top_p\": 0.95,\n  \"max_tokens\": 1000,\n  \"metadata\": {\"w\": 1.50e0},\"temperature\":1.0,\"presence_penalty\":0,\"frequency_penalty\":0,\"n\":1\n}"
    );
}
