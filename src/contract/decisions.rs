//! `/v1/decisions`: the schema and limits of the contract's Decision Input and Decision
//! Questions tables, checked before routing.
//!
//! A schema mismatch (a non-`user` role, an unknown question `type`, a numeric choice
//! `value`, a missing field) is `json_parse_error`; a length or image limit is `code: 400`.
//! Fields SMG does not model are backend extensions: accepted here and only counted
//! ([`Decision::unknown`]) so the SGLang translation can refuse them. The read keeps tape
//! indices, so the translation reuses raw tokens instead of copying text.

use super::error::ContractError;
use super::fields::{self, Result};
use super::json::{Doc, Kind};

/// Characters in one `input_text` part.
pub const MAX_TEXT_CHARS: usize = 10_485_760;
/// Characters in `model`, `instructions`, `name`, `description` and `label` values.
pub const MAX_FIELD_CHARS: usize = 1_048_576;
/// Characters in `safety_identifier`.
pub const MAX_SAFETY_ID_CHARS: usize = 128;
/// `input_image` parts per request.
pub const MAX_IMAGES: usize = 128;
/// What SGLang takes: at most this many questions, and choices per `choice` question.
pub const MAX_QUESTIONS: usize = 255;
pub const MAX_CHOICES: usize = 255;
/// Levels per `score` question (SGLang labels them 0–9).
pub const MAX_LEVELS: usize = 10;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QuestionKind {
    Predicate,
    Choice,
    Score,
}

/// The part of a `choice` or `score` answer that follows its `name`, as the contract's
/// Response table writes it: `choice` (the most probable of `values`, the first on a tie) or
/// `score` (Σ i·pᵢ), `confidence`, and `probabilities` in request order (a level's `value` is
/// its index, its `label` the value sent). `ps` are the probabilities; `put_p(out, j)` writes
/// the j-th as its source spells it, `put_confidence(out, top)` the confidence. Shared by
/// System One's translation and the gRPC workers' scoring.
pub fn put_verdict(
    out: &mut Vec<u8>,
    kind: QuestionKind,
    values: &[Vec<u8>],
    ps: &[f64],
    put_p: impl Fn(&mut Vec<u8>, usize),
    put_confidence: impl FnOnce(&mut Vec<u8>, usize),
) {
    let top = (0..ps.len()).fold(0, |best, j| if ps[j] > ps[best] { j } else { best });
    if kind == QuestionKind::Choice {
        out.extend_from_slice(b",\"choice\":");
        out.extend_from_slice(&values[top]);
    } else {
        out.extend_from_slice(b",\"score\":");
        put_f64(out, ps.iter().enumerate().map(|(j, p)| j as f64 * p).sum());
    }
    out.extend_from_slice(b",\"confidence\":");
    put_confidence(out, top);
    out.extend_from_slice(b",\"probabilities\":[");
    for (j, value) in values.iter().enumerate().take(ps.len()) {
        if j > 0 {
            out.push(b',');
        }
        out.extend_from_slice(b"{\"value\":");
        if kind == QuestionKind::Choice {
            out.extend_from_slice(value);
        } else {
            smg_wire::num::put_dec(out, j as u64);
            out.extend_from_slice(b",\"label\":");
            out.extend_from_slice(value);
        }
        out.extend_from_slice(b",\"probability\":");
        put_p(out, j);
        out.push(b'}');
    }
    out.push(b']');
}

/// Shortest round-trip decimal of a finite number (a valid JSON number).
pub fn put_f64(out: &mut Vec<u8>, x: f64) {
    use std::io::Write;
    let _ = write!(out, "{x}");
}

/// One choice (`value`) or level (`label`), with its optional `description`.
#[derive(Clone, Copy, Debug)]
pub struct Opt {
    pub value: usize,
    pub description: Option<usize>,
}

#[derive(Clone, Debug)]
pub struct Question {
    pub kind: QuestionKind,
    pub instructions: usize,
    pub name: Option<usize>,
    /// Choices of a `choice` question, levels of a `score` question, in request order.
    pub options: Vec<Opt>,
}

/// A valid Decisions body as tape indices.
pub struct Decision<'a> {
    pub doc: Doc<'a>,
    pub model: usize,
    /// Text evidence in order: the `input` string, or every text `content` and `input_text`.
    pub texts: Vec<usize>,
    pub images: usize,
    pub questions: Vec<Question>,
    /// Members SMG does not model, anywhere on the request.
    pub unknown: usize,
}

pub fn read(doc: Doc<'_>) -> Result<Decision<'_>> {
    let Parts { model, texts, images, questions, unknown } = scan(&doc)?;
    Ok(Decision { doc, model, texts, images, questions, unknown })
}

/// What SGLang Decisions (the System One translation and gRPC scoring alike) refuses before
/// dispatch, the contract's four families in its order: the message of
/// `400 unsupported_decisions_request`.
pub fn sglang_refusal(d: &Decision<'_>) -> std::result::Result<(), String> {
    let no = |m: String| Err(m);
    if d.images > 0 {
        return no(
            "input_image parts are not supported on SGLang workers: SGLang Decisions takes text evidence only".into()
        );
    }
    if d.unknown > 0 {
        return no("fields SMG does not model are not supported on SGLang workers".into());
    }
    let doc = &d.doc;
    let blank = |i: usize| doc.str(i).trim().is_empty();
    if d.texts.is_empty() || d.texts.iter().any(|&t| blank(t)) {
        return no("empty or whitespace-only text evidence is not supported on SGLang workers".into());
    }
    if let Some(i) = d.questions.iter().position(|q| blank(q.instructions)) {
        return no(format!("questions[{i}].instructions is empty or whitespace-only"));
    }
    if d.questions.is_empty() || d.questions.len() > MAX_QUESTIONS {
        return no(format!("SGLang workers take 1 to {MAX_QUESTIONS} questions, got {}", d.questions.len()));
    }
    for (i, q) in d.questions.iter().enumerate() {
        let (max, what) = match q.kind {
            QuestionKind::Predicate => continue,
            QuestionKind::Choice => (MAX_CHOICES, "choices"),
            QuestionKind::Score => (MAX_LEVELS, "levels"),
        };
        if q.options.is_empty() || q.options.len() > max {
            return no(format!("questions[{i}]: SGLang workers take 1 to {max} {what}, got {}", q.options.len()));
        }
    }
    Ok(())
}

struct Parts {
    model: usize,
    texts: Vec<usize>,
    images: usize,
    questions: Vec<Question>,
    unknown: usize,
}

fn scan(doc: &Doc<'_>) -> Result<Parts> {
    if doc.kind(0) != Kind::Object {
        return Err(fields::invalid_type(doc, 0, "request", "struct DecisionRequest"));
    }
    let mut unknown = 0;
    let (mut model, mut input, mut questions) = (None, None, None);
    for (k, v) in doc.members(0) {
        match &*doc.key(k) {
            b"model" => model = fields::string_idx(doc, v, "model")?,
            b"input" => input = Some(v).filter(|&v| !doc.is_null(v)),
            b"questions" => questions = fields::array(doc, v, "questions")?,
            b"safety_identifier" => {
                if let Some(s) = fields::string_idx(doc, v, "safety_identifier")? {
                    limit(doc, s, "safety_identifier", MAX_SAFETY_ID_CHARS)?;
                }
            }
            _ => unknown += 1,
        }
    }
    let model = model.ok_or_else(|| fields::missing("model"))?;
    limit(doc, model, "model", MAX_FIELD_CHARS)?;
    let input = input.ok_or_else(|| fields::missing("input"))?;
    let questions = questions.ok_or_else(|| fields::missing("questions"))?;
    let mut texts = Vec::new();
    let mut images = 0;
    match doc.kind(input) {
        Kind::String => texts.push(input),
        Kind::Array => {
            for m in doc.elements(input) {
                read_message(doc, m, &mut texts, &mut images, &mut unknown)?;
            }
        }
        _ => return Err(fields::invalid_type(doc, input, "input", "a string or an array of messages")),
    }
    if images > MAX_IMAGES {
        return Err(ContractError::field(format!("input: at most {MAX_IMAGES} images per request, got {images}")));
    }
    let mut qs = Vec::new();
    for q in doc.elements(questions) {
        qs.push(read_question(doc, q, &mut unknown)?);
    }
    Ok(Parts { model, texts, images, questions: qs, unknown })
}

fn read_message(
    doc: &Doc<'_>,
    m: usize,
    texts: &mut Vec<usize>,
    images: &mut usize,
    unknown: &mut usize,
) -> Result<()> {
    if doc.kind(m) != Kind::Object {
        return Err(fields::invalid_type(doc, m, "input", "a message object"));
    }
    let (mut role, mut content) = (None, None);
    for (k, v) in doc.members(m) {
        match &*doc.key(k) {
            b"role" => role = fields::string_idx(doc, v, "input.role")?,
            b"type" => {
                if let Some(t) = fields::string_idx(doc, v, "input.type")? {
                    if !doc.str_is(t, "message") {
                        return Err(unknown_variant(doc, t, "input.type", "`message`"));
                    }
                }
            }
            b"content" => content = Some(v).filter(|&v| !doc.is_null(v)),
            _ => *unknown += 1,
        }
    }
    let role = role.ok_or_else(|| fields::missing("role"))?;
    if !doc.str_is(role, "user") {
        return Err(unknown_variant(doc, role, "input.role", "`user`"));
    }
    let content = content.ok_or_else(|| fields::missing("content"))?;
    match doc.kind(content) {
        Kind::String => {
            limit(doc, content, "input.content", MAX_TEXT_CHARS)?;
            texts.push(content);
        }
        Kind::Array => {
            for p in doc.elements(content) {
                read_part(doc, p, texts, images, unknown)?;
            }
        }
        _ => return Err(fields::invalid_type(doc, content, "input.content", "a string or an array of parts")),
    }
    Ok(())
}

fn read_part(doc: &Doc<'_>, p: usize, texts: &mut Vec<usize>, images: &mut usize, unknown: &mut usize) -> Result<()> {
    if doc.kind(p) != Kind::Object {
        return Err(fields::invalid_type(doc, p, "input.content", "a content part"));
    }
    let kind = doc.get_some(p, "type").ok_or_else(|| fields::missing("type"))?;
    fields::string_idx(doc, kind, "input.content.type")?;
    let text_part = doc.str_is(kind, "input_text");
    if !text_part && !doc.str_is(kind, "input_image") {
        return Err(unknown_variant(doc, kind, "input.content.type", "`input_text`, `input_image`"));
    }
    let (mut text, mut url) = (None, None);
    for (k, v) in doc.members(p) {
        match (&*doc.key(k), text_part) {
            (b"type", _) => {}
            (b"text", true) => text = fields::string_idx(doc, v, "input_text.text")?,
            (b"image_url", false) => url = fields::string_idx(doc, v, "input_image.image_url")?,
            (b"detail", false) => {
                if let Some(d) = fields::string_idx(doc, v, "input_image.detail")? {
                    if !["low", "high", "auto", "original"].iter().any(|x| doc.str_is(d, x)) {
                        return Err(unknown_variant(doc, d, "input_image.detail", "`low`, `high`, `auto`, `original`"));
                    }
                }
            }
            (b"file_id", false) if !doc.is_null(v) => {
                return Err(ContractError::field(
                    "input_image: file IDs are not supported; send an inline base64 image data URL",
                ));
            }
            _ => *unknown += 1,
        }
    }
    if text_part {
        let text = text.ok_or_else(|| fields::missing("text"))?;
        limit(doc, text, "input_text.text", MAX_TEXT_CHARS)?;
        texts.push(text);
    } else {
        let url = url.ok_or_else(|| fields::missing("image_url"))?;
        if !inline_image(&doc.str(url)) {
            return Err(ContractError::field(
                "input_image.image_url must be an inline base64 image data URL (data:image/...;base64,...)",
            ));
        }
        *images += 1;
    }
    Ok(())
}

/// `data:image/<subtype>;base64,<payload>`, the only image source the contract accepts.
fn inline_image(url: &str) -> bool {
    let Some(rest) = url.strip_prefix("data:image/") else { return false };
    let Some((media, payload)) = rest.split_once(',') else { return false };
    let Some(subtype) = media.strip_suffix(";base64") else { return false };
    !subtype.is_empty()
        && !payload.is_empty()
        && payload.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'='))
}

fn read_question(doc: &Doc<'_>, q: usize, unknown: &mut usize) -> Result<Question> {
    if doc.kind(q) != Kind::Object {
        return Err(fields::invalid_type(doc, q, "questions", "a question object"));
    }
    let t = doc.get_some(q, "type").ok_or_else(|| fields::missing("type"))?;
    fields::string_idx(doc, t, "questions.type")?;
    let kind = if doc.str_is(t, "predicate") {
        QuestionKind::Predicate
    } else if doc.str_is(t, "choice") {
        QuestionKind::Choice
    } else if doc.str_is(t, "score") {
        QuestionKind::Score
    } else {
        return Err(unknown_variant(doc, t, "questions.type", "`predicate`, `choice`, `score`"));
    };
    let (mut instructions, mut name, mut options) = (None, None, None);
    for (k, v) in doc.members(q) {
        match (&*doc.key(k), kind) {
            (b"type", _) => {}
            (b"instructions", _) => instructions = fields::string_idx(doc, v, "questions.instructions")?,
            (b"name", _) => name = fields::string_idx(doc, v, "questions.name")?,
            (b"choices", QuestionKind::Choice) => options = fields::array(doc, v, "questions.choices")?,
            (b"levels", QuestionKind::Score) => options = fields::array(doc, v, "questions.levels")?,
            _ => *unknown += 1,
        }
    }
    let instructions = instructions.ok_or_else(|| fields::missing("instructions"))?;
    limit(doc, instructions, "questions.instructions", MAX_FIELD_CHARS)?;
    if let Some(n) = name {
        limit(doc, n, "questions.name", MAX_FIELD_CHARS)?;
    }
    let mut opts = Vec::new();
    match kind {
        QuestionKind::Predicate => {}
        QuestionKind::Choice => {
            let list = options.ok_or_else(|| fields::missing("choices"))?;
            for c in doc.elements(list) {
                opts.push(read_option(doc, c, "value", unknown)?);
            }
        }
        QuestionKind::Score => {
            let list = options.ok_or_else(|| fields::missing("levels"))?;
            for l in doc.elements(list) {
                opts.push(read_option(doc, l, "label", unknown)?);
            }
        }
    }
    Ok(Question { kind, instructions, name, options: opts })
}

/// A choice (`value`: string or boolean) or a level (`label`: string).
fn read_option(doc: &Doc<'_>, o: usize, key: &str, unknown: &mut usize) -> Result<Opt> {
    let what = if key == "value" { "questions.choices" } else { "questions.levels" };
    if doc.kind(o) != Kind::Object {
        return Err(fields::invalid_type(doc, o, what, "an object"));
    }
    let (mut value, mut description) = (None, None);
    for (k, v) in doc.members(o) {
        let name = doc.key(k);
        if *name == *key.as_bytes() {
            let ok = match doc.kind(v) {
                Kind::String => {
                    limit(doc, v, what, MAX_FIELD_CHARS)?;
                    true
                }
                Kind::Bool => key == "value",
                _ => false,
            };
            if !ok {
                let expected = if key == "value" { "a string or a boolean" } else { "a string" };
                return Err(fields::invalid_type(doc, v, &format!("{what}.{key}"), expected));
            }
            value = Some(v);
        } else if &*name == b"description" {
            description = fields::string_idx(doc, v, &format!("{what}.description"))?;
            if let Some(d) = description {
                limit(doc, d, &format!("{what}.description"), MAX_FIELD_CHARS)?;
            }
        } else {
            *unknown += 1;
        }
    }
    let value = value.ok_or_else(|| fields::missing(key))?;
    Ok(Opt { value, description })
}

/// A string value of at most `max` characters (a limit: `code: 400`). The raw token bounds
/// the character count from above, so only a long token is counted.
fn limit(doc: &Doc<'_>, s: usize, field: &str, max: usize) -> Result<()> {
    if doc.raw(s).len() <= max + 2 {
        return Ok(());
    }
    let n = doc.str(s).chars().count();
    if n > max {
        return Err(ContractError::field(format!("{field} must be at most {max} characters, got {n}")));
    }
    Ok(())
}

fn unknown_variant(doc: &Doc<'_>, v: usize, field: &str, expected: &str) -> ContractError {
    ContractError::data(format!("{field}: unknown variant `{}`, expected one of {expected}", doc.str(v)))
}
