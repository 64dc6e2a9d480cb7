//! SGLang's prompt log-probabilities on a pair: the prefill computed the prompt, so its
//! answer holds `meta_info.input_token_logprobs`; the decode's holds its own (none, or a
//! few). The client gets the decode's answer with the prefill's list in front, as one
//! engine would have given it. Streamed answers are merged event by event (SMG reads a
//! streamed prefill answer as one JSON document and merges nothing): the prefill's list is
//! taken from the first of its events that has one, and every decode event that carries the
//! field gets it. Splices, never re-serialization: every other byte is the engine's.

use crate::contract::json::{self, Doc, Kind};

/// The items of the prefill's `input_token_logprobs` (the text between its brackets), from
/// a JSON answer or from the first SSE event that has the list; None when it has none.
pub fn prefill_items(answer: &[u8]) -> Option<Vec<u8>> {
    let from_json = |doc_bytes: &[u8]| -> Option<Vec<u8>> {
        let doc = json::parse(doc_bytes).ok()?;
        let v = list(&doc)?;
        doc.elements(v).next()?;
        let n = doc.node(v);
        Some(doc_bytes[n.start as usize + 1..n.end as usize - 1].to_vec())
    };
    if let Some(items) = from_json(answer) {
        return Some(items);
    }
    answer.split(|&b| b == b'\n').filter_map(|l| l.strip_prefix(b"data:")).find_map(|d| from_json(d.trim_ascii()))
}

/// `event` (one JSON document) with `items` put in front of its `input_token_logprobs`,
/// into `out`; false (and `out` untouched) when it has no such list.
pub fn merge(event: &[u8], items: &[u8], out: &mut Vec<u8>) -> bool {
    let Ok(doc) = json::parse(event) else { return false };
    let Some(v) = list(&doc) else { return false };
    let n = doc.node(v);
    let (open, close) = (n.start as usize, n.end as usize);
    out.extend_from_slice(&event[..=open]);
    out.extend_from_slice(items);
    if doc.elements(v).next().is_some() {
        out.push(b',');
    }
    out.extend_from_slice(&event[open + 1..close]);
    out.extend_from_slice(&event[close..]);
    true
}

/// `meta_info.input_token_logprobs`, when it is a list.
fn list(doc: &Doc<'_>) -> Option<usize> {
    if doc.kind(0) != Kind::Object {
        return None;
    }
    let meta = doc.get(0, "meta_info").filter(|&m| doc.kind(m) == Kind::Object)?;
    doc.get(meta, "input_token_logprobs").filter(|&v| doc.kind(v) == Kind::Array)
}

/// Splits an SSE byte stream into events as its bytes arrive.
#[derive(Default)]
pub struct Events {
    buf: Vec<u8>,
    /// Where the next event starts in `buf`.
    at: usize,
    /// Where the search for its end goes on from (what was searched is not searched again).
    seen: usize,
}

impl Events {
    pub fn push(&mut self, bytes: &[u8]) {
        if self.at > 0 && self.at == self.buf.len() {
            self.buf.clear();
            (self.at, self.seen) = (0, 0);
        }
        self.buf.extend_from_slice(bytes);
    }

    /// The next whole event with its blank line (`\n\n`, or `\r\n\r\n`).
    pub fn next_event(&mut self) -> Option<&[u8]> {
        let rest = &self.buf[self.at..];
        let from = self.seen.saturating_sub(self.at + 3);
        let found = (from..rest.len()).find_map(|i| {
            if rest[i..].starts_with(b"\n\n") {
                Some(i + 2)
            } else if rest[i..].starts_with(b"\r\n\r\n") {
                Some(i + 4)
            } else {
                None
            }
        });
        let Some(end) = found else {
            self.seen = self.buf.len();
            return None;
        };
        let start = self.at;
        self.at += end;
        self.seen = self.at;
        Some(&self.buf[start..start + end])
    }

    /// Bytes after the last whole event (a stream that ended without a blank line).
    pub fn rest(&self) -> &[u8] {
        &self.buf[self.at..]
    }
}

/// One SSE event, its `data:` JSON merged with `items` when it carries the list; else as
/// it came.
pub fn merge_event(event: &[u8], items: &[u8], out: &mut Vec<u8>) {
    let text_end = event.len() - if event.ends_with(b"\r\n\r\n") { 4 } else { 2 };
    let line = &event[..text_end];
    if let Some(data) = line.strip_prefix(b"data: ").or_else(|| line.strip_prefix(b"data:")) {
        let prefix = line.len() - data.len();
        let mark = out.len();
        out.extend_from_slice(&line[..prefix]);
        if merge(data, items, out) {
            out.extend_from_slice(&event[text_end..]);
            return;
        }
        out.truncate(mark);
    }
    out.extend_from_slice(event);
}

#[cfg(test)]
mod tests {
    use super::*;

    const PREFILL: &[u8] = br#"{"text":"x","meta_info":{"id":"a","input_token_logprobs":[[null,1,null],[-0.5,2,null]],"prompt_tokens":2}}"#;

    #[test]
    fn the_prefills_list_goes_in_front_of_the_decodes_untouched_bytes() {
        let items = prefill_items(PREFILL).unwrap();
        assert_eq!(items, br#"[null,1,null],[-0.5,2,null]"#);
        let decode =
            br#"{"text":"hi" , "meta_info":{"input_token_logprobs":[],"output_token_logprobs":[[-0.25,9,null]]}}"#;
        let mut out = Vec::new();
        assert!(merge(decode, &items, &mut out));
        assert_eq!(
            String::from_utf8(out).unwrap(),
            r#"{"text":"hi" , "meta_info":{"input_token_logprobs":[[null,1,null],[-0.5,2,null]],"output_token_logprobs":[[-0.25,9,null]]}}"#
        );
        let mut out = Vec::new();
        assert!(merge(br#"{"meta_info":{"input_token_logprobs":[[-1.0,3,null]]}}"#, &items, &mut out));
        assert_eq!(out, br#"{"meta_info":{"input_token_logprobs":[[null,1,null],[-0.5,2,null],[-1.0,3,null]]}}"#);
        assert!(!merge(br#"{"meta_info":{}}"#, &items, &mut Vec::new()));
        assert!(!merge(b"[DONE]", &items, &mut Vec::new()));
    }

    #[test]
    fn a_streamed_prefill_answer_gives_its_first_list() {
        let sse = b"data: {\"text\":\"\",\"meta_info\":{\"input_token_logprobs\":[]}}\n\ndata: {\"text\":\"a\",\"meta_info\":{\"input_token_logprobs\":[[null,7,null]]}}\n\ndata: [DONE]\n\n";
        assert_eq!(prefill_items(sse).unwrap(), b"[null,7,null]");
        assert!(prefill_items(b"data: [DONE]\n\n").is_none());
        assert!(prefill_items(br#"{"meta_info":{"input_token_logprobs":[]}}"#).is_none(), "an empty list adds nothing");
    }

    #[test]
    fn events_split_at_every_byte_boundary_merge_alike() {
        let stream = b"data: {\"meta_info\":{\"input_token_logprobs\":[]}}\n\n: keep-alive\n\ndata: [DONE]\r\n\r\n";
        let want =
            b"data: {\"meta_info\":{\"input_token_logprobs\":[[null,7,null]]}}\n\n: keep-alive\n\ndata: [DONE]\r\n\r\n";
        for cut in 0..=stream.len() {
            let mut ev = Events::default();
            let mut out = Vec::new();
            for piece in [&stream[..cut], &stream[cut..]] {
                ev.push(piece);
                while let Some(e) = ev.next_event() {
                    let e = e.to_vec();
                    merge_event(&e, b"[null,7,null]", &mut out);
                }
            }
            assert_eq!(out, want, "cut at {cut}");
            assert!(ev.rest().is_empty());
        }
    }
}
