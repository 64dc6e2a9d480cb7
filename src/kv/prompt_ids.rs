//! The token ids an HTTP worker's engine will compute for a request, so `cache_aware` can match
//! them against the blocks its KV-cache events report (`--tokenizer-path`). Only the routing
//! decision reads them: the body is still forwarded as the bytes it arrived as.
//!
//! As the engines tokenize: a chat is rendered with its template and the generation prompt,
//! then encoded with no special tokens added (the template writes them); a completions or
//! `/generate` prompt string is encoded with them (the engine adds BOS where its tokenizer
//! does); a prompt given as ids is those ids.
//!
//! No ids (the caller falls back to the gateway's own tree) for what the engine would not key
//! in the base model's namespace: a LoRA adapter, a cache salt or an extra key. Nor for a
//! batch of prompts, a body that is not JSON, or a template that fails (the engine reports
//! that; routing is not the place).

use sonic_rs::{JsonContainerTrait, JsonType, JsonValueTrait, Value};

use crate::routing::TextSource;
use crate::tokenizer::segment_cache::SegmentCache;
use crate::tokenizer::Tokenizer;

/// Fields that move a request out of the base model's namespace in the engine's cache.
const NAMESPACED: [&str; 4] = ["lora_path", "lora_name", "cache_salt", "extra_key"];

/// The prompt's ids, or None when the engine's keys cannot be known (module docs).
/// `body`: as the inspect phase passed it, its nesting bounded (`bounded_json::inspected_value`).
/// `cache`: the shard's remembered segments (a conversation's earlier turns are not encoded
/// again; `tokenizer/segment_cache.rs`).
pub fn prompt_ids(tk: &Tokenizer, field: TextSource, body: &[u8], cache: &mut SegmentCache) -> Option<Vec<u32>> {
    let v = crate::bounded_json::inspected_value(body).ok()?;
    if NAMESPACED.iter().any(|k| v.get(*k).is_some_and(|x| !x.is_null())) {
        return None;
    }
    match field {
        TextSource::Chat => {
            let (text, _) = tk.chat_template()?.render_request(&v).ok()?;
            encode(tk, &text, false, cache)
        }
        TextSource::Completion => one_prompt(tk, v.get("prompt")?, cache),
        TextSource::Generate => match v.get("input_ids") {
            Some(ids) => one_prompt(tk, ids, cache),
            None => one_prompt(tk, v.get("text")?, cache),
        },
    }
}

/// A string, ids, or a batch of one of those.
fn one_prompt(tk: &Tokenizer, p: &Value, cache: &mut SegmentCache) -> Option<Vec<u32>> {
    match p.get_type() {
        JsonType::String => encode(tk, p.as_str()?, true, cache),
        JsonType::Array => {
            let arr = p.as_array()?;
            match arr.first().map(|x| x.get_type()) {
                Some(JsonType::Number) => arr.iter().map(|x| x.as_u64().and_then(|n| u32::try_from(n).ok())).collect(),
                Some(JsonType::String | JsonType::Array) if arr.len() == 1 => one_prompt(tk, &arr[0], cache),
                _ => None,
            }
        }
        _ => None,
    }
}

fn encode(tk: &Tokenizer, text: &str, add_special: bool, cache: &mut SegmentCache) -> Option<Vec<u32>> {
    let mut out = Vec::with_capacity(text.len() / 3);
    tk.encode_cached(text, add_special, cache, &mut out).ok()?;
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(tk: &Tokenizer, field: TextSource, body: &[u8]) -> Option<Vec<u32>> {
        prompt_ids(tk, field, body, &mut SegmentCache::default())
    }

    /// A byte-level tokenizer whose only merge is "a"+"b", with ChatML's specials and a template.
    fn tokenizer() -> Tokenizer {
        let mut vocab = String::from(r#""<|im_start|>":0,"<|im_end|>":1"#);
        let chars = crate::tokenizer::byte_bpe::byte_chars();
        for (b, c) in chars.iter().enumerate() {
            let esc = match c {
                '"' => "\\\"".to_string(),
                '\\' => "\\\\".to_string(),
                c => c.to_string(),
            };
            vocab.push_str(&format!(r#","{esc}":{}"#, b + 2));
        }
        vocab.push_str(r#","ab":258"#);
        let tj = format!(
            r#"{{"version":"1.0","added_tokens":[{{"id":0,"content":"<|im_start|>","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true}},{{"id":1,"content":"<|im_end|>","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true}}],"normalizer":null,"pre_tokenizer":{{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":true}},"post_processor":null,"decoder":{{"type":"ByteLevel","add_prefix_space":true,"trim_offsets":true,"use_regex":true}},"model":{{"type":"BPE","dropout":null,"unk_token":null,"continuing_subword_prefix":null,"end_of_word_suffix":null,"fuse_unk":false,"byte_fallback":false,"ignore_merges":false,"vocab":{{{vocab}}},"merges":["a b"]}}}}"#
        );
        let cfg = r#"{"chat_template":"{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"}"#;
        Tokenizer::from_parts(tj.as_bytes(), Some(cfg), None).unwrap()
    }

    fn bytes(s: &str) -> Vec<u32> {
        s.bytes().map(|b| b as u32 + 2).collect()
    }

    #[test]
    fn a_chat_is_rendered_with_the_generation_prompt_and_no_added_specials() {
        let tk = tokenizer();
        let got = ids(&tk, TextSource::Chat, br#"{"model":"m","messages":[{"role":"user","content":"xab"}]}"#);
        let mut want = vec![0];
        want.extend(bytes("user\nx"));
        want.push(258);
        want.push(1);
        want.extend(bytes("\n"));
        want.push(0);
        want.extend(bytes("assistant\n"));
        assert_eq!(got, Some(want));
        // continue_final_message leaves the generation prompt out.
        let cont = ids(
            &tk,
            TextSource::Chat,
            br#"{"messages":[{"role":"user","content":"x"}],"continue_final_message":true}"#,
        )
        .unwrap();
        assert_eq!(cont.last(), Some(&(b'\n' as u32 + 2)));
    }

    #[test]
    fn prompts_as_text_ids_or_a_batch_of_one() {
        let tk = tokenizer();
        assert_eq!(ids(&tk, TextSource::Completion, br#"{"prompt":"ab c"}"#), Some(vec![258, 34, 101]));
        assert_eq!(ids(&tk, TextSource::Completion, br#"{"prompt":[7,8,9]}"#), Some(vec![7, 8, 9]));
        assert_eq!(ids(&tk, TextSource::Completion, br#"{"prompt":["ab"]}"#), Some(vec![258]));
        assert_eq!(ids(&tk, TextSource::Completion, br#"{"prompt":[[1,2]]}"#), Some(vec![1, 2]));
        assert_eq!(ids(&tk, TextSource::Generate, br#"{"text":"ab","input_ids":[5]}"#), Some(vec![5]));
        assert_eq!(ids(&tk, TextSource::Generate, br#"{"text":"ab"}"#), Some(vec![258]));
    }

    #[test]
    fn no_ids_where_the_engine_keys_elsewhere_or_cannot_be_read() {
        let tk = tokenizer();
        for body in [
            &br#"{"prompt":"ab","lora_path":"sql"}"#[..],
            br#"{"prompt":"ab","cache_salt":"s"}"#,
            br#"{"prompt":["a","b"]}"#,
            br#"{"prompt":[-1]}"#,
            br#"{"prompt":"#,
            br#"[1]"#,
        ] {
            assert_eq!(ids(&tk, TextSource::Completion, body), None, "{}", String::from_utf8_lossy(body));
        }
        // A null namespace field is no namespace.
        assert!(ids(&tk, TextSource::Completion, br#"{"prompt":"ab","lora_path":null}"#).is_some());
    }

    /// smg-sim's HTTP workers (--tokenize-http) count and cache prompts with their own encoder;
    /// the gateway must compute the same ids from the same files, or no block would match.
    #[test]
    fn the_simulators_encoder_agrees_with_the_tokenizer_it_writes() {
        use smg_loadtest::sim::tokenizer as sim;
        let files = sim::files();
        let file = |n: &str| files.iter().find(|f| f.0 == n).map(|f| f.1.clone()).unwrap();
        let tk = Tokenizer::from_parts(file("tokenizer.json").as_bytes(), Some(&file("tokenizer_config.json")), None)
            .unwrap();
        let corpus = [
            "the answer is a simple story",
            "<|im_start|>user\nhello  world,\n\n  the river's 42 cats'd!<|im_end|>\n<|im_start|>assistant\n",
            "  leading spaces and trailing   ",
            "tabs\tand\r\nnewlines\n",
            "caf\u{e9} na\u{ef}ve \u{4e16}\u{754c} 123abc abc123 ...?! 'll 've 're",
            "thethe andand theanswer xyz qqq",
            "",
            " ",
            "<|start|>assistant<|channel|>final<|message|>ok<|return|>",
        ];
        for text in corpus {
            assert_eq!(sim::encode(text), tk.encode(text, false).unwrap(), "{text:?}");
        }
        // The rendered chat: the simulator renders ChatML itself.
        let body =
            br#"{"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"the river story"}]}"#;
        let want = sim::encode("<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nthe river story<|im_end|>\n<|im_start|>assistant\n");
        assert_eq!(ids(&tk, TextSource::Chat, body), Some(want));
    }

    /// The shard's segment cache changes nothing but the cost: turn after turn of one
    /// conversation, the ids equal a fresh encode, and the earlier turns are looked up.
    #[test]
    fn remembered_segments_give_the_same_ids() {
        use smg_loadtest::sim::tokenizer as sim;
        let files = sim::files();
        let file = |n: &str| files.iter().find(|f| f.0 == n).map(|f| f.1.clone()).unwrap();
        let tk = Tokenizer::from_parts(file("tokenizer.json").as_bytes(), Some(&file("tokenizer_config.json")), None)
            .unwrap();
        assert!(tk.has_fast_encode());
        let mut cache = SegmentCache::default();
        let mut msgs = Vec::new();
        for turn in 0..6 {
            msgs.push(format!(
                r#"{{"role":"user","content":"turn {turn}: the river and the mountain, a long story"}}"#
            ));
            let body = format!(r#"{{"messages":[{}]}}"#, msgs.join(","));
            let cached = prompt_ids(&tk, TextSource::Chat, body.as_bytes(), &mut cache);
            assert_eq!(cached, ids(&tk, TextSource::Chat, body.as_bytes()), "turn {turn}");
            msgs.push(format!(r#"{{"role":"assistant","content":"answer {turn} is the simple story of the city"}}"#));
        }
        // Each turn encodes only what is new: the last answer and the new question.
        assert_eq!(cache.misses, 1 + 2 * 5);
        assert_eq!(cache.hits, (0..6).map(|t| 2 * t + 1).sum::<u64>() - cache.misses);
    }
}
