//! HTTP/1.1 exchanges of the control thread with workers: health checks, discovery, and
//! the admin API's fan-out. They run on the control thread's tokio runtime (one thread for
//! every worker), never on a shard; each has a connection of its own and one deadline.

use std::time::Duration;

use sonic_rs::{JsonContainerTrait, JsonValueTrait};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::fleet::Discovery;
use super::provider::Provider;
use super::snapshot::Runtime;
use super::WorkerUrl;
use smg_wire::chunked::ChunkedDecoder;

/// Largest probe response we read.
const MAX_PROBE_RESPONSE: usize = 1 << 20;

pub struct ProbeResponse {
    pub status: u16,
    pub body: Vec<u8>,
}

fn invalid(why: &'static str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, why)
}

/// GET `path` on the worker.
pub async fn get(worker: &WorkerUrl, path: &str, timeout: Duration) -> std::io::Result<ProbeResponse> {
    request(worker, "GET", path, None, None, timeout).await
}

/// One request with its own connection, the whole exchange within `timeout`.
pub async fn request(
    worker: &WorkerUrl,
    method: &str,
    path: &str,
    body: Option<&[u8]>,
    api_key: Option<&str>,
    timeout: Duration,
) -> std::io::Result<ProbeResponse> {
    let auth = api_key.map(|k| format!("Authorization: Bearer {k}\r\n").into_bytes()).unwrap_or_default();
    match tokio::time::timeout(timeout, exchange(worker, method, path, body, &auth)).await {
        Ok(r) => r,
        Err(_) => Err(std::io::ErrorKind::TimedOut.into()),
    }
}

async fn exchange(
    worker: &WorkerUrl,
    method: &str,
    path: &str,
    body: Option<&[u8]>,
    auth: &[u8],
) -> std::io::Result<ProbeResponse> {
    let mut s = TcpStream::connect(worker.addr).await?;
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {}\r\nAccept: application/json\r\nConnection: close\r\n",
        worker.authority
    );
    if let Some(b) = body {
        req.push_str(&format!("Content-Type: application/json\r\nContent-Length: {}\r\n", b.len()));
    }
    let mut out = req.into_bytes();
    out.extend_from_slice(auth);
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(body.unwrap_or_default());
    s.write_all(&out).await?;
    // Read until the framed body is complete, not until EOF: a worker that ignores
    // `Connection: close` must not stall the probe until its timeout.
    let mut raw = Vec::new();
    let mut tmp = vec![0u8; 16 * 1024];
    loop {
        match parse(&raw) {
            Parsed::Done(r) => return Ok(r),
            Parsed::Bad => return Err(invalid("malformed response")),
            Parsed::Partial if raw.len() > MAX_PROBE_RESPONSE => return Err(invalid("response too large")),
            Parsed::Partial => {}
        }
        let n = s.read(&mut tmp).await?;
        if n == 0 {
            return parse_at_eof(&raw).ok_or_else(|| std::io::ErrorKind::UnexpectedEof.into());
        }
        raw.extend_from_slice(&tmp[..n]);
    }
}

enum Parsed {
    Done(ProbeResponse),
    Partial,
    Bad,
}

fn parse(raw: &[u8]) -> Parsed {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut resp = httparse::Response::new(&mut headers);
    let n = match resp.parse(raw) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Parsed::Partial,
        Err(_) => return Parsed::Bad,
    };
    let Some(status) = resp.code else { return Parsed::Bad };
    let chunked = resp
        .headers
        .iter()
        .any(|h| h.name.eq_ignore_ascii_case("transfer-encoding") && h.value.eq_ignore_ascii_case(b"chunked"));
    let len = resp
        .headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case("content-length"))
        .and_then(|h| std::str::from_utf8(h.value).ok()?.trim().parse::<usize>().ok());
    let rest = &raw[n..];
    if chunked {
        let mut body = Vec::new();
        let mut dec = ChunkedDecoder::new();
        return match dec.feed(rest, Some(&mut body)) {
            Ok(_) if dec.is_done() => Parsed::Done(ProbeResponse { status, body }),
            Ok(_) => Parsed::Partial,
            Err(_) => Parsed::Bad,
        };
    }
    match len {
        Some(len) if rest.len() >= len => Parsed::Done(ProbeResponse { status, body: rest[..len].to_vec() }),
        _ => Parsed::Partial,
    }
}

/// A response without Content-Length or chunking ends at EOF.
fn parse_at_eof(raw: &[u8]) -> Option<ProbeResponse> {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut resp = httparse::Response::new(&mut headers);
    match resp.parse(raw).ok()? {
        httparse::Status::Complete(n) => Some(ProbeResponse { status: resp.code?, body: raw[n..].to_vec() }),
        httparse::Status::Partial => None,
    }
}

/// What registration learns about a worker, as SMG detects it: the model from `/v1/models`
/// (`data[0].id`, else `model_path` from `/get_model_info`, then `/model_info`); the
/// runtime from `/v1/models` `owned_by` (`sglang`/`nvidia`, `vllm`), else a `/version`
/// answer (vLLM), else a `/server_info` answer (SGLang), else unspecified; the data-parallel
/// size and batch capacity from SGLang's server info. None until the model is known.
pub async fn discover(worker: &WorkerUrl, timeout: Duration) -> Option<Discovery> {
    let json =
        |r: ProbeResponse| (200..300).contains(&r.status).then(|| crate::bounded_json::value(&r.body).ok()).flatten();
    let models = get(worker, "/v1/models", timeout).await.ok().and_then(json);
    let first = models.as_ref().map(|v| &v["data"][0]);
    let mut model = first.and_then(|m| m["id"].as_str()).filter(|s| !s.is_empty()).map(str::to_string);
    let owned = first.and_then(|m| m["owned_by"].as_str()).unwrap_or("");
    let mut runtime = match owned.to_ascii_lowercase().as_str() {
        "sglang" | "nvidia" => Some(Runtime::Sglang),
        "vllm" => Some(Runtime::Vllm),
        _ => None,
    };
    let info = match get(worker, "/server_info", timeout).await {
        Ok(r) if r.status == 404 => get(worker, "/get_server_info", timeout).await.ok().and_then(json),
        r => r.ok().and_then(json),
    };
    if runtime.is_none() {
        let version = get(worker, "/version", timeout).await.ok().and_then(json);
        runtime = Some(if version.is_some() {
            Runtime::Vllm
        } else if info.is_some() {
            Runtime::Sglang
        } else {
            Runtime::Unspecified
        });
    }
    if model.is_none() {
        for path in ["/get_model_info", "/model_info"] {
            let found = get(worker, path, timeout).await.ok().and_then(json);
            model = found.as_ref().and_then(|v| v["model_path"].as_str()).filter(|s| !s.is_empty()).map(Into::into);
            if model.is_some() {
                break;
            }
        }
    }
    let field = |name: &str| info.as_ref().and_then(|v| v[name].as_u64());
    Some(Discovery {
        model: model?,
        runtime: runtime.unwrap_or_default(),
        dp_size: field("dp_size").map(|n| n.clamp(1, 1024) as u32),
        max_running: field("max_running_requests"),
        grpc: None,
        more_models: Vec::new(),
    })
}

/// A cloud provider's discovery: its models ([`provider_models`]) with the stored key, or with
/// none when it has none (an OpenAI-compatible service that needs no key answers; a provider
/// that does refuses). None when it refuses or lists nothing.
pub async fn provider_discover(
    worker: &WorkerUrl,
    provider: Provider,
    key: Option<&str>,
    timeout: Duration,
) -> Option<Discovery> {
    let ids = match provider_models(worker, provider, key.map(str::as_bytes), timeout).await {
        Ok(ids) => ids,
        Err(e) => {
            crate::warn!("worker {}: /v1/models: {e}", worker.url);
            return None;
        }
    };
    let mut ids = ids.into_iter();
    let model = ids.next()?;
    Some(Discovery {
        model,
        runtime: Runtime::External,
        dp_size: None,
        max_running: None,
        grpc: None,
        more_models: ids.collect(),
    })
}

/// The model ids a provider lists for `key` (asked in the provider's key style; OpenAI's list
/// shape, and Anthropic's, have the same `data[].id`), or why not.
pub async fn provider_models(
    worker: &WorkerUrl,
    provider: Provider,
    key: Option<&[u8]>,
    timeout: Duration,
) -> Result<Vec<String>, String> {
    let mut auth = Vec::new();
    if let Some(k) = key {
        super::provider::write_key(provider, &mut auth, k, false);
    }
    let r = match tokio::time::timeout(timeout, exchange(worker, "GET", "/v1/models", None, &auth)).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => return Err(e.to_string()),
        Err(_) => return Err(format!("no answer within {timeout:?}")),
    };
    if !(200..300).contains(&r.status) {
        return Err(format!("{} answered {}", provider.name(), r.status));
    }
    let v = crate::bounded_json::value(&r.body).map_err(|e| format!("{}: {e}", provider.name()))?;
    let list = v["data"].as_array().ok_or_else(|| format!("{}: no data list", provider.name()))?;
    Ok(list.iter().filter_map(|m| m["id"].as_str()).map(str::to_string).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_length_chunked_and_close_delimited() {
        let Parsed::Done(r) = parse(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokXX") else { panic!() };
        assert_eq!((r.status, r.body.as_slice()), (200, &b"ok"[..]));
        let Parsed::Done(r) = parse(b"HTTP/1.1 503 X\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nno\r\n0\r\n\r\n") else {
            panic!()
        };
        assert_eq!((r.status, r.body.as_slice()), (503, &b"no"[..]));
        assert!(matches!(parse(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nok"), Parsed::Partial));
        assert!(matches!(parse(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok"), Parsed::Partial));
        assert_eq!(parse_at_eof(b"HTTP/1.0 200 OK\r\n\r\nall").unwrap().body, b"all");
        assert!(matches!(parse(b"garbage"), Parsed::Bad));
    }
}
