//! vLLM's disaggregated serving with a NIXL-style KV connector, as vLLM's own proxy drives
//! it. The prefill goes first and alone: the client's body asking for one token
//! (`max_tokens`, and `max_completion_tokens` when the client set it), not streamed (no
//! `stream_options`), and tagged `kv_transfer_params: {do_remote_decode: true, …}` so the
//! engine keeps the prompt's KV for a remote decode. Its answer's `kv_transfer_params` (where
//! the KV sits) go to the decode unchanged, in the client's own body.

use super::Unsplicable;
use crate::contract::json::{self, Kind};
use crate::contract::span::{self, Edits};

/// What the prefill is tagged with (vLLM's field names; the remote fields are the decode's
/// to learn).
const PREFILL_TAG: &[u8] = br#"{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}"#;

/// The prefill's body, into `out` (cleared first).
pub fn prefill_body(body: &[u8], out: &mut Vec<u8>) -> Result<(), Unsplicable> {
    let doc = object(body)?;
    let mut edits = Edits::default();
    set(&doc, &mut edits, "max_tokens", b"1");
    if let Some(v) = doc.get(0, "max_completion_tokens") {
        edits.replace(&doc, v, b"1");
    }
    set(&doc, &mut edits, "stream", b"false");
    if let Some((k, _)) = doc.members(0).find(|&(k, _)| doc.key(k).as_ref() == b"stream_options") {
        edits.remove_member(&doc, 0, k);
    }
    set(&doc, &mut edits, "kv_transfer_params", PREFILL_TAG);
    span::apply_into(body, &edits.finish(), out);
    Ok(())
}

/// The decode's body: the client's, with the prefill's `kv_transfer_params` (raw JSON).
pub fn decode_body(body: &[u8], params: &[u8], out: &mut Vec<u8>) -> Result<(), Unsplicable> {
    let doc = object(body)?;
    let mut edits = Edits::default();
    set(&doc, &mut edits, "kv_transfer_params", params);
    span::apply_into(body, &edits.finish(), out);
    Ok(())
}

/// The `kv_transfer_params` object of the prefill's answer, as the bytes it sent; None when
/// the answer has none (the engine was not started with a KV connector).
pub fn returned_params(answer: &[u8]) -> Option<&[u8]> {
    let doc = json::parse(answer).ok()?;
    let v = doc.get(0, "kv_transfer_params").filter(|&v| doc.kind(v) == Kind::Object)?;
    let n = doc.node(v);
    Some(&answer[n.start as usize..n.end as usize])
}

fn object(body: &[u8]) -> Result<json::Doc<'_>, Unsplicable> {
    let doc = json::parse(body).map_err(|e| Unsplicable(e.describe(body)))?;
    if doc.kind(0) != Kind::Object {
        return Err(Unsplicable("the request body must be a JSON object".into()));
    }
    Ok(doc)
}

/// `key` takes `raw`, replacing the client's value or added.
fn set(doc: &json::Doc<'_>, edits: &mut Edits, key: &str, raw: &[u8]) {
    match doc.get(0, key) {
        Some(v) => edits.replace(doc, v, raw),
        None => edits.insert_member(doc, 0, key, raw),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prefill(body: &str) -> String {
        let mut out = Vec::new();
        prefill_body(body.as_bytes(), &mut out).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn the_prefill_asks_for_one_unstreamed_token_tagged_for_a_remote_decode() {
        let tag = std::str::from_utf8(PREFILL_TAG).unwrap();
        assert_eq!(
            prefill(
                r#"{"model":"m","max_tokens":64,"stream":true,"stream_options":{"include_usage":true},"top_p":0.90}"#
            ),
            format!(r#"{{"model":"m","max_tokens":1,"stream":false,"top_p":0.90,"kv_transfer_params":{tag}}}"#)
        );
        assert_eq!(
            prefill(r#"{"messages":[],"max_completion_tokens":9}"#),
            format!(
                r#"{{"messages":[],"max_completion_tokens":1,"max_tokens":1,"stream":false,"kv_transfer_params":{tag}}}"#
            )
        );
        assert_eq!(
            prefill(r#"{"stream_options":null,"kv_transfer_params":{"x":1}}"#),
            format!(r#"{{"kv_transfer_params":{tag},"max_tokens":1,"stream":false}}"#)
        );
    }

    #[test]
    fn the_decode_gets_the_prefills_params_unchanged() {
        let answer = br#"{"id":"x","choices":[],"kv_transfer_params":{"do_remote_prefill":true,"remote_block_ids":[1, 2],"remote_port":5600}}"#;
        let params = returned_params(answer).unwrap();
        assert_eq!(params, br#"{"do_remote_prefill":true,"remote_block_ids":[1, 2],"remote_port":5600}"#);
        let mut out = Vec::new();
        decode_body(br#"{"stream":true,"max_tokens":64}"#, params, &mut out).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            r#"{"stream":true,"max_tokens":64,"kv_transfer_params":{"do_remote_prefill":true,"remote_block_ids":[1, 2],"remote_port":5600}}"#
        );
        assert!(returned_params(br#"{"kv_transfer_params":null}"#).is_none());
        assert!(returned_params(b"not json").is_none());
    }
}
