//! vLLM's PD shape: the `kv_transfer_params` of its NixlConnector, as vLLM's disaggregated
//! proxy passes them from leg to leg. Reads what each leg carries and writes what a prefill
//! answers; the rooms and the handoff underneath are the SGLang shape's (see pd/mod.rs).
//!
//! Field names are NixlConnector's, plus `remote_request_id`: the sim's name for the room the
//! decode fetches (a decimal string, as vLLM's request ids are strings). Real vLLM keys the
//! transfer by its own request id and reads the KV from `remote_block_ids`; here the ids only
//! give the answer its usual shape.

use sonic_rs::JsonValueTrait;

use super::fields::{Leg, MAX_ROOM};
use crate::sim::render::put_json_str;
use crate::wire::put_u64;

/// The top-level request and response field.
const KEY: &str = "kv_transfer_params";
/// Tokens per block in the `remote_block_ids` a prefill names: vLLM's default `--block-size`.
const BLOCK_TOKENS: u64 = 16;

/// Checks a prefill leg: vLLM's proxy marks it `do_remote_decode: true`, and a prefill server
/// without that would generate the whole answer itself, which is not this worker's part.
pub(crate) fn check_prefill(body: &[u8]) -> Result<(), String> {
    let params = read(body)?;
    if params.as_ref().and_then(|p| p.get("do_remote_decode")).and_then(|v| v.as_bool()) == Some(true) {
        return Ok(());
    }
    Err("kv_transfer_params.do_remote_decode must be true on a vLLM prefill server: send the prefill leg as vLLM's \
         disaggregated proxy does"
        .into())
}

/// The decode leg's handoff: the prefill's answer, passed on, names the prefill's bootstrap
/// listener (`remote_host`, `remote_port`) and the room (`remote_request_id`).
pub(crate) fn decode_leg(body: &[u8]) -> Result<Leg, String> {
    let Some(p) = read(body)? else {
        return Err("kv_transfer_params is required on a vLLM decode server: pass on what the prefill answered".into());
    };
    if p.get("do_remote_prefill").and_then(|v| v.as_bool()) != Some(true) {
        return Err("kv_transfer_params.do_remote_prefill must be true on a vLLM decode server".into());
    }
    let host = p
        .get("remote_host")
        .and_then(|v| v.as_str())
        .filter(|h| !h.is_empty())
        .ok_or("kv_transfer_params.remote_host must be a non-empty string")?;
    let port = p
        .get("remote_port")
        .and_then(|v| v.as_u64())
        .and_then(|p| u16::try_from(p).ok())
        .ok_or("kv_transfer_params.remote_port must be a port number")?;
    let room = p
        .get("remote_request_id")
        .and_then(|v| v.as_str())
        .and_then(|r| r.parse::<u64>().ok())
        .filter(|r| *r <= MAX_ROOM)
        .ok_or("kv_transfer_params.remote_request_id must be a room number as a decimal string")?;
    Ok(Leg { host: host.to_string(), port: Some(port), room })
}

/// The request's `kv_transfer_params` object; None when absent or null. A second lazy pass over
/// the top-level keys, as pd/fields.rs takes for SGLang's fields.
fn read(body: &[u8]) -> Result<Option<sonic_rs::Value>, String> {
    for entry in sonic_rs::to_object_iter(body) {
        let (key, value) = entry.map_err(|e| format!("invalid JSON body: {e}"))?;
        if key.as_ref() != KEY || value.is_null() {
            continue;
        }
        let v: sonic_rs::Value = sonic_rs::from_str(value.as_raw_str()).map_err(|e| format!("{KEY}: {e}"))?;
        return if v.is_object() { Ok(Some(v)) } else { Err(format!("{KEY} must be an object")) };
    }
    Ok(None)
}

/// What a vLLM prefill worker says about itself in every answer, rendered once.
#[derive(Debug)]
pub(crate) struct Announce {
    /// `,"remote_engine_id":...,"tp_size":1}`: the end of every `kv_transfer_params` it writes.
    tail: Vec<u8>,
}

// === impl Announce ===

impl Announce {
    /// `engine_id` names the worker (vLLM's is a uuid per engine); `host` and `port` are its
    /// bootstrap listener, where the decode fetches the KV.
    pub(crate) fn new(engine_id: &str, host: &str, port: u16) -> Self {
        let mut tail = Vec::with_capacity(96);
        tail.extend_from_slice(b",\"remote_engine_id\":");
        put_json_str(&mut tail, engine_id);
        tail.extend_from_slice(b",\"remote_host\":");
        put_json_str(&mut tail, host);
        tail.extend_from_slice(b",\"remote_port\":");
        put_u64(&mut tail, port as u64);
        tail.extend_from_slice(b",\"tp_size\":1}");
        Self { tail }
    }

    /// Adds `"kv_transfer_params":{...}` for `room` as the last member of the JSON object in
    /// `body` (a non-streaming answer, already rendered), so the rest is not written twice.
    pub(crate) fn append(&self, body: &mut Vec<u8>, room: u64, prompt_tokens: u64) {
        if body.last() != Some(&b'}') {
            return;
        }
        body.pop();
        body.extend_from_slice(b",\"kv_transfer_params\":{\"do_remote_prefill\":true,\"do_remote_decode\":false");
        body.extend_from_slice(b",\"remote_block_ids\":[");
        // One id per block the prompt's KV fills, as the engine's own block ids would be.
        for id in 0..prompt_tokens.div_ceil(BLOCK_TOKENS).max(1) {
            if id > 0 {
                body.push(b',');
            }
            put_u64(body, id);
        }
        body.extend_from_slice(b"],\"remote_request_id\":\"");
        put_u64(body, room);
        body.push(b'"');
        body.extend_from_slice(&self.tail);
        body.push(b'}');
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sonic_rs::JsonContainerTrait;

    /// The proxy's prefill leg and the decode leg it builds from the prefill's answer.
    const PREFILL: &str = r#"{"prompt":"p","max_tokens":1,"stream":false,"kv_transfer_params":{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}}"#;

    #[test]
    fn prefill_leg_needs_do_remote_decode() {
        assert!(check_prefill(PREFILL.as_bytes()).is_ok());
        for bad in [
            r#"{"prompt":"p"}"#,
            r#"{"prompt":"p","kv_transfer_params":null}"#,
            r#"{"prompt":"p","kv_transfer_params":{}}"#,
            r#"{"prompt":"p","kv_transfer_params":{"do_remote_decode":"true"}}"#,
            r#"{"prompt":"p","kv_transfer_params":[1]}"#,
        ] {
            let e = check_prefill(bad.as_bytes()).unwrap_err();
            assert!(e.contains("kv_transfer_params"), "{bad}: {e}");
        }
    }

    #[test]
    fn prefill_answer_passes_on_to_the_decode() {
        let a = Announce::new("smg-sim-x", "::1", 8998);
        let mut body = br#"{"id":"cmpl-1","usage":{"prompt_tokens":33}}"#.to_vec();
        a.append(&mut body, 42, 33);
        let v: sonic_rs::Value = sonic_rs::from_slice(&body).unwrap();
        assert_eq!(v["usage"]["prompt_tokens"].as_u64(), Some(33));
        let p = &v["kv_transfer_params"];
        assert_eq!((p["do_remote_prefill"].as_bool(), p["do_remote_decode"].as_bool()), (Some(true), Some(false)));
        assert_eq!(p["remote_block_ids"].as_array().map(|a| a.len()), Some(3));
        assert_eq!(p["remote_engine_id"].as_str(), Some("smg-sim-x"));
        assert_eq!((p["remote_host"].as_str(), p["remote_port"].as_u64()), (Some("::1"), Some(8998)));
        assert_eq!((p["tp_size"].as_u64(), p["remote_request_id"].as_str()), (Some(1), Some("42")));
        // The decode leg: the client's request with those params.
        let decode =
            format!(r#"{{"prompt":"p","max_tokens":9,"kv_transfer_params":{}}}"#, sonic_rs::to_string(p).unwrap());
        let leg = decode_leg(decode.as_bytes()).unwrap();
        assert_eq!(leg, Leg { host: "::1".into(), port: Some(8998), room: 42 });
    }

    #[test]
    fn decode_leg_needs_the_prefills_params() {
        let ok = r#""do_remote_prefill":true,"remote_host":"h","remote_port":1,"remote_request_id":"7""#;
        assert_eq!(decode_leg(format!(r#"{{"kv_transfer_params":{{{ok}}}}}"#).as_bytes()).unwrap().room, 7);
        for bad in [
            r#"{"prompt":"p"}"#.to_string(),
            PREFILL.to_string(),
            format!(r#"{{"kv_transfer_params":{{{}}}}}"#, ok.replace("true", "false")),
            format!(r#"{{"kv_transfer_params":{{{}}}}}"#, ok.replace("\"h\"", "\"\"")),
            format!(r#"{{"kv_transfer_params":{{{}}}}}"#, ok.replace(":1,", ":70000,")),
            format!(r#"{{"kv_transfer_params":{{{}}}}}"#, ok.replace("\"7\"", "7")),
            format!(r#"{{"kv_transfer_params":{{{}}}}}"#, ok.replace("\"7\"", "\"9223372036854775808\"")),
        ] {
            assert!(decode_leg(bad.as_bytes()).is_err(), "{bad}");
        }
    }
}
