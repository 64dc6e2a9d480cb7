//! Request fields only self-hosted engines take (SGLang's sampling and serving extensions:
//! `top_k`, `min_p`, `repetition_penalty`, `regex`, `lora_path`, …). A cloud provider
//! refuses a request that carries them, so they are taken out of what a provider is sent,
//! by splices: every other byte goes as the client wrote it (SMG re-serializes instead).
//! The list is SMG's, so a request a provider accepts through SMG is accepted here.

use super::json::{parse, Kind};
use super::span::{apply, Splice};

/// Top-level fields no provider is sent.
const ENGINE_ONLY: [&str; 23] = [
    "request_id",
    "priority",
    "top_k",
    "min_p",
    "min_tokens",
    "regex",
    "ebnf",
    "json_schema",
    "stop_token_ids",
    "no_stop_trim",
    "ignore_eos",
    "continue_final_message",
    "skip_special_tokens",
    "lora_path",
    "session_params",
    "separate_reasoning",
    "stream_reasoning",
    "chat_template",
    "chat_template_kwargs",
    "return_hidden_states",
    "repetition_penalty",
    "sampling_seed",
    "backend_url",
];

/// `body` without its top-level engine-only members; None when it has none (or is not a
/// JSON object), so the body goes as it came.
pub fn without_engine_fields(body: &[u8]) -> Option<Vec<u8>> {
    // A cheap look first: most requests name none of them (and spell no key with escapes).
    // The finders are built once: building one per field per request cost more than the
    // search (perf, a provider's responses-1k turn: memmem's Searcher::new 2.4% of the shard).
    static FINDERS: std::sync::LazyLock<Vec<memchr::memmem::Finder<'static>>> = std::sync::LazyLock::new(|| {
        ENGINE_ONLY.iter().chain(&["\\u"]).map(|f| memchr::memmem::Finder::new(f.as_bytes())).collect()
    });
    if !FINDERS.iter().any(|f| f.find(body).is_some()) {
        return None;
    }
    let doc = parse(body).ok()?;
    if doc.kind(0) != Kind::Object {
        return None;
    }
    let members: Vec<(usize, usize)> = doc.members(0).collect();
    let gone: Vec<bool> = members.iter().map(|&(k, _)| ENGINE_ONLY.iter().any(|f| doc.str_is(k, f))).collect();
    if !gone.contains(&true) {
        return None;
    }
    // A removed member before the last kept one goes with the comma after it (to the next
    // key); the removed ones after the last kept one go in one splice from that member's end,
    // taking the comma before them.
    let last_kept = gone.iter().rposition(|g| !g);
    let mut splices = Vec::new();
    for (i, &(k, _)) in members.iter().enumerate() {
        if gone[i] && last_kept.is_some_and(|t| i < t) {
            let next = members[i + 1].0;
            splices.push(Splice {
                start: doc.node(k).start as usize,
                end: doc.node(next).start as usize,
                text: Vec::new(),
            });
        }
    }
    let first_trailing = last_kept.map_or(0, |t| t + 1);
    if first_trailing < members.len() {
        let start = match last_kept {
            Some(t) => doc.node(members[t].1).end as usize,
            None => doc.node(members[0].0).start as usize,
        };
        let end = doc.node(members[members.len() - 1].1).end as usize;
        splices.push(Splice { start, end, text: Vec::new() });
    }
    Some(apply(body, &splices))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strip(s: &str) -> Option<String> {
        without_engine_fields(s.as_bytes()).map(|b| String::from_utf8(b).unwrap())
    }

    #[test]
    fn engine_fields_are_cut_out_and_the_rest_stays_byte_for_byte() {
        assert_eq!(strip(r#"{"model":"m","temperature":0.70}"#), None);
        assert_eq!(
            strip(r#"{"model":"m","top_k":5,"temperature":0.70}"#).unwrap(),
            r#"{"model":"m","temperature":0.70}"#
        );
        assert_eq!(strip(r#"{"top_k":5, "model":"m"}"#).unwrap(), r#"{"model":"m"}"#);
        assert_eq!(strip(r#"{"model":"m", "min_p":0.1 ,"top_k":2}"#).unwrap(), r#"{"model":"m"}"#);
        assert_eq!(
            strip(r#"{"top_k":1,"model":"m","min_p":0.1,"max_tokens":1e2,"regex":"a","repetition_penalty":1.1}"#)
                .unwrap(),
            r#"{"model":"m","max_tokens":1e2}"#
        );
        assert_eq!(strip(r#"{"top_k":1,"min_p":2}"#).unwrap(), "{}");
        // Only at the top level: a tool's parameter named top_k is the client's own.
        let nested = r#"{"model":"m","tools":[{"type":"function","function":{"name":"f","parameters":{"top_k":{"type":"integer"}}}}]}"#;
        assert_eq!(strip(nested), None);
        // An escaped key is the same key.
        assert_eq!(strip(r#"{"model":"m","top\u005fk":3}"#).unwrap(), r#"{"model":"m"}"#);
        assert_eq!(strip(r#"["top_k"]"#), None);
        let out = strip(r#"{"a":1,"top_k":1,"b":[1,2],"min_p":1,"c":{}}"#).unwrap();
        assert_eq!(out, r#"{"a":1,"b":[1,2],"c":{}}"#);
        sonic_rs::from_str::<sonic_rs::Value>(&out).unwrap();
    }
}
