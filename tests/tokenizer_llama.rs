//! Tokenizer parity with the real engine: the gateway's tokenizer for SmolLM2, rebuilt from
//! the GGUF's vocabulary, merges and token types, must give exactly llama-server's
//! `POST /tokenize` ids on a corpus of several hundred strings; turning those ids back into
//! text one token at a time must give the text back exactly (characters split across
//! tokens included); and the chat template from the GGUF metadata must render what
//! llama-server's `POST /apply-template` renders.
//!
//! llama-server and the model are those of the end-to-end test (`.ci/llama-worker.sh`, which
//! `.ci/run` exports as LLAMA_SERVER and LLAMA_MODEL). Only when neither those variables nor
//! the cached files exist is the test skipped, loudly; with LLAMA_SERVER set, a missing file
//! fails it. Everything runs on 127.0.0.1, and the server is stopped at the end.

mod support;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use smg::tokenizer::{TemplateInput, Tokenizer};
use sonic_rs::{JsonContainerTrait, JsonValueTrait};
use support::{free_port, post, try_get, wait_until};

struct Llama {
    child: Child,
    port: u16,
    /// Its log, removed with it.
    log: tempfile::TempPath,
}

impl Drop for Llama {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The server binary and model, or None (after a loud message) when they are not here.
fn engine_files() -> Option<(PathBuf, PathBuf)> {
    let cache = std::env::var_os("SMG_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/smg"));
    let from_env = std::env::var_os("LLAMA_SERVER").is_some();
    let server = std::env::var_os("LLAMA_SERVER")
        .map(PathBuf::from)
        .unwrap_or_else(|| cache.join("llama-server-11434/llama-server"));
    let model = std::env::var_os("LLAMA_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| cache.join("SmolLM2-135M-Instruct.Q4_1.gguf"));
    if server.is_file() && model.is_file() {
        return Some((server, model));
    }
    assert!(!from_env, "LLAMA_SERVER/LLAMA_MODEL are set but {} or {} is missing", server.display(), model.display());
    eprintln!(
        "\n!!!!!!!! SKIPPED tokenizer parity: no llama-server at {} or no model at {}; \
         run `bash .ci/llama-worker.sh` (as .ci/run does) to build them !!!!!!!!\n",
        server.display(),
        model.display()
    );
    None
}

fn start_llama(server: &PathBuf, model: &PathBuf) -> Llama {
    let port = free_port();
    let log = tempfile::Builder::new().prefix("smg-tok-llama-").suffix(".log").tempfile().unwrap().into_temp_path();
    let child = Command::new(server)
        .args(["-m"])
        .arg(model)
        .args(["-t", "1", "-c", "2048", "-np", "1", "--host", "127.0.0.1", "--port", &port.to_string()])
        .args(["--alias", "SmolLM2-135M-Instruct"])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("spawn llama-server");
    let llama = Llama { child, port, log };
    let up = wait_until(Duration::from_secs(120), || try_get(port, "/health").is_ok_and(|r| r.status == 200));
    assert!(
        up,
        "llama-server never became healthy; its log: {}",
        std::fs::read_to_string(&llama.log).unwrap_or_default()
    );
    llama
}

fn json_str(s: &str) -> String {
    sonic_rs::to_string(s).unwrap()
}

fn llama_tokenize(port: u16, text: &str) -> Vec<u32> {
    let body = format!(r#"{{"content":{},"add_special":false}}"#, json_str(text));
    let r = post(port, "/tokenize", &body, &[]);
    assert_eq!(r.status, 200, "/tokenize: {}", r.text());
    r.json()["tokens"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect()
}

/// Strings of every kind the gateway will see in prompts. Fixed, then generated ones.
fn corpus() -> Vec<String> {
    let fixed: &[&str] = &[
        "Hello, world!",
        "hello world",
        " leading space",
        "trailing space ",
        "  two leading spaces",
        "The quick brown fox jumps over the lazy dog.",
        "I'm sure you'll see they've done it; we'd say it's fine, isn't it?",
        "'s 't 're 've 'm 'll 'd",
        "DON'T SHOUT'S",
        "Mr. O'Neil's dog",
        "e.g. i.e. etc.",
        "a",
        " ",
        "\n",
        "\t",
        "\n\n",
        "\r\n",
        "a\nb",
        "a\n\nb",
        "line one\nline two\n",
        "tab\tseparated\tvalues",
        "\t\tindented with tabs",
        "    indented with four spaces",
        "word    word",
        "trailing newline\n",
        "mixed \t \n whitespace",
        "   \n   \n",
        "end with spaces   ",
        "0",
        "42",
        "3.14159",
        "1,000,000",
        "2024-01-15",
        "12:30:45",
        "+1 (555) 123-4567",
        "1234567890",
        "00000000000000000000",
        "123456789012345678901234567890123456789012345678901234567890",
        "version 1.2.3-beta.4",
        "x1y2z3",
        "abc123def456",
        "$100.00 and 50%",
        "½ ¾ ² ³ ① ② Ⅻ",
        "٣٤٥ ١٢ (Arabic-Indic digits)",
        "१२३ (Devanagari digits)",
        "café",
        "naïve résumé",
        "Ångström",
        "straße",
        "Привет, мир!",
        "Γειά σου Κόσμε",
        "שלום עולם",
        "مرحبا بالعالم",
        "नमस्ते दुनिया",
        "สวัสดีชาวโลก",
        "你好，世界！",
        "日本語のテキストです。",
        "ひらがな カタカナ 漢字",
        "안녕하세요 세계",
        "中文English混合text",
        "𠀀𠀁 (astral CJK)",
        "🤗",
        "😀😃😄",
        "👨‍👩‍👧‍👦 family",
        "🇫🇷🇯🇵 flags",
        "👍🏽 thumbs",
        "I ❤️ Rust 🦀",
        "e\u{301} (combining acute)",
        "a\u{308}o\u{308}u\u{308}",
        "Z\u{351}\u{34b}\u{35b}a\u{334}l\u{338}g\u{35c}o\u{35d}",
        "n\u{303}",
        "\u{200b}zero\u{200b}width\u{200b}",
        "non\u{a0}breaking\u{a0}space",
        "em\u{2003}space and\u{3000}ideographic space",
        "soft\u{ad}hyphen",
        "“smart quotes” and ‘single’",
        "em—dash en–dash …",
        "© ® ™ § ¶ † ‡",
        "→ ← ↑ ↓ ⇒ ∀ ∃ ∈ ∑ ∫",
        "math: x² + y² = z²",
        "<|im_start|>user\nhi<|im_end|>",
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
        "<|im_start|>assistant\nThe answer is 4.<|im_end|>",
        "<|endoftext|>",
        "text<|endoftext|>more text",
        "<|im_start|><|im_end|>",
        "<|im_start|> spaced <|im_end|>",
        "<|im_start",
        "im_end|>",
        "<| im_start |>",
        "<file_sep>src/main.rs\nfn main() {}",
        "<repo_name>smg<filename>lib.rs",
        "<jupyter_code>print(1)<jupyter_output>1",
        "fn main() {\n    println!(\"Hello, world!\");\n}\n",
        "def f(x):\n    return x * 2\n",
        "    if (a && b) { return c || d; }",
        "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}",
        "SELECT * FROM users WHERE id = 42;",
        "<div class=\"container\"><p>Hi</p></div>",
        "{\"key\": \"value\", \"n\": [1, 2, 3]}",
        "x = [i**2 for i in range(10) if i % 2 == 0]",
        "#include <stdio.h>\n",
        "// comment\n/* block */",
        "a->b => c :: d",
        "!=  ==  <=  >=  &&  ||",
        "https://example.com/path?query=1&b=2#frag",
        "user@example.com",
        "C:\\Windows\\System32",
        "~/.config/app.toml",
        "snake_case_name and camelCaseName and PascalCase",
        "UPPER_CASE_CONSTANT",
        "...",
        "!!!???",
        "-----",
        "=====",
        "*****",
        "#####",
        "(((nested)))",
        "[[[]]]",
        "a.b.c.d",
        "@#$%^&*()",
        "markdown **bold** _italic_ `code`",
        "| col1 | col2 |\n|------|------|\n| a    | b    |",
        "- item one\n- item two\n  - nested",
        "1. first\n2. second",
        "> quoted text",
        "```python\nprint('hi')\n```",
        "Ünïcödé everywhere: ñ, ç, ø, å, œ",
        "ﬁ ligature and Ｆｕｌｌｗｉｄｔｈ",
        "\u{1}\u{2} control\u{7f}chars",
        "bell\u{7}",
        "null\u{0}byte",
    ];
    let mut out: Vec<String> = fixed.iter().map(|s| s.to_string()).collect();
    // Digit runs of every length up to 40, alone and after a word and a space.
    for n in 1..=40 {
        let digits: String = (0..n).map(|i| char::from(b'0' + ((i * 7 + 3) % 10) as u8)).collect();
        out.push(digits.clone());
        if n % 3 == 0 {
            out.push(format!("value {digits} units"));
        }
    }
    // Whitespace runs of every width between and before words, and at the end.
    for n in 1..=12 {
        let sp = " ".repeat(n);
        out.push(format!("a{sp}b"));
        out.push(format!("{sp}start"));
        out.push(format!("end{sp}"));
        out.push(format!("x{}y", "\n".repeat(n)));
        if n <= 6 {
            out.push(format!("t{}u", "\t".repeat(n)));
            out.push(format!("w{sp}\n{sp}v"));
        }
    }
    // Pseudo-random mixes from a pool of every class above (a fixed seed: the same corpus
    // every run).
    let pool: Vec<char> = "aZ09 \t\n'.,!?-_<>|{}()\"éßЖ中日本語한🤗🦀\u{301}\u{308}\u{200b}\u{a0}½١".chars().collect();
    let mut seed: u64 = 0x9E37_79B9_7F4A_7C15;
    for i in 0..80 {
        let len = 4 + (i % 29);
        let s: String = (0..len)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                pool[(seed % pool.len() as u64) as usize]
            })
            .collect();
        out.push(s);
    }
    out
}

#[test]
fn tokenizer_from_gguf_matches_llama_server() {
    let Some((server, model)) = engine_files() else { return };
    let llama = start_llama(&server, &model);
    let tok = Tokenizer::from_gguf(&model).expect("tokenizer from the GGUF");
    assert!(tok.has_fast_encode(), "SmolLM2 is GPT-2-style byte-level BPE: the fast encode applies");

    // === Encode: ids equal /tokenize's ===
    let corpus = corpus();
    assert!(corpus.len() >= 200, "corpus has {} strings", corpus.len());
    let mut ours = Vec::new();
    let mut mismatches = Vec::new();
    let mut engine_ids = Vec::with_capacity(corpus.len());
    for text in &corpus {
        let theirs = llama_tokenize(llama.port, text);
        tok.encode_into(text, false, &mut ours).unwrap();
        // The `tokenizers` crate's own path on the same tokenizer.json agrees too.
        let crate_ids = tok.hf().encode_fast(text.as_str(), false).unwrap().get_ids().to_vec();
        if ours != theirs || crate_ids != theirs {
            mismatches
                .push(format!("{text:?}\n    ours:   {ours:?}\n    crate:  {crate_ids:?}\n    llama:  {theirs:?}"));
        }
        engine_ids.push(theirs);
    }
    eprintln!("tokenize parity: {}/{} strings equal", corpus.len() - mismatches.len(), corpus.len());
    assert!(
        mismatches.is_empty(),
        "{} of {} strings differ:\n{}",
        mismatches.len(),
        corpus.len(),
        mismatches.join("\n")
    );

    // === Decode: llama-server's ids, one at a time, give the text back ===
    let mut split_chars = 0;
    for (text, ids) in corpus.iter().zip(&engine_ids) {
        let mut out = String::new();
        let mut dec = tok.decoder(false);
        for &id in ids {
            let before = out.len();
            let n = dec.step(id, &mut out);
            assert_eq!(n, out.len() - before);
            // A token that ends inside a character adds nothing (never half of one).
            if n == 0 {
                split_chars += 1;
            }
        }
        dec.finish(&mut out);
        assert_eq!(&out, text, "incremental decode of {ids:?}");
        assert_eq!(tok.hf().decode(ids, false).unwrap(), *text, "the tokenizers crate's own decode");
    }
    // The corpus has characters whose bytes span tokens (emoji, CJK, combining marks).
    assert!(split_chars > 20, "only {split_chars} tokens ended inside a character");
    eprintln!("incremental decode: {} strings exact; {split_chars} tokens held back mid-character", corpus.len());

    // === Chat template: equals /apply-template ===
    let template = tok.chat_template().expect("the GGUF carries a chat template");
    let conversations = [
        r#"[{"role":"user","content":"Hello!"}]"#,
        r#"[{"role":"system","content":"You are terse."},{"role":"user","content":"Say hi."}]"#,
        r#"[{"role":"system","content":"Be brief."},{"role":"user","content":"What is 2+2?"},{"role":"assistant","content":"4."},{"role":"user","content":"And 3+3?"}]"#,
        r#"[{"role":"user","content":"Multi\nline\n\twith tabs and ünïcödé 🤗"},{"role":"assistant","content":"Sure."},{"role":"user","content":"  spaced  "}]"#,
        r#"[{"role":"user","content":"<|im_start|>literal markup<|im_end|>"}]"#,
    ];
    for conv in conversations {
        for add_generation_prompt in [true, false] {
            let body = format!(r#"{{"messages":{conv},"add_generation_prompt":{add_generation_prompt}}}"#);
            let r = post(llama.port, "/apply-template", &body, &[]);
            assert_eq!(r.status, 200, "/apply-template: {}", r.text());
            let theirs = r.json()["prompt"].as_str().unwrap().to_string();
            let messages: sonic_rs::Value = sonic_rs::from_str(conv).unwrap();
            let ours = template
                .render(&TemplateInput { messages: Some(&messages), add_generation_prompt, ..Default::default() })
                .unwrap();
            assert_eq!(ours, theirs, "template for {conv} (add_generation_prompt={add_generation_prompt})");
            // And the rendered prompt tokenizes as the engine tokenizes it.
            assert_eq!(tok.encode(&ours, false).unwrap(), llama_tokenize(llama.port, &theirs));
        }
    }
    eprintln!("chat template: {} renders equal", conversations.len() * 2);
}

/// The fast encode (byte_bpe.rs) against the `tokenizers` crate's path on the same vocabulary,
/// for thousands of random strings over every character class the split distinguishes.
/// Needs only the GGUF.
#[test]
fn fast_encode_matches_the_tokenizers_crate_on_random_text() {
    let Some((_, model)) = engine_files() else { return };
    let tok = Tokenizer::from_gguf(&model).unwrap();
    assert!(tok.has_fast_encode());
    let pool: Vec<char> = "aZq09 \t\n\r\u{b}\u{c}'sltdmrev.,!?-_<>|{}()\"éßЖ中日한🤗\u{301}\u{308}\u{200b}\u{a0}\u{85}\u{2028}\u{3000}\u{1680}½١٣"
        .chars()
        .collect();
    let mut seed: u64 = 0x2545_F491_4F6C_DD1D;
    let mut ours = Vec::new();
    for i in 0..3000 {
        let s: String = (0..1 + i % 40)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                pool[(seed % pool.len() as u64) as usize]
            })
            .collect();
        let s = if i % 7 == 0 { format!("{s}<|im_end|>{s}") } else { s };
        tok.encode_into(&s, false, &mut ours).unwrap();
        let theirs = tok.hf().encode_fast(s.as_str(), false).unwrap().get_ids().to_vec();
        assert_eq!(ours, theirs, "{s:?}");
    }
}

/// Each output parser reads its family's markup as a real model's tokens decode it: the
/// markup tokenized with SmolLM2's vocabulary, decoded one token at a time by the gateway's
/// incremental detokenizer, each token's text one piece.
#[test]
fn parsers_read_each_familys_markup_at_real_token_boundaries() {
    use smg_parsers::{markup, Parsed, Tool, Tools};
    let Some((_, model)) = engine_files() else { return };
    let tok = Tokenizer::from_gguf(&model).unwrap();
    let pieces = |text: &str| -> Vec<String> {
        let ids = tok.encode(text, false).unwrap();
        let mut dec = tok.decoder(false);
        let mut out: Vec<String> = ids
            .iter()
            .map(|&id| {
                let mut s = String::new();
                dec.step(id, &mut s);
                s
            })
            .collect();
        let mut rest = String::new();
        dec.finish(&mut rest);
        out.push(rest);
        assert_eq!(out.concat(), text, "the tokens decode back to the text");
        // A token that ends inside a character decodes to nothing yet: such empty pieces
        // stay in, though the assembler passes only text on.
        out
    };
    let tools = Tools::new(vec![Tool { name: "get_weather".into(), params: vec![("city".into(), "string".into())] }]);
    for &name in smg_parsers::tools::NAMES {
        let call = markup::call(name, "get_weather", &[("city", "\"東京 😀\"")], 0).unwrap();
        let text = if markup::stands_alone(name) { call } else { format!("Let me check.{call}") };
        let ps = pieces(&text);
        assert!(ps.len() > 10, "{name}: {} tokens", ps.len());
        let mut p = smg_parsers::tools::by_name(name, tools.clone()).unwrap();
        let (mut all, mut out) = (Parsed::default(), Parsed::default());
        for piece in &ps {
            out.clear();
            p.push(piece, &mut out);
            all.content.push_str(&out.content);
            all.calls.append(&mut out.calls);
        }
        out.clear();
        p.finish(&mut out);
        all.content.push_str(&out.content);
        all.calls.append(&mut out.calls);
        assert_eq!(all.calls.len(), 1, "{name}: {all:?}");
        let args: sonic_rs::Value = sonic_rs::from_str(&all.calls[0].arguments).unwrap();
        assert_eq!(args["city"].as_str(), Some("東京 😀"), "{name}");
        assert_eq!(all.content, if markup::stands_alone(name) { "" } else { "Let me check." }, "{name}");
    }
    for &name in smg_parsers::reasoning::NAMES {
        let Some(text) = markup::reasoning(name, "Hmm, 東京 😀.", "Yes.") else { continue };
        let mut p = smg_parsers::reasoning::by_name(name, false).unwrap();
        let (mut all, mut out) = (Parsed::default(), Parsed::default());
        for piece in pieces(&text) {
            out.clear();
            p.push(&piece, &mut out);
            all.reasoning.push_str(&out.reasoning);
            all.content.push_str(&out.content);
        }
        out.clear();
        p.finish(&mut out);
        all.reasoning.push_str(&out.reasoning);
        all.content.push_str(&out.content);
        assert_eq!((all.reasoning.as_str(), all.content.as_str()), ("Hmm, 東京 😀.", "\n\nYes."), "{name}");
    }
}
