//! A GGUF model's tokenizer as the Hugging Face files the gateway loads: `tokenizer.json`
//! (byte-level BPE: vocabulary, merges, added tokens, and the pre-tokenizer llama.cpp uses
//! for the file's `tokenizer.ggml.pre`) and `tokenizer_config.json` (chat template, bos/eos,
//! special tokens). A llama.cpp worker only has its GGUF; with this, the gateway tokenizes
//! exactly as that worker does (tests/tokenizer_llama.rs checks it against llama-server).

use std::fmt::Write as _;
use std::path::Path;

use super::gguf::{Metadata, Value};

/// The two files, as JSON text.
#[derive(Debug, Clone)]
pub struct HfFiles {
    pub tokenizer_json: String,
    pub tokenizer_config_json: String,
}

impl HfFiles {
    /// Writes `tokenizer.json` and `tokenizer_config.json` into `dir` (created if missing).
    pub fn write_to(&self, dir: &Path) -> std::io::Result<()> {
        std::fs::create_dir_all(dir)?;
        std::fs::write(dir.join("tokenizer.json"), &self.tokenizer_json)?;
        std::fs::write(dir.join("tokenizer_config.json"), &self.tokenizer_config_json)
    }
}

/// Reads the GGUF file at `path` and converts its tokenizer.
pub fn convert_file(path: &Path) -> Result<HfFiles, String> {
    let meta = super::gguf::read_metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
    convert(&meta)
}

// llama.cpp's token types (`llama_token_type`): 1 normal, 2 unknown, 3 control, 4 user
// defined, 5 unused, 6 byte.
const TYPE_CONTROL: i64 = 3;
const TYPE_USER_DEFINED: i64 = 4;

/// The pre-tokenizer (as tokenizer.json JSON) equal to llama.cpp's split for a
/// `tokenizer.ggml.pre` value. llama.cpp's regexes (llama-vocab.cpp) are applied one after
/// the other, each keeping matches and the text between them; the HF equivalents below
/// apply the same expressions in the same order.
fn pre_tokenizer(pre: &str) -> Result<String, String> {
    // `'s|'t|…|\s+(?!\S)` is GPT-2's; llama.cpp's own implementation of it ends with `|\s+`
    // (unicode.cpp), exactly HF's ByteLevel regex, so ByteLevel with use_regex stands for it.
    const GPT2_BYTE_LEVEL: &str =
        r#"{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":true}"#;
    const BYTES_ONLY: &str = r#"{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":false}"#;
    let split = |regex: &str| {
        format!(
            r#"{{"type":"Sequence","pretokenizers":[{{"type":"Split","pattern":{{"Regex":{}}},"behavior":"Isolated","invert":false}},{BYTES_ONLY}]}}"#,
            json_str(regex)
        )
    };
    Ok(match pre {
        "gpt-2" | "phi-2" | "mpt" | "olmo" | "jais" | "roberta-bpe" => GPT2_BYTE_LEVEL.to_string(),
        // `\p{N}` first (every digit its own piece), then GPT-2's: HF's Digits pre-tokenizer
        // with individual digits splits on exactly \p{N} (char::is_numeric).
        "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone" => {
            format!(
                r#"{{"type":"Sequence","pretokenizers":[{{"type":"Digits","individual_digits":true}},{GPT2_BYTE_LEVEL}]}}"#
            )
        }
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "dbrx" | "smaug-bpe" => split(
            r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        ),
        "qwen2" | "stablelm2" | "deepseek-r1-qwen" => split(
            r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        ),
        other => {
            return Err(format!(
            "tokenizer.ggml.pre {other:?}: no known pre-tokenizer (a guess would tokenize differently from the engine)"
        ))
        }
    })
}

/// Converts the tokenizer in `meta` (only `tokenizer.ggml.model` = `gpt2`, byte-level BPE).
pub fn convert(meta: &Metadata) -> Result<HfFiles, String> {
    let model = meta.str("tokenizer.ggml.model").ok_or("no tokenizer.ggml.model")?;
    if model != "gpt2" {
        return Err(format!("tokenizer.ggml.model {model:?}: only gpt2 (byte-level BPE) is converted"));
    }
    let tokens = strings(meta, "tokenizer.ggml.tokens")?;
    let merges = strings(meta, "tokenizer.ggml.merges")?;
    let types: Vec<i64> = match meta.get("tokenizer.ggml.token_type").and_then(Value::as_array) {
        Some(a) => a.iter().map(|v| v.as_i64().unwrap_or(1)).collect(),
        None => vec![1; tokens.len()],
    };
    if types.len() != tokens.len() {
        return Err("tokenizer.ggml.token_type and tokenizer.ggml.tokens differ in length".into());
    }
    // No value (or "default") is llama.cpp's four-regex default split, not converted here.
    let pre = pre_tokenizer(meta.str("tokenizer.ggml.pre").unwrap_or("default"))?;
    let token_of = |key: &str| -> Option<&str> {
        let id = meta.u64(key)? as usize;
        tokens.get(id).copied()
    };
    let bos = token_of("tokenizer.ggml.bos_token_id");
    let eos = token_of("tokenizer.ggml.eos_token_id");
    let add_bos = meta.bool("tokenizer.ggml.add_bos_token").unwrap_or(false);
    let add_eos = meta.bool("tokenizer.ggml.add_eos_token").unwrap_or(false);

    // Control and user-defined tokens are matched whole in the text before the BPE (llama.cpp
    // does so for both when it parses specials, as llama-server's /tokenize and prompts do).
    let added: Vec<(usize, &str, bool)> = tokens
        .iter()
        .zip(&types)
        .enumerate()
        .filter(|(_, (_, &t))| t == TYPE_CONTROL || t == TYPE_USER_DEFINED)
        .map(|(id, (&tok, &t))| (id, tok, t == TYPE_CONTROL))
        .collect();

    let mut tj = String::with_capacity(tokens.len() * 24 + merges.len() * 16);
    tj.push_str(r#"{"version":"1.0","truncation":null,"padding":null,"added_tokens":["#);
    for (i, &(id, content, special)) in added.iter().enumerate() {
        if i > 0 {
            tj.push(',');
        }
        let _ = write!(
            tj,
            r#"{{"id":{id},"content":{},"single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":{special}}}"#,
            json_str(content)
        );
    }
    let _ = write!(tj, r#"],"normalizer":null,"pre_tokenizer":{pre},"post_processor":"#);
    tj.push_str(&post_processor(bos.filter(|_| add_bos), eos.filter(|_| add_eos), &tokens));
    tj.push_str(r#","decoder":{"type":"ByteLevel","add_prefix_space":true,"trim_offsets":true,"use_regex":true},"#);
    tj.push_str(r#""model":{"type":"BPE","dropout":null,"unk_token":null,"continuing_subword_prefix":null,"end_of_word_suffix":null,"fuse_unk":false,"byte_fallback":false,"ignore_merges":false,"vocab":{"#);
    for (id, tok) in tokens.iter().enumerate() {
        if id > 0 {
            tj.push(',');
        }
        let _ = write!(tj, "{}:{id}", json_str(tok));
    }
    tj.push_str(r#"},"merges":["#);
    for (i, m) in merges.iter().enumerate() {
        if i > 0 {
            tj.push(',');
        }
        tj.push_str(&json_str(m));
    }
    tj.push_str("]}}");

    let mut cfg = String::with_capacity(4096);
    cfg.push('{');
    let _ = write!(cfg, r#""tokenizer_class":"GPT2Tokenizer","add_bos_token":{add_bos},"add_eos_token":{add_eos}"#);
    // llama.cpp's smollm/gpt-2 vocabularies keep spaces as they are when decoding.
    cfg.push_str(r#","clean_up_tokenization_spaces":false"#);
    for (key, tok) in
        [("bos_token", bos), ("eos_token", eos), ("pad_token", token_of("tokenizer.ggml.padding_token_id"))]
    {
        if let Some(t) = tok {
            let _ = write!(cfg, r#","{key}":{}"#, json_str(t));
        }
    }
    if let Some(arch) = meta.str("general.architecture") {
        if let Some(n) = meta.u64(&format!("{arch}.context_length")) {
            let _ = write!(cfg, r#","model_max_length":{n}"#);
        }
    }
    if let Some(t) = meta.str("tokenizer.chat_template") {
        let _ = write!(cfg, r#","chat_template":{}"#, json_str(t));
    }
    cfg.push_str(r#","added_tokens_decoder":{"#);
    for (i, &(id, content, special)) in added.iter().enumerate() {
        if i > 0 {
            cfg.push(',');
        }
        let _ = write!(
            cfg,
            r#""{id}":{{"content":{},"lstrip":false,"normalized":false,"rstrip":false,"single_word":false,"special":{special}}}"#,
            json_str(content)
        );
    }
    cfg.push_str("}}");
    Ok(HfFiles { tokenizer_json: tj, tokenizer_config_json: cfg })
}

/// BOS/EOS added by the post-processor when the GGUF says the model wants them; otherwise
/// GPT-2's byte-level post-processor, which adds nothing.
fn post_processor(bos: Option<&str>, eos: Option<&str>, tokens: &[&str]) -> String {
    if bos.is_none() && eos.is_none() {
        return r#"{"type":"ByteLevel","add_prefix_space":true,"trim_offsets":false,"use_regex":true}"#.to_string();
    }
    let piece = |t: &str| format!(r#"{{"SpecialToken":{{"id":{},"type_id":0}}}}"#, json_str(t));
    let seq = |t: &str| format!(r#"{{"Sequence":{{"id":"{t}","type_id":0}}}}"#);
    let wrap = |body: &str| {
        let mut parts = Vec::new();
        if let Some(b) = bos {
            parts.push(piece(b));
        }
        parts.push(body.to_string());
        if let Some(e) = eos {
            parts.push(piece(e));
        }
        format!("[{}]", parts.join(","))
    };
    let specials: Vec<String> = [bos, eos]
        .into_iter()
        .flatten()
        .map(|t| {
            let id = tokens.iter().position(|x| *x == t).unwrap_or(0);
            format!(r#"{}:{{"id":{},"ids":[{id}],"tokens":[{}]}}"#, json_str(t), json_str(t), json_str(t))
        })
        .collect();
    format!(
        r#"{{"type":"TemplateProcessing","single":{},"pair":{},"special_tokens":{{{}}}}}"#,
        wrap(&seq("A")),
        wrap(&format!("{},{}", seq("A"), seq("B"))),
        specials.join(",")
    )
}

fn strings<'a>(meta: &'a Metadata, key: &str) -> Result<Vec<&'a str>, String> {
    let arr = meta.get(key).and_then(Value::as_array).ok_or_else(|| format!("no {key} array"))?;
    arr.iter().map(|v| v.as_str().ok_or_else(|| format!("{key}: an element is not a string"))).collect()
}

/// `s` as a JSON string literal.
fn json_str(s: &str) -> String {
    sonic_rs::to_string(s).unwrap_or_else(|_| "\"\"".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn arr(items: &[&str]) -> Value {
        Value::Array(items.iter().map(|s| Value::Str(s.to_string())).collect())
    }

    fn meta(pre: &str) -> Metadata {
        let mut kv = HashMap::new();
        kv.insert("tokenizer.ggml.model".into(), Value::Str("gpt2".into()));
        kv.insert("tokenizer.ggml.pre".into(), Value::Str(pre.into()));
        // Every byte-level character of "hi 12" plus two merges and a control token.
        kv.insert("tokenizer.ggml.tokens".into(), arr(&["<|im_end|>", "h", "i", "Ġ", "1", "2", "hi", "Ġ1"]));
        kv.insert(
            "tokenizer.ggml.token_type".into(),
            Value::Array([3, 1, 1, 1, 1, 1, 1, 1].iter().map(|&t| Value::Int(t)).collect()),
        );
        kv.insert("tokenizer.ggml.merges".into(), arr(&["h i", "Ġ 1"]));
        kv.insert("tokenizer.ggml.eos_token_id".into(), Value::Uint(0));
        kv.insert("tokenizer.chat_template".into(), Value::Str("{{ messages[0]['content'] }}".into()));
        Metadata { version: 3, tensor_count: 0, kv }
    }

    #[test]
    fn builds_a_loadable_byte_level_bpe() {
        let files = convert(&meta("smollm")).unwrap();
        let tk = tokenizers::Tokenizer::from_bytes(files.tokenizer_json.as_bytes()).unwrap();
        let ids = tk.encode("hi 12<|im_end|>", false).unwrap().get_ids().to_vec();
        // Digits are split off one by one before the BPE, so " 1" never merges (as llama.cpp).
        assert_eq!(ids, vec![6, 3, 4, 5, 0]);
        let cfg: sonic_rs::Value = sonic_rs::from_str(&files.tokenizer_config_json).unwrap();
        use sonic_rs::JsonValueTrait;
        assert_eq!(cfg["eos_token"].as_str(), Some("<|im_end|>"));
        assert_eq!(cfg["chat_template"].as_str(), Some("{{ messages[0]['content'] }}"));
        assert_eq!(cfg["added_tokens_decoder"]["0"]["special"].as_bool(), Some(true));
    }

    #[test]
    fn unknown_pre_tokenizers_and_models_are_refused() {
        assert!(convert(&meta("no-such-pre")).unwrap_err().contains("no-such-pre"));
        let mut m = meta("smollm");
        m.kv.insert("tokenizer.ggml.model".into(), Value::Str("llama".into()));
        assert!(convert(&m).is_err());
    }
}
