//! Byte splices over the original body: the only way the gateway rewrites a request.
//!
//! Every rewrite (alias → canonical model, profile defaults, dropped fields) is expressed as
//! "replace `body[start..end]` with `text`", so key order, whitespace and number spellings of
//! everything untouched survive byte for byte, and a body with no splices is forwarded as is.

use super::json::{Doc, Kind};
use smg_wire::json::put_str as write_json_string;

/// Replace `body[start..end]` with `text`. Lists are sorted by `start` and never overlap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Splice {
    pub start: usize,
    pub end: usize,
    pub text: Vec<u8>,
}

/// The body with `edits` applied. `edits` must be sorted and non-overlapping (as
/// `inspect` returns them).
pub fn apply(body: &[u8], edits: &[Splice]) -> Vec<u8> {
    let mut out = Vec::new();
    apply_into(body, edits, &mut out);
    out
}

/// [`apply`] into a caller-owned buffer (cleared first), so a connection can reuse it.
pub fn apply_into(body: &[u8], edits: &[Splice], out: &mut Vec<u8>) {
    out.clear();
    let grow: usize = edits.iter().map(|e| e.text.len()).sum();
    out.reserve(body.len() + grow);
    let mut at = 0;
    for e in edits {
        out.extend_from_slice(&body[at..e.start]);
        out.extend_from_slice(&e.text);
        at = e.end;
    }
    out.extend_from_slice(&body[at..]);
}

/// Pending inserts into one object, merged so several new members land in one splice.
struct Insert {
    obj: usize,
    pos: usize,
    text: Vec<u8>,
}

/// Collects the splices of one request. At most one member removal per object (the callers
/// never need more), which keeps the comma bookkeeping local.
#[derive(Default)]
pub struct Edits {
    splices: Vec<Splice>,
    inserts: Vec<Insert>,
}

// === impl Edits ===

impl Edits {
    pub fn is_empty(&self) -> bool {
        self.splices.is_empty() && self.inserts.is_empty()
    }

    pub fn push(&mut self, start: usize, end: usize, text: Vec<u8>) {
        self.splices.push(Splice { start, end, text });
    }

    /// Add already-built splices (e.g. from a nested builder).
    pub fn extend(&mut self, splices: Vec<Splice>) {
        self.splices.extend(splices);
    }

    /// Replace the value at tape index `v` with raw JSON text.
    pub fn replace(&mut self, doc: &Doc<'_>, v: usize, text: &[u8]) {
        let n = doc.node(v);
        self.push(n.start as usize, n.end as usize, text.to_vec());
    }

    /// Replace the value at tape index `v` with a JSON string.
    pub fn replace_with_string(&mut self, doc: &Doc<'_>, v: usize, s: &str) {
        let mut text = Vec::with_capacity(s.len() + 2);
        write_json_string(&mut text, s);
        let n = doc.node(v);
        self.push(n.start as usize, n.end as usize, text);
    }

    /// Remove the member whose key is at tape index `key` from object `obj`, with one comma.
    pub fn remove_member(&mut self, doc: &Doc<'_>, obj: usize, key: usize) {
        let mut prev_value_end = None;
        let mut members = doc.members(obj);
        for (k, v) in members.by_ref() {
            if k == key {
                break;
            }
            prev_value_end = Some(doc.node(v).end as usize);
        }
        let value_end = doc.node(key + 1).end as usize;
        let (start, end) = match (members.next(), prev_value_end) {
            (Some((next_key, _)), _) => (doc.node(key).start as usize, doc.node(next_key).start as usize),
            (None, Some(prev_end)) => (prev_end, value_end),
            (None, None) => (doc.node(key).start as usize, value_end),
        };
        self.push(start, end, Vec::new());
    }

    /// Append `"key":raw` to object `obj` (after its last member, or inside `{}`).
    pub fn insert_member(&mut self, doc: &Doc<'_>, obj: usize, key: &str, raw: &[u8]) {
        let mut piece = Vec::with_capacity(key.len() + raw.len() + 4);
        write_json_string(&mut piece, key);
        piece.push(b':');
        piece.extend_from_slice(raw);
        if let Some(ins) = self.inserts.iter_mut().find(|i| i.obj == obj) {
            ins.text.push(b',');
            ins.text.extend_from_slice(&piece);
            return;
        }
        let (pos, comma) = match doc.members(obj).last() {
            Some((_, v)) => (doc.node(v).end as usize, true),
            None => (doc.node(obj).start as usize + 1, false),
        };
        let mut text = Vec::with_capacity(piece.len() + 1);
        if comma {
            text.push(b',');
        }
        text.extend_from_slice(&piece);
        self.inserts.push(Insert { obj, pos, text });
    }

    /// Give `key` in object `obj` the value `raw` when it is absent or `null`.
    pub fn default_member(&mut self, doc: &Doc<'_>, obj: usize, key: &str, raw: &[u8]) {
        match doc.get(obj, key) {
            Some(v) if doc.kind(v) == Kind::Null => self.replace(doc, v, raw),
            Some(_) => {}
            None => self.insert_member(doc, obj, key, raw),
        }
    }

    /// The splices, sorted and checked for overlap.
    pub fn finish(mut self) -> Vec<Splice> {
        for ins in self.inserts.drain(..) {
            self.splices.push(Splice { start: ins.pos, end: ins.pos, text: ins.text });
        }
        self.splices.sort_by_key(|s| (s.start, s.end));
        debug_assert!(self.splices.windows(2).all(|w| w[0].end <= w[1].start), "overlapping splices");
        self.splices
    }
}
