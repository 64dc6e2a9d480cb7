//! One function per parser of untrusted bytes, each taking the fuzzer's input as is. AFL
//! drives them from `fuzz/` (one binary per target, `fuzz/run`); `tests/replay.rs` runs every
//! file of `fuzz/corpus/<target>/` through them under `cargo test`.
//!
//! A target must return for every input: a panic (an `assert!` here included) is a crash,
//! and so a bug of the parser or of what these functions claim about it. Where a parser is
//! fed read by read in the gateway, its target also feeds it split at a point taken from the
//! input and checks that the split changes nothing.

// Unsafe code only where a comment proves it sound: each place has #[allow(unsafe_code)] and a SAFETY line.
#![deny(unsafe_code)]

use std::io::Cursor;
use std::sync::OnceLock;

use smg::contract::{self, Aliases, Endpoint};
use smg::http::body::{Body, BodyReader, Step};
use smg::http::multipart::{form_boundary, Event, FormReader};
use smg::realtime::scan::{Scan, Scanner};
use smg::tokenizer::{ChatTemplate, TokenizerConfig};
use smg_proto::scheduler::{GenerateResponse, GetModelInfoResponse, HealthCheckResponse};
use smg_wire::chunked::ChunkedDecoder;
use sonic_rs::{JsonContainerTrait, JsonValueTrait};

/// A target: it takes the fuzzer's bytes, and panics only on a bug.
pub type Target = fn(&[u8]);

/// Every target, by the name of its corpus directory and AFL binary.
pub const TARGETS: &[(&str, Target)] = &[
    ("request_head", request_head),
    ("chunked", chunked),
    ("body", body),
    ("response_head", response_head),
    ("multipart", multipart),
    ("ws_scan", ws_scan),
    ("contract", contract),
    ("grpc_framing", grpc_framing),
    ("chat_template", chat_template),
    ("gguf", gguf),
    ("parsers", parsers),
];

/// The first byte of `data` as a cut point into the rest, and the rest.
fn split(data: &[u8]) -> Option<(usize, &[u8])> {
    let (&cut, rest) = data.split_first()?;
    Some((cut as usize % (rest.len() + 1), rest))
}

/// `smg::http::head::parse_request` on a client's bytes; every range of a parsed head
/// lies inside the head.
pub fn request_head(data: &[u8]) {
    let Ok(Some(head)) = smg::http::head::parse_request(data) else { return };
    assert!(head.len <= data.len());
    let within = |r: &std::ops::Range<usize>| r.start <= r.end && r.end <= head.len;
    assert!(within(&head.target) && within(&head.path));
    assert!(head.absolute_authority.as_ref().is_none_or(within));
    assert!(head.hop.as_ref().is_none_or(within));
    for h in head.headers.iter().chain(&head.forward) {
        assert!(within(&h.name) && within(&h.value));
    }
    let _ = head.header(data, "content-type");
    let _ = head.method.name();
}

/// `smg_wire::chunked::ChunkedDecoder`: the body decoded in one feed and in two, cut where
/// the first byte says, gives the same bytes, the same end and the same error.
pub fn chunked(data: &[u8]) {
    let Some((cut, wire)) = split(data) else { return };
    let mut whole = ChunkedDecoder::new();
    let mut whole_out = Vec::new();
    let whole_res = whole.feed(wire, Some(&mut whole_out));

    let mut two = ChunkedDecoder::new();
    let mut two_out = Vec::new();
    let two_res = match two.feed(&wire[..cut], Some(&mut two_out)) {
        Ok(n) if two.is_done() => Ok(n),
        Ok(n) => {
            assert_eq!(n, cut, "a decoder not done took part of its input");
            two.feed(&wire[cut..], Some(&mut two_out)).map(|m| n + m)
        }
        Err(e) => Err(e),
    };
    assert_eq!(whole_res, two_res);
    assert_eq!(whole.is_done(), two.is_done());
    if let Ok(n) = whole_res {
        assert!(n <= wire.len());
        assert!(whole.is_done() || n == wire.len());
        assert_eq!(whole_out, two_out);
    }
}

/// `smg::http::body::BodyReader` after a parsed head: the buffer holds the head and part of
/// the body, then the rest arrives; what it returns lies inside the buffer.
pub fn body(data: &[u8]) {
    let Some((cut, bytes)) = split(data) else { return };
    let Ok(Some(head)) = smg::http::head::parse_request(bytes) else { return };
    let Ok(mut reader) = BodyReader::new(&head, 1 << 16) else { return };
    let cut = cut.max(head.len).min(bytes.len());
    let mut buf = bytes[..cut].to_vec();
    let mut fed_all = cut == bytes.len();
    loop {
        match reader.step(&mut buf) {
            Ok(Step::Done { body, next }) => {
                assert!(next <= buf.len());
                match &body {
                    Body::InBuf(r) => assert!(r.start <= r.end && r.end <= buf.len()),
                    Body::None | Body::Owned(_) => {}
                }
                let _ = body.bytes(&buf);
                // The reader is spent.
                assert!(reader.step(&mut buf).is_err());
                return;
            }
            Ok(Step::More(n)) => {
                assert!(n > 0);
                if fed_all {
                    return;
                }
                buf.extend_from_slice(&bytes[cut..]);
                fed_all = true;
            }
            Err(_) => return,
        }
    }
}

/// `smg::http::response_head::parse_response` on a worker's bytes.
pub fn response_head(data: &[u8]) {
    let Ok(Some(head)) = smg::http::response_head::parse_response(data) else { return };
    assert!(head.len <= data.len());
    let within = |r: &std::ops::Range<usize>| r.start <= r.end && r.end <= head.len;
    assert!(within(&head.reason));
    for (name, value) in &head.relay {
        assert!(within(name) && within(value));
    }
}

/// `smg::http::multipart` and `smg::api::transcriptions`: a Content-Type line, then the
/// body. The form checked whole and fed in two pieces gets the same verdict; the reader's
/// part ranges lie inside the body.
pub fn multipart(data: &[u8]) {
    let Some((cut, rest)) = split(data) else { return };
    let (ct, body) = match rest.iter().position(|b| *b == b'\n') {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (rest, &[][..]),
    };
    let cut = cut.min(body.len());
    let whole = smg::api::transcriptions::validate(Some(ct), body);
    let Ok(mut check) = smg::api::transcriptions::FormCheck::new(Some(ct)) else {
        assert!(whole.is_err());
        return;
    };
    let mut two = check.feed(&body[..cut]);
    let _ = (check.model(), check.file_started(), check.streaming());
    if two.is_ok() {
        two = check.feed(&body[cut..]);
    }
    let _ = (check.model(), check.file_started(), check.streaming());
    let two = two.and_then(|()| check.finish());
    assert_eq!(whole, two);
    if let Ok(t) = &whole {
        assert!(t.model_at.end <= body.len());
        assert_eq!(&body[t.model_at.clone()], t.model.as_bytes());
    }

    // The reader alone, with every event.
    let Some(boundary) = form_boundary(ct) else { return };
    let mut reader = FormReader::new(boundary);
    let mut sink = |e: Event<'_>| {
        if let Event::End { start, end } = e {
            assert!(start <= end && end <= body.len());
        }
        Ok(())
    };
    if reader.feed(&body[..cut], &mut sink).is_ok() && reader.feed(&body[cut..], &mut sink).is_ok() {
        let _ = reader.finish();
    }
}

/// `smg::realtime::scan::Scanner` over a WebSocket byte stream: the second byte sets the
/// message limit, the first the size of the reads. Reads of any size forward the same bytes
/// and end the same way as the whole stream scanned at once.
pub fn ws_scan(data: &[u8]) {
    let [read, limit, stream @ ..] = data else { return };
    let max = 1u64 << (limit % 40);
    let read = (*read as usize).max(1);

    let whole = scan_stream(max, stream, stream.len().max(1));
    let pieces = scan_stream(max, stream, read);
    assert_eq!(whole, pieces);
}

/// Bytes forwarded and how the stream ended (None: it did not), as a relay direction
/// scanning `stream` read by read would.
fn scan_stream(max: u64, stream: &[u8], read: usize) -> (usize, Option<Scan>) {
    let mut scanner = Scanner::new(max);
    let mut pending: Vec<u8> = Vec::new();
    let mut forwarded = 0;
    for piece in stream.chunks(read) {
        pending.extend_from_slice(piece);
        loop {
            let s = scanner.scan(&pending);
            match s {
                Scan::Forward { n, closed } => {
                    assert!(n <= pending.len());
                    pending.drain(..n);
                    forwarded += n;
                    if closed {
                        return (forwarded, Some(Scan::Forward { n: 0, closed }));
                    }
                    if n == 0 {
                        break;
                    }
                }
                Scan::Violation { n, code } => {
                    assert!(n <= pending.len());
                    return (forwarded + n, Some(Scan::Violation { n: 0, code }));
                }
            }
        }
    }
    let _ = (scanner.at_boundary(), scanner.left());
    (forwarded, None)
}

/// `smg::contract::inspect` (the first byte picks chat, completions or decisions) with the
/// body as JSON and no aliases; a planned rewrite applies and still parses. Then
/// `smg::bounded_json`'s whole and lazy reads of the same bytes.
pub fn contract(data: &[u8]) {
    let Some((&pick, body)) = data.split_first() else { return };
    let endpoint = match pick % 3 {
        0 => Endpoint::ChatCompletions,
        1 => Endpoint::Completions,
        _ => Endpoint::Decisions,
    };
    if let Ok(inspection) = contract::inspect(endpoint, body, true, &Aliases::default()) {
        let mut at = 0;
        for e in &inspection.edits {
            assert!(at <= e.start && e.start <= e.end && e.end <= body.len(), "splices out of order");
            at = e.end;
        }
        if !inspection.edits.is_empty() {
            let out = contract::apply(body, &inspection.edits);
            if let Err(e) = contract::json::parse(&out) {
                panic!("a rewritten body does not parse: {}", e.describe(&out));
            };
        }
    }

    if let Ok(v) = smg::bounded_json::value(body) {
        let _ = v.get("messages").and_then(|m| m.as_array()).map(|a| a.len());
    }
    for path in [&["model"][..], &["messages", "0", "content"], &["usage", "total_tokens"]] {
        if let Some(v) = smg::bounded_json::get(body, path) {
            let _ = (v.as_str(), v.as_u64(), v.as_f64(), v.is_object());
        }
    }
}

/// `smg_proto::framing::Deframer` over a worker's DATA frames: the first byte is the size of
/// the frames, the second the message limit, the third which response type is decoded. Then
/// the `grpc-message` percent-decoding on the same bytes.
pub fn grpc_framing(data: &[u8]) {
    let [frame, limit, kind, stream @ ..] = data else { return };
    let frame = (*frame as usize).max(1);
    let mut d = smg_proto::framing::Deframer::default();
    if *limit != 0 {
        d.set_limit((*limit as usize) << 4);
    }
    'frames: for piece in stream.chunks(frame) {
        d.push(piece);
        loop {
            let before = d.pending();
            let ready = d.has_message();
            let got = match kind % 3 {
                0 => d.next_message::<GenerateResponse>().map(|r| r.map(drop)),
                1 => d.next_message::<HealthCheckResponse>().map(|r| r.map(drop)),
                _ => d.next_message::<GetModelInfoResponse>().map(|r| r.map(drop)),
            };
            assert_eq!(ready, got.is_some(), "has_message disagrees with next_message");
            match got {
                None => break,
                Some(Ok(())) => assert!(d.pending() < before),
                Some(Err(_)) => break 'frames,
            }
        }
    }
    let _ = smg_proto::framing::percent_decode(data);
}

/// The chat template a gRPC worker's request is rendered with, here a small ChatML one with
/// tools, content parts and a thinking toggle.
const TEMPLATE: &str = "{%- if tools %}{{ '<|im_start|>system\\n' }}{% for t in tools %}{{ t | tojson }}\n{% endfor %}\
{{ '<|im_end|>\\n' }}{%- endif %}\
{%- for m in messages %}\
{%- if m.content is string %}{% set text = m.content %}\
{%- elif m.content is iterable %}{% set text = namespace(v='') %}{% for p in m.content %}\
{%- if p.type == 'text' %}{% set text.v = text.v ~ p.text %}{% endif %}{% endfor %}{% set text = text.v %}\
{%- else %}{% set text = '' %}{% endif %}\
<|im_start|>{{ m.role }}\n{{ text | trim }}\
{%- if m.tool_calls %}{% for c in m.tool_calls %}\n<tool_call>{{ c.function.name }} {{ c.function.arguments | tojson }}</tool_call>{% endfor %}{% endif %}\
<|im_end|>\n{%- endfor %}\
{%- if add_generation_prompt %}<|im_start|>assistant\n{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}{% endif %}";

fn template() -> &'static ChatTemplate {
    static T: OnceLock<ChatTemplate> = OnceLock::new();
    T.get_or_init(|| {
        let config = TokenizerConfig {
            bos_token: Some("<s>".into()),
            eos_token: Some("<|im_end|>".into()),
            ..Default::default()
        };
        ChatTemplate::new(TEMPLATE, &config).expect("the fuzz template compiles")
    })
}

/// `smg::tokenizer::template`: a chat body read by `bounded_json` (as the gRPC path reads it)
/// renders through a fixed template with its messages, tools, kwargs and thinking fields.
/// The same bytes are also read as a `tokenizer_config.json`.
pub fn chat_template(data: &[u8]) {
    let _ = std::str::from_utf8(data).map(TokenizerConfig::parse);
    let Ok(body) = smg::bounded_json::value(data) else { return };
    if body.get("messages").is_none() {
        return;
    }
    let _ = template().render_request(&body);
}

/// `smg::tokenizer::gguf::parse` of a GGUF header from memory, then the conversion of its
/// metadata to Hugging Face tokenizer files.
pub fn gguf(data: &[u8]) {
    let Ok(meta) = smg::tokenizer::gguf::parse(&mut Cursor::new(data)) else { return };
    let _ = meta.str("general.architecture");
    let _ = smg::tokenizer::from_gguf::convert(&meta);
}

/// The families of smg-parsers, reasoning then tool-call, then gpt-oss's Harmony channels:
/// what the `parsers` target's first byte picks from.
fn families() -> impl Iterator<Item = (bool, &'static str)> {
    let reasoning = smg_parsers::reasoning::NAMES.iter().map(|n| (true, *n));
    reasoning.chain(smg_parsers::tools::NAMES.iter().map(|n| (false, *n))).chain([(false, "harmony")])
}

/// The tools a `parsers` run offers: one function with a string and an integer parameter.
fn offered() -> smg_parsers::Tools {
    let params = vec![("city".to_string(), "string".to_string()), ("days".to_string(), "integer".to_string())];
    smg_parsers::Tools::new(vec![smg_parsers::Tool { name: "get_weather".into(), params }])
}

/// One family's parse of `pieces` in turn, then its finish: the content, the reasoning and the
/// calls, each joined.
fn parse(reasoning: bool, name: &str, pieces: &[&str]) -> Option<(String, String, Vec<smg_parsers::Call>)> {
    let mut out = smg_parsers::Parsed::default();
    let (mut content, mut thought, mut calls) = (String::new(), String::new(), Vec::new());
    let mut take = |out: &mut smg_parsers::Parsed| {
        content.push_str(&out.content);
        thought.push_str(&out.reasoning);
        calls.append(&mut out.calls);
        out.clear();
    };
    if reasoning {
        let mut p = smg_parsers::reasoning::by_name(name, true)?;
        for piece in pieces {
            p.push(piece, &mut out);
            take(&mut out);
        }
        p.finish(&mut out);
    } else {
        let mut p = match name {
            "harmony" => smg_parsers::harmony::parser(offered()),
            _ => smg_parsers::tools::by_name(name, offered())?,
        };
        for piece in pieces {
            p.push(piece, &mut out);
            take(&mut out);
        }
        p.finish(&mut out);
    }
    take(&mut out);
    Some((content, thought, calls))
}

/// A model's output through one reasoning or tool-call parser family of smg-parsers (the
/// first byte picks it), whole and cut in two at a point the second byte picks: the two
/// parses agree (a streamed answer is the answer), and every call names an offered function
/// and carries a JSON object as its arguments.
pub fn parsers(data: &[u8]) {
    let Some((&pick, rest)) = data.split_first() else { return };
    let Some((cut, rest)) = split(rest) else { return };
    let text = String::from_utf8_lossy(rest);
    let mut at = cut.min(text.len());
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    let all: Vec<(bool, &str)> = families().collect();
    let (reasoning, name) = all[pick as usize % all.len()];
    let Some(whole) = parse(reasoning, name, &[&text]) else { return };
    let Some(cut) = parse(reasoning, name, &[&text[..at], &text[at..]]) else { return };
    assert_eq!(whole, cut, "{name}: the parse depends on where the text was cut ({at})");
    for c in &whole.2 {
        assert_eq!(c.name, "get_weather", "{name}: a call of an undeclared function");
        let args = smg::bounded_json::value(c.arguments.as_bytes());
        assert!(args.is_ok_and(|a| a.is_object()), "{name}: arguments not a JSON object: {}", c.arguments);
    }
}
