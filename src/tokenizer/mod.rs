//! The gateway's tokenizer, for workers that take token ids (gRPC): a model's Hugging Face
//! `tokenizer.json` through the `tokenizers` crate, its chat template, and an incremental
//! detokenizer. Loaded once per model, off the request path, and shared by every shard.
//!
//! `byte_bpe.rs` is a faster encode for GPT-2-style byte-level BPE; `config.rs` reads
//! `tokenizer_config.json`; `template.rs` renders the chat template (with `thinking.rs`'s
//! reasoning-mode decision, `pyjson.rs`'s `tojson` and `json_value.rs`'s request values);
//! `decode.rs` turns a token
//! stream back into text; `gguf.rs` reads a GGUF file's metadata and `from_gguf.rs` turns a
//! llama.cpp model's vocabulary into the two Hugging Face files.

pub mod byte_bpe;
pub mod config;
pub mod decode;
pub mod from_gguf;
pub mod gguf;
pub mod json_value;
pub mod pyjson;
pub mod segment_cache;
pub mod template;
pub mod thinking;

use std::path::Path;

pub use config::TokenizerConfig;
pub use decode::IncrementalDecoder;
pub use template::{ChatTemplate, TemplateInput};
pub use thinking::{ThinkingAsk, ThinkingStyle};

/// A model's tokenizer, chat template and detokenizer table.
pub struct Tokenizer {
    hf: tokenizers::Tokenizer,
    config: TokenizerConfig,
    template: Option<ChatTemplate>,
    /// None when the decoder is not a per-token byte map (then `DecodeStream` decodes).
    table: Option<decode::TokenBytes>,
    /// The fast encode, when the tokenizer has its shape and agreed on the probe corpus.
    fast: Option<byte_bpe::ByteBpe>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab", &self.hf.get_vocab_size(true))
            .field("template", &self.template.is_some())
            .field("table", &self.table.is_some())
            .field("fast", &self.fast.is_some())
            .finish()
    }
}

impl Tokenizer {
    /// What `--tokenizer-path` names: a model directory, a `tokenizer.json` (its siblings
    /// read as in a directory), or a llama.cpp `.gguf` model.
    pub fn load(path: &Path) -> Result<Self, String> {
        if path.is_dir() {
            return Self::from_dir(path);
        }
        let mut magic = [0u8; 4];
        let is_gguf = std::fs::File::open(path)
            .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut magic))
            .is_ok_and(|_| &magic == b"GGUF");
        if is_gguf {
            return Self::from_gguf(path);
        }
        match path.parent() {
            Some(dir) if path.file_name().is_some_and(|n| n == "tokenizer.json") => Self::from_dir(dir),
            _ => Err(format!("{}: neither a directory, a tokenizer.json nor a GGUF file", path.display())),
        }
    }

    /// Loads a model directory: `tokenizer.json`, and when present `tokenizer_config.json`
    /// and `chat_template.jinja` (newer transformers save the template there; it wins).
    pub fn from_dir(dir: &Path) -> Result<Self, String> {
        let read = |name: &str| std::fs::read(dir.join(name));
        let tj = read("tokenizer.json").map_err(|e| format!("{}: {e}", dir.join("tokenizer.json").display()))?;
        let cfg = read("tokenizer_config.json").ok().map(|b| String::from_utf8_lossy(&b).into_owned());
        let tpl = read("chat_template.jinja").ok().map(|b| String::from_utf8_lossy(&b).into_owned());
        Self::from_parts(&tj, cfg.as_deref(), tpl)
    }

    /// Builds the tokenizer of a llama.cpp GGUF model (see `from_gguf.rs`).
    pub fn from_gguf(path: &Path) -> Result<Self, String> {
        let files = from_gguf::convert_file(path)?;
        Self::from_parts(files.tokenizer_json.as_bytes(), Some(&files.tokenizer_config_json), None)
    }

    /// From the files' contents; `template` overrides the config's `chat_template`.
    pub fn from_parts(
        tokenizer_json: &[u8],
        config_json: Option<&str>,
        template: Option<String>,
    ) -> Result<Self, String> {
        let hf = tokenizers::Tokenizer::from_bytes(tokenizer_json).map_err(|e| format!("tokenizer.json: {e}"))?;
        let config = match config_json {
            Some(c) => TokenizerConfig::parse(c)?,
            None => TokenizerConfig::default(),
        };
        let template = match template.or_else(|| config.chat_template.clone()) {
            Some(src) => Some(ChatTemplate::new(&src, &config)?),
            None => None,
        };
        let table = decode::TokenBytes::build(&hf);
        let fast = byte_bpe::ByteBpe::build(&hf).filter(|f| agrees_on_probes(&hf, f));
        Ok(Tokenizer { hf, config, template, table, fast })
    }

    /// Appends `text`'s ids to `out` (cleared first, capacity kept). `add_special` adds what
    /// the post-processor adds (BOS for models that want it); special tokens written in the
    /// text (`<|im_start|>`) are always recognised, as in transformers and llama.cpp.
    pub fn encode_into(&self, text: &str, add_special: bool, out: &mut Vec<u32>) -> Result<(), String> {
        out.clear();
        // The fast path adds no specials; with `add_special` it serves only tokenizers
        // whose post-processor adds none (checked once at load).
        if let Some(f) = self.fast.as_ref().filter(|_| !add_special || !self.adds_specials()) {
            return f.encode(text, out);
        }
        // encode_fast: no character offsets (the gateway never maps ids back to spans).
        let enc = self.hf.encode_fast(text, add_special).map_err(|e| format!("tokenize: {e}"))?;
        out.extend_from_slice(enc.get_ids());
        Ok(())
    }

    /// [`Self::encode_into`], with the text between added tokens looked up in `cache` (see
    /// `segment_cache.rs`) where the fast path makes that exact; the whole text otherwise.
    pub fn encode_cached(
        &self,
        text: &str,
        add_special: bool,
        cache: &mut segment_cache::SegmentCache,
        out: &mut Vec<u32>,
    ) -> Result<(), String> {
        match self.fast.as_ref().filter(|_| !add_special || !self.adds_specials()) {
            Some(f) => {
                out.clear();
                f.encode_by_segment(text, out, |seg, out| cache.encode(seg, out, |s, o| f.encode_plain(s, o)))
            }
            None => self.encode_into(text, add_special, out),
        }
    }

    pub fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>, String> {
        let mut v = Vec::new();
        self.encode_into(text, add_special, &mut v)?;
        Ok(v)
    }

    /// Whether `add_special` changes anything (a BOS/EOS-adding post-processor).
    fn adds_specials(&self) -> bool {
        self.hf.get_post_processor().is_some_and(|p| tokenizers::PostProcessor::added_tokens(p, false) > 0)
    }

    /// Whether encoding takes the byte-level BPE fast path (`byte_bpe.rs`).
    pub fn has_fast_encode(&self) -> bool {
        self.fast.is_some()
    }

    /// A detokenizer for one generated sequence.
    pub fn decoder(&self, skip_special: bool) -> IncrementalDecoder<'_> {
        match &self.table {
            Some(t) => IncrementalDecoder::with_table(t, skip_special),
            None => IncrementalDecoder::with_stream(&self.hf, skip_special),
        }
    }

    /// All of `ids` as text, through the incremental path (the same text a stream shows).
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> String {
        let mut out = String::new();
        let mut d = self.decoder(skip_special);
        for &id in ids {
            d.step(id, &mut out);
        }
        d.finish(&mut out);
        out
    }

    /// Token `id`'s own bytes, specials included (a byte-level piece may be part of a
    /// character): what logprobs show for one token.
    pub fn token_bytes(&self, id: u32) -> std::borrow::Cow<'_, [u8]> {
        match &self.table {
            Some(t) => std::borrow::Cow::Borrowed(t.get(id)),
            None => std::borrow::Cow::Owned(self.hf.decode(&[id], false).unwrap_or_default().into_bytes()),
        }
    }

    pub fn chat_template(&self) -> Option<&ChatTemplate> {
        self.template.as_ref()
    }

    pub fn config(&self) -> &TokenizerConfig {
        &self.config
    }

    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.hf.token_to_id(token)
    }

    pub fn vocab_size(&self) -> usize {
        self.hf.get_vocab_size(true)
    }

    /// The `tokenizers` crate's own decode (for checks against the fast path).
    pub fn hf(&self) -> &tokenizers::Tokenizer {
        &self.hf
    }
}

/// Strings that exercise every branch of the GPT-2 split (contractions, letters, numbers,
/// punctuation, whitespace runs before words and at the end, digits, non-ASCII, markup).
const PROBES: &[&str] = &[
    "Hello, world! I'm here; they've 'll 'd 're 's 't 'm",
    "  two spaces\n\n\tand tabs\t\t  \n",
    "trailing   ",
    "   ",
    "x\u{a0}\u{a0}y \u{3000}\u{3000}z\u{2028}",
    "123 4567.89 1,000 \u{663}\u{664} \u{bd}",
    "caf\u{e9} na\u{ef}ve e\u{301} \u{4f60}\u{597d} \u{1f917}\u{1f980}",
    "<|im_start|>user\nhi<|im_end|>\n<|endoftext|><s></s>[INST]",
    "fn main() {\n    println!(\"{}\", a->b);\n}",
    "!!! ??? ... --- $$$ \u{201c}q\u{201d}",
];

/// The fast path is used only when it gives the crate's ids on every probe.
fn agrees_on_probes(hf: &tokenizers::Tokenizer, fast: &byte_bpe::ByteBpe) -> bool {
    let mut ours = Vec::new();
    PROBES.iter().all(|p| {
        ours.clear();
        let theirs = hf.encode_fast(*p, false).map(|e| e.get_ids().to_vec());
        fast.encode(p, &mut ours).is_ok() && theirs.is_ok_and(|t| t == ours)
    })
}

#[cfg(test)]
mod tests {
    use super::gguf::{Metadata, Value};
    use super::*;

    /// smg-sim --grpc's tokenizer is a plain GPT-2-style byte-level BPE: it must take the
    /// fast encode (the gRPC benchmarks against the simulator measure that path).
    #[test]
    fn the_simulators_tokenizer_takes_the_fast_encode() {
        use smg_loadtest::sim::tokenizer as sim;
        let t =
            Tokenizer::from_parts(sim::tokenizer_json().as_bytes(), Some(&sim::tokenizer_config_json()), None).unwrap();
        assert!(t.has_fast_encode());
    }

    /// A byte-level vocabulary holding "é" only as its two bytes (`Ã` = C3, `©` = A9), plus
    /// a control token and a merge.
    fn tiny() -> Tokenizer {
        let strs = |v: &[&str]| Value::Array(v.iter().map(|s| Value::Str(s.to_string())).collect());
        let mut kv = std::collections::HashMap::new();
        kv.insert("tokenizer.ggml.model".into(), Value::Str("gpt2".into()));
        kv.insert("tokenizer.ggml.pre".into(), Value::Str("gpt-2".into()));
        kv.insert("tokenizer.ggml.tokens".into(), strs(&["<|end|>", "c", "a", "f", "Ã", "©", "Ġ", "ca"]));
        kv.insert("tokenizer.ggml.token_type".into(), Value::Array([3, 1, 1, 1, 1, 1, 1, 1].map(Value::Int).to_vec()));
        kv.insert("tokenizer.ggml.merges".into(), strs(&["c a"]));
        kv.insert("tokenizer.chat_template".into(), Value::Str("{{ messages[0].content }}{{ eos_token }}".into()));
        kv.insert("tokenizer.ggml.eos_token_id".into(), Value::Uint(0));
        let files = from_gguf::convert(&Metadata { version: 3, tensor_count: 0, kv }).unwrap();
        Tokenizer::from_parts(files.tokenizer_json.as_bytes(), Some(&files.tokenizer_config_json), None).unwrap()
    }

    #[test]
    fn one_tokenizer_is_shared_by_every_shard() {
        fn shareable<T: Send + Sync>() {}
        shareable::<Tokenizer>();
    }

    #[test]
    fn encode_into_reuses_the_vec_and_matches_specials() {
        let tok = tiny();
        let mut ids = vec![99; 64];
        tok.encode_into("café<|end|>", false, &mut ids).unwrap();
        assert_eq!(ids, vec![7, 3, 4, 5, 0]);
        assert!(ids.capacity() >= 64);
    }

    #[test]
    fn a_character_split_across_tokens_waits_for_its_end() {
        let tok = tiny();
        let mut d = tok.decoder(false);
        let mut out = String::new();
        assert_eq!(d.step(7, &mut out), 2);
        assert_eq!(d.step(3, &mut out), 1);
        assert_eq!(d.step(4, &mut out), 0, "half of é is held back");
        assert_eq!(out, "caf");
        assert_eq!(d.step(5, &mut out), 2);
        assert_eq!(d.step(0, &mut out), "<|end|>".len());
        assert_eq!(out, "café<|end|>");
        // Skipping specials, and a stream that ends mid-character.
        let mut d = tok.decoder(true);
        let mut out = String::new();
        for id in [6, 0, 4] {
            d.step(id, &mut out);
        }
        assert_eq!(out, " ");
        d.finish(&mut out);
        assert_eq!(out, " \u{FFFD}");
        // Whole-sequence decode agrees with the tokenizers crate.
        let ids = [7, 3, 4, 5, 6, 0];
        assert_eq!(tok.decode(&ids, false), tok.hf().decode(&ids, false).unwrap());
        assert_eq!(tok.decode(&ids, true), tok.hf().decode(&ids, true).unwrap());
    }

    #[test]
    fn load_takes_a_directory_a_tokenizer_json_or_a_gguf() {
        let dir = std::env::temp_dir().join(format!("smg-tok-load-{}", std::process::id()));
        let tok = tiny();
        let files = super::from_gguf::HfFiles {
            tokenizer_json: tok.hf().to_string(false).unwrap(),
            tokenizer_config_json: r#"{"eos_token": "<|end|>", "chat_template": "{{ eos_token }}"}"#.into(),
        };
        files.write_to(&dir).unwrap();
        std::fs::write(dir.join("chat_template.jinja"), "jinja file wins").unwrap();
        for p in [dir.clone(), dir.join("tokenizer.json")] {
            let t = Tokenizer::load(&p).unwrap();
            assert_eq!(t.encode("café", false).unwrap(), vec![7, 3, 4, 5]);
            assert_eq!(t.chat_template().unwrap().render(&TemplateInput::default()).unwrap(), "jinja file wins");
        }
        std::fs::write(dir.join("x.bin"), b"GGUF\x09\0\0\0").unwrap();
        assert!(Tokenizer::load(&dir.join("x.bin")).unwrap_err().contains("version"));
        assert!(Tokenizer::load(&dir.join("missing")).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_template_sees_the_special_tokens() {
        let tok = tiny();
        let msgs: sonic_rs::Value = sonic_rs::from_str(r#"[{"role":"user","content":"hi"}]"#).unwrap();
        let out = tok.chat_template().unwrap().render(&TemplateInput { messages: Some(&msgs), ..Default::default() });
        assert_eq!(out.unwrap(), "hi<|end|>");
    }
}
