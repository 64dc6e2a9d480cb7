//! The simulated model's tokenizer: a small, valid Hugging Face byte-level BPE (GPT-2 style) that
//! the simulator writes to a directory and names in GetModelInfo.tokenizer_path, so a gateway
//! tokenizes prompts and detokenizes the simulator's output like a real model's. HTTP workers
//! with --tokenize-http encode their prompts with it too ([`encode`]), as an engine would.
//!
//! Vocabulary: three ChatML special tokens, the 256 byte tokens, then every prefix of a list of
//! common English words, bare and with a leading space (`Ġ`), built by one merge per letter.
//! Output is drawn from the whole-word, leading-space tokens, so detokenized text reads as words.
//! Everything is generated from the constants below: the files are identical on every run.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use crate::sim::render::put_json_str;

/// The model's context window, advertised in GetModelInfo and the tokenizer config.
pub const CONTEXT_LENGTH: u32 = 32_768;

pub const ENDOFTEXT: &str = "<|endoftext|>";
pub const IM_START: &str = "<|im_start|>";
pub const IM_END: &str = "<|im_end|>";
/// Ids of the special tokens (first in the vocabulary).
pub const ENDOFTEXT_ID: u32 = 0;
pub const IM_START_ID: u32 = 1;
/// The end of an assistant turn: the model's EOS.
pub const IM_END_ID: u32 = 2;
const SPECIALS: [&str; 3] = [ENDOFTEXT, IM_START, IM_END];
/// gpt-oss's Harmony special tokens, after the rest of the vocabulary (so the ChatML model's
/// ids stay as they were): a simulator serving a `gpt-oss` model answers in Harmony.
pub const HARMONY_SPECIALS: [&str; 7] =
    ["<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|call|>", "<|return|>", "<|constrain|>"];
/// Id of the byte token for byte 0; byte b is BYTE_BASE + b.
const BYTE_BASE: u32 = SPECIALS.len() as u32;

/// Words the simulated model says.
const WORDS: &[&str] = &[
    "the", "a", "and", "of", "to", "in", "is", "it", "that", "for", "on", "with", "as", "was", "at", "by", "this",
    "from", "or", "an", "be", "are", "not", "but", "we", "you", "they", "can", "will", "one", "all", "there", "more",
    "time", "model", "token", "answer", "question", "simple", "small", "large", "fast", "slow", "gateway", "worker",
    "request", "stream", "cache", "prefix", "batch", "core", "thread", "engine", "router", "text", "word", "world",
    "hello", "data", "light", "water", "river", "mountain", "city", "road", "house", "tree", "music", "story", "day",
    "night", "morning", "good", "new", "first", "last", "long", "great", "little", "right", "old", "big", "high",
];

/// Words of the vocabulary the simulated model never says on its own: Decisions' answer
/// labels (`yes`; `no` is a prefix of `not`), one token each, as in a real model's vocabulary.
const LABEL_WORDS: &[&str] = &["yes"];

/// The ChatML template, written for this simulator (Jinja, as HF chat templates are).
const CHAT_TEMPLATE: &str = "{%- for message in messages -%}\
{{- '<|im_start|>' + message['role'] + '\\n' -}}\
{%- if message['content'] is string -%}{{- message['content'] -}}\
{%- else -%}{%- for part in message['content'] -%}{%- if part['type'] == 'text' -%}{{- part['text'] -}}{%- endif -%}{%- endfor -%}\
{%- endif -%}\
{{- '<|im_end|>\\n' -}}\
{%- endfor -%}\
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}";

/// GPT-2's byte-to-character table: printable Latin-1 bytes stand for themselves, the others are
/// shifted to U+0100 and up, so every byte is one visible character in vocab and merges.
fn byte_char(b: u8) -> char {
    let printable = |b: u8| (b'!'..=b'~').contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b);
    if printable(b) {
        return char::from(b);
    }
    let shifted = (0..b).filter(|&x| !printable(x)).count() as u32;
    char::from_u32(256 + shifted).unwrap_or('?')
}

/// The vocabulary (index = id) and merges, built once.
struct Vocab {
    tokens: Vec<String>,
    /// Each token's bytes (a special token's text; a byte-level token's bytes), by id.
    bytes: Vec<Vec<u8>>,
    merges: Vec<(String, String)>,
    /// Ids of whole words with a leading space (what the model outputs after its first word).
    word_ids: Vec<u32>,
    /// The same words without the space (a reply's first word).
    bare_ids: Vec<u32>,
}

fn vocab() -> &'static Vocab {
    static V: OnceLock<Vocab> = OnceLock::new();
    V.get_or_init(|| {
        let mut tokens: Vec<String> = SPECIALS.iter().map(|s| s.to_string()).collect();
        tokens.extend((0..=255u8).map(|b| byte_char(b).to_string()));
        let mut merges = Vec::new();
        let mut word_ids = Vec::new();
        let mut bare_ids = Vec::new();
        for (w, word) in WORDS.iter().chain(LABEL_WORDS).enumerate() {
            for spelled in [word.to_string(), format!(" {word}")] {
                let chars: Vec<String> = spelled.bytes().map(|b| byte_char(b).to_string()).collect();
                let mut acc = chars[0].clone();
                for c in &chars[1..] {
                    let merged = format!("{acc}{c}");
                    if !tokens.contains(&merged) {
                        merges.push((acc.clone(), c.clone()));
                        tokens.push(merged.clone());
                    }
                    acc = merged;
                }
                let id = tokens.iter().position(|t| *t == acc).unwrap_or(0) as u32;
                if w >= WORDS.len() {
                    continue;
                }
                if spelled.starts_with(' ') {
                    word_ids.push(id);
                } else {
                    bare_ids.push(id);
                }
            }
        }
        tokens.extend(HARMONY_SPECIALS.iter().map(|s| s.to_string()));
        let mut unbyte = std::collections::HashMap::with_capacity(256);
        for b in 0..=255u8 {
            unbyte.insert(byte_char(b), b);
        }
        let bytes = tokens
            .iter()
            .enumerate()
            .map(|(id, t)| {
                if id < SPECIALS.len() || HARMONY_SPECIALS.contains(&t.as_str()) {
                    t.as_bytes().to_vec()
                } else {
                    t.chars().filter_map(|c| unbyte.get(&c).copied()).collect()
                }
            })
            .collect();
        Vocab { tokens, bytes, merges, word_ids, bare_ids }
    })
}

/// Ids of the whole-word tokens with a leading space.
pub fn word_ids() -> &'static [u32] {
    &vocab().word_ids
}

/// Word `i` (of `word_ids().len()`), with or without its leading space.
pub fn word(i: usize, leading_space: bool) -> u32 {
    let v = vocab();
    if leading_space {
        v.word_ids[i]
    } else {
        v.bare_ids[i]
    }
}

pub fn vocab_size() -> usize {
    vocab().tokens.len()
}

/// Id of Harmony special token `t` (one of [`HARMONY_SPECIALS`]).
pub fn harmony_id(t: &str) -> Option<u32> {
    let at = HARMONY_SPECIALS.iter().position(|s| *s == t)?;
    Some((vocab().tokens.len() - HARMONY_SPECIALS.len() + at) as u32)
}

/// `text` as byte tokens, but for Harmony's special tokens, which are their own ids (as a
/// gpt-oss model emits them).
pub fn encode_harmony(text: &str) -> Vec<u32> {
    let mut ids = Vec::with_capacity(text.len());
    let mut rest = text;
    while !rest.is_empty() {
        match HARMONY_SPECIALS.iter().find(|s| rest.starts_with(**s)) {
            Some(s) => {
                ids.extend(harmony_id(s));
                rest = &rest[s.len()..];
            }
            None => {
                let n = rest.chars().next().map_or(1, char::len_utf8);
                ids.extend(rest[..n].bytes().map(byte_id));
                rest = &rest[n..];
            }
        }
    }
    ids
}

/// Whether the prompt `ids` hold `needle` in their text (the simulated model reading its
/// prompt: a gpt-oss model calls a function only when the prompt declares it).
pub fn prompt_holds(ids: &[u32], needle: &str) -> bool {
    decode_bytes(ids).windows(needle.len()).any(|w| w == needle.as_bytes())
}

/// The bytes of `ids` as the model reads them: special tokens as their text (`<|im_start|>`),
/// byte-level tokens as their bytes; ids outside the vocabulary read as nothing.
pub fn decode_bytes(ids: &[u32]) -> Vec<u8> {
    let v = vocab();
    let mut bytes = Vec::with_capacity(ids.len() * 4);
    for &id in ids {
        bytes.extend_from_slice(v.bytes.get(id as usize).map_or(&[][..], Vec::as_slice));
    }
    bytes
}

/// Id of the byte token for `b` (prompts a client built without the tokenizer still decode).
pub fn byte_id(b: u8) -> u32 {
    BYTE_BASE + b as u32
}

/// The text of token `id` (its bytes as UTF-8, lossy), for tests and logs.
pub fn token_text(id: u32) -> String {
    vocab().bytes.get(id as usize).map(|b| String::from_utf8_lossy(b).into_owned()).unwrap_or_default()
}

/// `text` as this tokenizer encodes it with no special tokens added (the Hugging Face
/// `tokenizers` result for this vocabulary): special tokens written in the text first, then
/// GPT-2's pre-tokenizer split, then byte-level BPE by merge rank within each piece. HTTP
/// workers use it with --tokenize-http to count and cache prompts as an engine would.
pub fn encode(text: &str) -> Vec<u32> {
    let t = tables();
    let mut out = Vec::with_capacity(text.len() / 3 + 1);
    let mut rest = text;
    loop {
        let next = specials().filter_map(|(id, sp)| rest.find(sp).map(|at| (at, id, sp.len()))).min();
        let Some((at, id, len)) = next else {
            encode_plain(t, rest, &mut out);
            break;
        };
        encode_plain(t, &rest[..at], &mut out);
        out.push(id);
        rest = &rest[at + len..];
    }
    out
}

/// An HTTP request's prompt in this model's tokens (--tokenize-http): `raw`, the prompt field's
/// JSON as the request carried it. A chat (`messages`) is rendered as [`CHAT_TEMPLATE`] renders
/// it, with the generation prompt; a prompt string is encoded; ids are taken as they are.
/// None for anything else (a batch, a non-text part): the caller counts bytes.
pub fn http_prompt_ids(chat: bool, raw: &str) -> Option<Vec<u32>> {
    use sonic_rs::{JsonContainerTrait, JsonValueTrait};
    let v: sonic_rs::Value = sonic_rs::from_str(raw).ok()?;
    if chat {
        let mut text = String::with_capacity(raw.len() + 64);
        for m in v.as_array()?.iter() {
            text.push_str(IM_START);
            text.push_str(m.get("role")?.as_str()?);
            text.push('\n');
            let content = m.get("content")?;
            match content.as_str() {
                Some(s) => text.push_str(s),
                None => {
                    for part in content.as_array()?.iter() {
                        if part.get("type").and_then(|t| t.as_str()) == Some("text") {
                            text.push_str(part.get("text")?.as_str()?);
                        }
                    }
                }
            }
            text.push_str(IM_END);
            text.push('\n');
        }
        text.push_str(IM_START);
        text.push_str("assistant\n");
        return Some(encode(&text));
    }
    if let Some(s) = v.as_str() {
        return Some(encode(s));
    }
    v.as_array()?.iter().map(|x| x.as_u64().and_then(|n| u32::try_from(n).ok())).collect()
}

/// Lookups for [`encode`]: token text → id, and merge → rank.
struct Tables {
    ids: HashMap<String, u32>,
    ranks: HashMap<(String, String), usize>,
}

fn tables() -> &'static Tables {
    static T: OnceLock<Tables> = OnceLock::new();
    T.get_or_init(|| {
        let v = vocab();
        let ids = v.tokens.iter().enumerate().map(|(i, t)| (t.clone(), i as u32)).collect();
        let ranks = v.merges.iter().enumerate().map(|(r, m)| (m.clone(), r)).collect();
        Tables { ids, ranks }
    })
}

fn encode_plain(t: &Tables, text: &str, out: &mut Vec<u32>) {
    for piece in pretokens(text) {
        let mut syms: Vec<String> = piece.bytes().map(|b| byte_char(b).to_string()).collect();
        // The lowest-ranked adjacent pair merges first, the leftmost among equals.
        loop {
            let best = (0..syms.len().saturating_sub(1))
                .filter_map(|i| t.ranks.get(&(syms[i].clone(), syms[i + 1].clone())).map(|&r| (r, i)))
                .min();
            let Some((_, i)) = best else { break };
            let right = syms.remove(i + 1);
            syms[i].push_str(&right);
        }
        out.extend(syms.iter().map(|s| t.ids.get(s).copied().unwrap_or(0)));
    }
}

/// GPT-2's split: `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`.
fn pretokens(text: &str) -> Vec<&str> {
    let chars: Vec<(usize, char)> = text.char_indices().collect();
    let at = |i: usize| chars.get(i).map_or(text.len(), |c| c.0);
    let class = |c: char| {
        if c.is_alphabetic() {
            1
        } else if c.is_numeric() {
            2
        } else if c.is_whitespace() {
            0
        } else {
            3
        }
    };
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let rest = &text[chars[i].0..];
        if let Some(c) = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d"].iter().find(|c| rest.starts_with(**c)) {
            out.push(&rest[..c.len()]);
            i += c.chars().count();
            continue;
        }
        let c = chars[i].1;
        let lead = usize::from(c == ' ' && chars.get(i + 1).is_some_and(|n| class(n.1) != 0));
        let k = class(chars[i + lead].1);
        let mut j = i + lead;
        if k != 0 {
            while j < chars.len() && class(chars[j].1) == k {
                j += 1;
            }
        } else {
            while j < chars.len() && class(chars[j].1) == 0 {
                j += 1;
            }
            // `\s+(?!\S)`: a run before a non-space leaves its last character to it.
            if j < chars.len() && j - i > 1 {
                j -= 1;
            }
        }
        out.push(&text[chars[i].0..at(j)]);
        i = j;
    }
    out
}

/// Every special token with its id: ChatML's first, Harmony's last.
fn specials() -> impl Iterator<Item = (u32, &'static str)> {
    let first = SPECIALS.iter().enumerate().map(|(i, t)| (i as u32, *t));
    first.chain(HARMONY_SPECIALS.iter().filter_map(|t| Some((harmony_id(t)?, *t))))
}

/// tokenizer.json (HF `tokenizers` format).
pub fn tokenizer_json() -> String {
    let v = vocab();
    let mut s = String::with_capacity(64 * 1024);
    s.push_str("{\"version\":\"1.0\",\"truncation\":null,\"padding\":null,\"added_tokens\":[");
    for (n, (i, t)) in specials().enumerate() {
        let _ = write!(
            s,
            "{}{{\"id\":{i},\"content\":{},\"single_word\":false,\"lstrip\":false,\"rstrip\":false,\"normalized\":false,\"special\":true}}",
            if n == 0 { "" } else { "," },
            json(t)
        );
    }
    s.push_str("],\"normalizer\":null,");
    s.push_str("\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"trim_offsets\":true,\"use_regex\":true},");
    s.push_str("\"post_processor\":{\"type\":\"ByteLevel\",\"add_prefix_space\":true,\"trim_offsets\":false,\"use_regex\":true},");
    s.push_str(
        "\"decoder\":{\"type\":\"ByteLevel\",\"add_prefix_space\":true,\"trim_offsets\":true,\"use_regex\":true},",
    );
    s.push_str("\"model\":{\"type\":\"BPE\",\"dropout\":null,\"unk_token\":null,\"continuing_subword_prefix\":null,\"end_of_word_suffix\":null,\"fuse_unk\":false,\"byte_fallback\":false,\"ignore_merges\":false,\"vocab\":{");
    for (id, t) in v.tokens.iter().enumerate() {
        let _ = write!(s, "{}{}:{id}", if id == 0 { "" } else { "," }, json(t));
    }
    s.push_str("},\"merges\":[");
    for (i, (a, b)) in v.merges.iter().enumerate() {
        let _ = write!(s, "{}{}", if i == 0 { "" } else { "," }, json(&format!("{a} {b}")));
    }
    s.push_str("]}}");
    s
}

/// tokenizer_config.json: the special tokens' roles and the chat template.
pub fn tokenizer_config_json() -> String {
    let mut s = String::from("{\"added_tokens_decoder\":{");
    for (n, (i, t)) in specials().enumerate() {
        let _ = write!(
            s,
            "{}\"{i}\":{{\"content\":{},\"lstrip\":false,\"normalized\":false,\"rstrip\":false,\"single_word\":false,\"special\":true}}",
            if n == 0 { "" } else { "," },
            json(t)
        );
    }
    let _ = write!(
        s,
        "}},\"additional_special_tokens\":[{},{}],\"bos_token\":null,\"eos_token\":{},\"pad_token\":{},\"unk_token\":null,\"add_bos_token\":false,\"add_eos_token\":false,\"clean_up_tokenization_spaces\":false,\"model_max_length\":{},\"tokenizer_class\":\"PreTrainedTokenizerFast\",\"chat_template\":{}}}",
        json(IM_START),
        json(IM_END),
        json(IM_END),
        json(ENDOFTEXT),
        CONTEXT_LENGTH,
        json(CHAT_TEMPLATE)
    );
    s
}

/// config.json, the little of a model config a gateway reads next to the tokenizer.
fn model_config_json() -> String {
    format!(
        "{{\"architectures\":[\"LlamaForCausalLM\"],\"model_type\":\"llama\",\"vocab_size\":{},\"max_position_embeddings\":{},\"bos_token_id\":null,\"eos_token_id\":{IM_END_ID},\"pad_token_id\":{ENDOFTEXT_ID}}}",
        vocab_size(),
        CONTEXT_LENGTH
    )
}

fn json(s: &str) -> String {
    let mut v = Vec::with_capacity(s.len() + 2);
    put_json_str(&mut v, s);
    String::from_utf8(v).unwrap_or_default()
}

/// The files of the tokenizer directory, by name.
pub fn files() -> [(&'static str, String); 3] {
    [
        ("tokenizer.json", tokenizer_json()),
        ("tokenizer_config.json", tokenizer_config_json()),
        ("config.json", model_config_json()),
    ]
}

/// Writes the tokenizer files into `dir` (created if needed). Each file goes through a temporary
/// name and a rename, so a reader never sees half a file even while another simulator writes
/// the same directory.
pub fn write_to(dir: &Path) -> io::Result<()> {
    std::fs::create_dir_all(dir)?;
    for (name, body) in files() {
        let tmp = dir.join(format!(".{name}.{}", std::process::id()));
        std::fs::write(&tmp, body)?;
        std::fs::rename(&tmp, dir.join(name))?;
    }
    Ok(())
}

/// The directory this process serves (`--tokenizer-dir`, else one under the temp dir), written
/// once per process.
pub fn ensure_dir(requested: Option<&Path>) -> io::Result<PathBuf> {
    static DEFAULT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    if let Some(dir) = requested {
        write_to(dir)?;
        return Ok(dir.to_path_buf());
    }
    DEFAULT
        .get_or_init(|| {
            // Named by content, not by process: every run writes the same files (atomically,
            // so processes may share the directory), and a test suite leaves one behind, not
            // one per process.
            let hash = files()
                .iter()
                .flat_map(|(name, body)| name.bytes().chain(body.bytes()))
                .fold(0xCBF2_9CE4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01B3));
            let dir = std::env::temp_dir().join(format!("smg-sim-tokenizer-{hash:016x}"));
            write_to(&dir).map(|_| dir).map_err(|e| e.to_string())
        })
        .clone()
        .map_err(io::Error::other)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_prompts_in_the_models_tokens() {
        let chat = r#"[{"role":"user","content":"the river"},{"role":"assistant","content":[{"type":"text","text":"a story"}]}]"#;
        let want = encode(
            "<|im_start|>user\nthe river<|im_end|>\n<|im_start|>assistant\na story<|im_end|>\n<|im_start|>assistant\n",
        );
        assert_eq!(http_prompt_ids(true, chat), Some(want));
        assert_eq!(encode("<|im_start|>")[..], [IM_START_ID]);
        // Merges go by rank: the bare word's merges come first, so " the" is "Ġ" + "the".
        assert_eq!(encode(" the").len(), 2);
        assert_eq!(encode("zq"), [byte_id(b'z'), byte_id(b'q')]);
        assert_eq!(http_prompt_ids(false, r#""the river""#), Some(encode("the river")));
        assert_eq!(http_prompt_ids(false, "[5,6]"), Some(vec![5, 6]));
        assert_eq!(http_prompt_ids(false, r#"["a","b"]"#), None);
    }

    #[test]
    fn byte_table_is_gpt2s() {
        assert_eq!(byte_char(b'a'), 'a');
        assert_eq!(byte_char(b' '), 'Ġ');
        assert_eq!(byte_char(b'\n'), 'Ċ');
        let all: std::collections::HashSet<char> = (0..=255u8).map(byte_char).collect();
        assert_eq!(all.len(), 256);
    }

    #[test]
    fn words_are_single_tokens_with_a_leading_space() {
        let ids = word_ids();
        assert_eq!(ids.len(), WORDS.len());
        assert_eq!(token_text(ids[0]), " the");
        assert_eq!(token_text(word(0, false)), "the");
        assert_eq!(token_text(word(WORDS.len() - 1, false)), "high");
        assert_eq!(token_text(IM_END_ID), IM_END);
        assert_eq!(token_text(byte_id(b'x')), "x");
        assert!(vocab_size() > 500 && vocab_size() < 2000, "{}", vocab_size());
        assert!(!ids.iter().any(|&i| token_text(i) == " yes"), "label words are not said");
        assert!((0..vocab_size() as u32).any(|i| token_text(i) == "yes"), "but they are tokens");
        let spelled: String = " the".bytes().map(byte_char).collect();
        assert_eq!(spelled, "Ġthe");
    }

    #[test]
    fn files_are_json() {
        for (name, body) in files() {
            sonic_rs::from_str::<sonic_rs::Value>(&body).unwrap_or_else(|e| panic!("{name}: {e}"));
        }
    }
}
