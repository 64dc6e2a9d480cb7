//! Incremental Server-Sent Events parser, plus the classification of OpenAI / SGLang stream events the report needs.
//!
//! Input may be split anywhere (chunk boundaries have nothing to do with event boundaries);
//! the parser keeps only the unfinished line between calls.

use memchr::memchr;
use memchr::memmem;

#[derive(Default)]
pub struct SseParser {
    /// Bytes of an unfinished line.
    partial: Vec<u8>,
    /// `data:` lines of the event being assembled, joined by '\n'.
    data: Vec<u8>,
    has_data: bool,
}

// === impl SseParser ===

impl SseParser {
    pub fn reset(&mut self) {
        self.partial.clear();
        self.data.clear();
        self.has_data = false;
    }

    /// Feeds bytes; calls `on_event` with each complete event's data.
    pub fn feed(&mut self, mut input: &[u8], mut on_event: impl FnMut(&[u8])) {
        while let Some(nl) = memchr(b'\n', input) {
            let line_part = &input[..nl];
            input = &input[nl + 1..];
            if self.partial.is_empty() {
                self.line(line_part, &mut on_event);
            } else {
                let mut line = std::mem::take(&mut self.partial);
                line.extend_from_slice(line_part);
                self.line(&line, &mut on_event);
                line.clear();
                self.partial = line;
            }
        }
        self.partial.extend_from_slice(input);
    }

    fn line(&mut self, line: &[u8], on_event: &mut impl FnMut(&[u8])) {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.is_empty() {
            if self.has_data {
                on_event(&self.data);
            }
            self.data.clear();
            self.has_data = false;
            return;
        }
        if let Some(v) = line.strip_prefix(b"data:") {
            let v = v.strip_prefix(b" ").unwrap_or(v);
            if self.has_data {
                self.data.push(b'\n');
            }
            self.data.extend_from_slice(v);
            self.has_data = true;
        }
        // Comments (":...") and other fields (event:, id:, retry:) carry nothing we measure.
    }
}

/// What one event means for the measurements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// `[DONE]`.
    Done,
    /// Carries generated text (counts for TTFT and ITL).
    Token,
    /// An `{"error": ...}` event inside the stream.
    Error,
    /// Role-only deltas, finish chunks, usage-only chunks.
    Other,
}

/// Classifies an event by cheap byte searches; no JSON parse on the per-token path.
pub fn classify(data: &[u8]) -> EventKind {
    if data == b"[DONE]" {
        return EventKind::Done;
    }
    if data.starts_with(b"{\"error\"") {
        return EventKind::Error;
    }
    for key in [&b"\"content\":\""[..], b"\"text\":\"", b"\"content\": \"", b"\"text\": \""] {
        if let Some(at) = memmem::find(data, key) {
            if data.get(at + key.len()).is_some_and(|&b| b != b'"') {
                return EventKind::Token;
            }
        }
    }
    EventKind::Other
}

/// Token counts a response reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    pub completion_tokens: u64,
}

/// Reads usage from an OpenAI body or chunk (`usage`; a Responses object's names its counts
/// `input_tokens` and `output_tokens`) or an SGLang /generate one (`meta_info`).
pub fn usage_of(json: &[u8]) -> Option<Usage> {
    use sonic_rs::JsonValueTrait;
    let get = |path: &[&str]| sonic_rs::get(json, path).ok().and_then(|v| v.as_u64());
    if memmem::find(json, b"\"usage\":{").is_some() || memmem::find(json, b"\"usage\": {").is_some() {
        if let Some(input) = get(&["usage", "input_tokens"]) {
            return Some(Usage {
                prompt_tokens: input,
                cached_tokens: get(&["usage", "input_tokens_details", "cached_tokens"]).unwrap_or(0),
                completion_tokens: get(&["usage", "output_tokens"]).unwrap_or(0),
            });
        }
        return Some(Usage {
            prompt_tokens: get(&["usage", "prompt_tokens"])?,
            cached_tokens: get(&["usage", "prompt_tokens_details", "cached_tokens"]).unwrap_or(0),
            completion_tokens: get(&["usage", "completion_tokens"]).unwrap_or(0),
        });
    }
    if memmem::find(json, b"\"meta_info\"").is_some() {
        return Some(Usage {
            prompt_tokens: get(&["meta_info", "prompt_tokens"])?,
            cached_tokens: get(&["meta_info", "cached_tokens"]).unwrap_or(0),
            completion_tokens: get(&["meta_info", "completion_tokens"]).unwrap_or(0),
        });
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const STREAM: &[u8] = b"data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n\
: keep-alive comment\r\n\r\n\
data: {\"choices\":[{\"delta\":{\"content\":\" hi\"}}]}\r\n\r\n\
data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n\
data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":1,\"prompt_tokens_details\":{\"cached_tokens\":4}}}\n\n\
data: [DONE]\n\n";

    fn events(split: usize) -> Vec<Vec<u8>> {
        let mut p = SseParser::default();
        let mut got = Vec::new();
        p.feed(&STREAM[..split], |e| got.push(e.to_vec()));
        p.feed(&STREAM[split..], |e| got.push(e.to_vec()));
        got
    }

    #[test]
    fn parses_at_every_split() {
        let whole = events(0);
        assert_eq!(whole.len(), 5);
        for split in 0..=STREAM.len() {
            assert_eq!(events(split), whole, "split {split}");
        }
        let kinds: Vec<_> = whole.iter().map(|e| classify(e)).collect();
        assert_eq!(
            kinds,
            vec![EventKind::Other, EventKind::Token, EventKind::Other, EventKind::Other, EventKind::Done]
        );
        assert_eq!(usage_of(&whole[3]), Some(Usage { prompt_tokens: 9, cached_tokens: 4, completion_tokens: 1 }));
        assert_eq!(usage_of(&whole[1]), None);
    }

    #[test]
    fn multi_line_data_and_errors() {
        let mut p = SseParser::default();
        let mut got = Vec::new();
        p.feed(b"data: a\ndata: b\n\ndata: {\"error\":{}}\n\n", |e| got.push(e.to_vec()));
        assert_eq!(got[0], b"a\nb");
        assert_eq!(classify(&got[1]), EventKind::Error);
        assert_eq!(classify(b"{\"text\":\" x\",\"meta_info\":{}}"), EventKind::Token);
        let u = usage_of(b"{\"text\":\"x\",\"meta_info\":{\"prompt_tokens\":3,\"cached_tokens\":2}}").unwrap();
        assert_eq!((u.prompt_tokens, u.cached_tokens), (3, 2));
        let responses = br#"{"id":"resp_1","object":"response","usage":{"input_tokens":7,"input_tokens_details":{"cached_tokens":2},"output_tokens":3,"total_tokens":10}}"#;
        assert_eq!(usage_of(responses), Some(Usage { prompt_tokens: 7, cached_tokens: 2, completion_tokens: 3 }));
    }
}
