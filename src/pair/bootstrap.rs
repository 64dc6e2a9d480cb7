//! SGLang's bootstrap fields: `bootstrap_host` (the prefill's host), `bootstrap_port` (its
//! bootstrap port, or null for the engine's default) and `bootstrap_room` (a random integer
//! in [0, 2^63-1] the decode finds the prefill's KV under), spliced into the body both legs
//! get. A batch gets one entry per item (each field an array), each item its own room: a
//! completions prompt list, chat `n > 1`, and a `/generate` batch of `input_ids` or `text`.
//! Fields of the same names the client sent are replaced, as SMG does.

use super::{PairRoute, Unsplicable};
use crate::contract::json::{self, Doc, Kind};
use crate::contract::span::{self, Edits};
use smg_wire::json::put_str;
use smg_wire::num::put_dec;

/// Where the decode leg fetches the KV from.
#[derive(Debug, Clone, Copy)]
pub struct Bootstrap<'a> {
    pub host: &'a str,
    pub port: Option<u16>,
}

/// Largest batch given per-item fields: past it a body would grow by more than the request
/// is worth (the contract's own limits are far below).
const MAX_ITEMS: usize = 1 << 16;

/// `body` with the bootstrap fields, into `out` (cleared first). `room` draws each room.
pub fn splice(
    body: &[u8],
    route: PairRoute,
    to: Bootstrap<'_>,
    mut room: impl FnMut() -> u64,
    out: &mut Vec<u8>,
) -> Result<(), Unsplicable> {
    let doc = json::parse(body).map_err(|e| Unsplicable(e.describe(body)))?;
    if doc.kind(0) != Kind::Object {
        return Err(Unsplicable("the request body must be a JSON object".into()));
    }
    let items = batch_size(&doc, route).map(|n| n.min(MAX_ITEMS));
    let (mut host, mut port, mut rooms) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..items.unwrap_or(1) {
        if i > 0 {
            host.push(b',');
            port.push(b',');
            rooms.push(b',');
        }
        put_str(&mut host, to.host);
        match to.port {
            Some(p) => put_dec(&mut port, u64::from(p)),
            None => port.extend_from_slice(b"null"),
        }
        put_dec(&mut rooms, room() & (u64::MAX >> 1));
    }
    let mut edits = Edits::default();
    for (key, value) in [("bootstrap_host", host), ("bootstrap_port", port), ("bootstrap_room", rooms)] {
        let value = match items {
            Some(_) => [&b"["[..], &value, b"]"].concat(),
            None => value,
        };
        match doc.get(0, key) {
            Some(v) => edits.replace(&doc, v, &value),
            None => edits.insert_member(&doc, 0, key, &value),
        }
    }
    span::apply_into(body, &edits.finish(), out);
    Ok(())
}

/// A data-parallel prefill's rank, told to the decode (SGLang's `disagg_prefill_dp_rank`:
/// which of the prefill's ranks holds the KV), spliced in after the body's opening brace
/// (the body is an object: [`splice`] made it).
pub fn tell_prefill_rank(body: &mut Vec<u8>, rank: u32) {
    let Some(open) = body.iter().position(|&b| b == b'{') else { return };
    let mut field = b"\"disagg_prefill_dp_rank\":".to_vec();
    put_dec(&mut field, u64::from(rank));
    field.push(b',');
    body.splice(open + 1..open + 1, field);
}

/// Items in a batched request, None for a single one.
fn batch_size(doc: &Doc<'_>, route: PairRoute) -> Option<usize> {
    let array_of = |key: &str, item: Kind| -> Option<usize> {
        let v = doc.get(0, key).filter(|&v| doc.kind(v) == Kind::Array)?;
        let first = doc.elements(v).next()?;
        (doc.kind(first) == item).then(|| doc.elements(v).count())
    };
    match route {
        PairRoute::Chat => {
            let n = doc.get(0, "n").filter(|&v| doc.kind(v) == Kind::Number)?;
            let n = doc.number(n);
            (n > 1.0).then_some(n as usize)
        }
        // A list of prompts (a list of token ids is one prompt).
        PairRoute::Completions => array_of("prompt", Kind::String).or_else(|| array_of("prompt", Kind::Array)),
        PairRoute::Generate => array_of("input_ids", Kind::Array).or_else(|| array_of("text", Kind::String)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spliced(body: &str, route: PairRoute, port: Option<u16>) -> String {
        let mut next = 0u64;
        let mut out = Vec::new();
        let to = Bootstrap { host: "10.0.0.5", port };
        splice(
            body.as_bytes(),
            route,
            to,
            || {
                next += 1;
                next
            },
            &mut out,
        )
        .unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn one_request_gets_three_scalars_and_keeps_its_bytes() {
        let body = r#"{"model":"m", "temperature":0.50,"messages":[{"role":"user","content":"hi"}]}"#;
        assert_eq!(
            spliced(body, PairRoute::Chat, Some(8998)),
            r#"{"model":"m", "temperature":0.50,"messages":[{"role":"user","content":"hi"}],"bootstrap_host":"10.0.0.5","bootstrap_port":8998,"bootstrap_room":1}"#
        );
        assert_eq!(
            spliced(r#"{"text":"hi"}"#, PairRoute::Generate, None),
            r#"{"text":"hi","bootstrap_host":"10.0.0.5","bootstrap_port":null,"bootstrap_room":1}"#
        );
        assert_eq!(
            spliced("{}", PairRoute::Generate, None),
            r#"{"bootstrap_host":"10.0.0.5","bootstrap_port":null,"bootstrap_room":1}"#
        );
    }

    #[test]
    fn a_batch_gets_one_entry_and_one_room_per_item() {
        assert_eq!(
            spliced(r#"{"prompt":["a","b","c"]}"#, PairRoute::Completions, Some(1)),
            r#"{"prompt":["a","b","c"],"bootstrap_host":["10.0.0.5","10.0.0.5","10.0.0.5"],"bootstrap_port":[1,1,1],"bootstrap_room":[1,2,3]}"#
        );
        assert_eq!(
            spliced(r#"{"messages":[],"n":2}"#, PairRoute::Chat, None),
            r#"{"messages":[],"n":2,"bootstrap_host":["10.0.0.5","10.0.0.5"],"bootstrap_port":[null,null],"bootstrap_room":[1,2]}"#
        );
        assert_eq!(
            spliced(r#"{"input_ids":[[1,2],[3]]}"#, PairRoute::Generate, Some(7)),
            r#"{"input_ids":[[1,2],[3]],"bootstrap_host":["10.0.0.5","10.0.0.5"],"bootstrap_port":[7,7],"bootstrap_room":[1,2]}"#
        );
        assert_eq!(
            spliced(r#"{"text":["x","y"]}"#, PairRoute::Generate, Some(7)),
            r#"{"text":["x","y"],"bootstrap_host":["10.0.0.5","10.0.0.5"],"bootstrap_port":[7,7],"bootstrap_room":[1,2]}"#
        );
        // One prompt of token ids, one input_ids list, n = 1: single requests.
        assert!(spliced(r#"{"prompt":[1,2,3]}"#, PairRoute::Completions, None).ends_with(r#""bootstrap_room":1}"#));
        assert!(spliced(r#"{"input_ids":[1,2]}"#, PairRoute::Generate, None).ends_with(r#""bootstrap_room":1}"#));
        assert!(spliced(r#"{"messages":[],"n":1}"#, PairRoute::Chat, None).ends_with(r#""bootstrap_room":1}"#));
    }

    #[test]
    fn rooms_stay_within_63_bits_and_client_fields_are_replaced() {
        let mut out = Vec::new();
        let to = Bootstrap { host: "h", port: None };
        let body = br#"{"bootstrap_room":5,"text":"x","bootstrap_host":"evil"}"#;
        splice(body, PairRoute::Generate, to, || u64::MAX, &mut out).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            r#"{"bootstrap_room":9223372036854775807,"text":"x","bootstrap_host":"h","bootstrap_port":null}"#
        );
    }

    #[test]
    fn the_decode_is_told_the_prefills_rank() {
        let mut body = spliced(r#"{"text":"x"}"#, PairRoute::Generate, None).into_bytes();
        tell_prefill_rank(&mut body, 3);
        assert!(String::from_utf8(body).unwrap().starts_with(r#"{"disagg_prefill_dp_rank":3,"text":"x","#));
    }

    #[test]
    fn a_body_that_is_no_object_is_refused() {
        let mut out = Vec::new();
        let to = Bootstrap { host: "h", port: None };
        assert!(splice(b"[1]", PairRoute::Generate, to, || 1, &mut out).is_err());
        assert!(splice(b"{", PairRoute::Generate, to, || 1, &mut out).is_err());
    }
}
