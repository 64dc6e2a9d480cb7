//! Finds a worker's reported token usage in the response bytes as they are relayed: the
//! `usage` object of a JSON body, or of the usage chunk of an SSE stream. Only what can hold
//! it is scanned: one substring search per read, and a parse only where `"usage"` occurs.
//!
//! A `"usage"` object split across two reads is missed (the reservation then stands at its
//! estimate): engines write an event, and a non-streaming body ends with usage, in one write.

use std::sync::OnceLock;

use memchr::memmem::Finder;

/// What was found: `prompt_tokens` and `completion_tokens` of the last non-null usage, and
/// its `cached_tokens` (in `prompt_tokens_details`, or SGLang's top-level field) if any.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct UsageScan {
    /// Scan at all (a token budget wants the figure).
    pub on: bool,
    pub prompt: Option<u64>,
    pub completion: Option<u64>,
    pub cached: Option<u64>,
}

fn finder() -> &'static Finder<'static> {
    static F: OnceLock<Finder<'static>> = OnceLock::new();
    F.get_or_init(|| Finder::new(b"\"usage\""))
}

// === impl UsageScan ===

impl UsageScan {
    pub fn feed(&mut self, data: &[u8]) {
        if !self.on {
            return;
        }
        for at in finder().find_iter(data) {
            if let Some((p, c, cached)) = parse_usage(&data[at + 7..]) {
                self.prompt = Some(p);
                self.completion = Some(c);
                self.cached = cached;
            }
        }
    }

    /// Tokens the worker reports, prompt and completion together.
    pub fn total(&self) -> Option<u64> {
        Some(self.prompt? + self.completion?)
    }
}

/// `: {... "prompt_tokens": P ... "completion_tokens": C ...}` → (P, C), looking no further
/// than the object's end (nested objects such as `prompt_tokens_details` are skipped over).
fn parse_usage(rest: &[u8]) -> Option<(u64, u64, Option<u64>)> {
    let mut i = 0;
    while i < rest.len() && matches!(rest[i], b' ' | b'\t' | b'\r' | b'\n' | b':') {
        i += 1;
    }
    if rest.get(i) != Some(&b'{') {
        return None;
    }
    let (mut depth, start) = (0usize, i);
    let mut end = None;
    for (j, &b) in rest[start..].iter().enumerate().take(2048) {
        match b {
            b'{' => depth += 1,
            b'}' => {
                depth -= 1;
                if depth == 0 {
                    end = Some(start + j + 1);
                    break;
                }
            }
            _ => {}
        }
    }
    let obj = &rest[start..end?];
    let pair = |p: &[u8], c: &[u8]| Some((number_after(obj, p)?, number_after(obj, c)?));
    // OpenAI's chat and completions names, else the Responses / Messages / Decisions ones.
    let (p, c) = pair(b"\"prompt_tokens\"", b"\"completion_tokens\"")
        .or_else(|| pair(b"\"input_tokens\"", b"\"output_tokens\""))?;
    Some((p, c, number_after(obj, b"\"cached_tokens\"")))
}

fn number_after(obj: &[u8], key: &[u8]) -> Option<u64> {
    let at = memchr::memmem::find(obj, key)? + key.len();
    let digits = obj[at..].iter().skip_while(|b| matches!(b, b' ' | b':')).take_while(|b| b.is_ascii_digit());
    let mut n: u64 = 0;
    let mut any = false;
    for &d in digits {
        n = n.checked_mul(10)?.checked_add(u64::from(d - b'0'))?;
        any = true;
    }
    any.then_some(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan(parts: &[&[u8]]) -> UsageScan {
        let mut s = UsageScan { on: true, ..UsageScan::default() };
        for p in parts {
            s.feed(p);
        }
        s
    }

    #[test]
    fn finds_json_and_sse_usage() {
        let body = br#"{"id":"x","choices":[],"usage":{"prompt_tokens":12,"prompt_tokens_details":{"cached_tokens":4},"completion_tokens":30,"total_tokens":42}}"#;
        assert_eq!(scan(&[body]).total(), Some(42));
        assert_eq!(scan(&[body]).cached, Some(4));
        let sse: [&[u8]; 3] = [
            b"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}],\"usage\":null}\n\n",
            b"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":7,\"total_tokens\":12}}\n\n",
            b"data: [DONE]\n\n",
        ];
        let s = scan(&sse);
        assert_eq!((s.prompt, s.completion, s.cached), (Some(5), Some(7), None));
        assert_eq!(scan(&[b"{\"usage\": {\"prompt_tokens\": 3}}"]).total(), None, "incomplete usage is no figure");
        assert_eq!(UsageScan::default().total(), None);
        let decisions = br#"{"answers":[],"usage":{"input_tokens":9,"output_tokens":0,"input_tokens_details":{"cached_tokens":0}}}"#;
        assert_eq!(scan(&[decisions]).total(), Some(9), "input/output token names count too");
        let mut off = UsageScan::default();
        off.feed(body);
        assert_eq!(off.total(), None, "off scans nothing");
    }
}
