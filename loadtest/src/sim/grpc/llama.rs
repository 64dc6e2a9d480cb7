//! `smg-sim --grpc --llama-url URL`: the scheduler protocol served by a real model. Each
//! Generate call becomes one streamed `POST /completion` to a llama.cpp server with the
//! request's token ids as the prompt (`return_tokens`), and the tokens it samples come back as
//! `GenerateStreamChunk`s and a `GenerateComplete`: a gateway that renders templates, tokenizes
//! and detokenizes itself then produces real text over gRPC, end to end.
//!
//! Sampling fields map to llama.cpp's names; stop strings stay the gateway's job (none are
//! passed); `n` > 1 is refused (llama.cpp samples one sequence per call). An Abort, or the
//! client going away, drops the llama.cpp connection, which makes it stop the generation.

use std::net::SocketAddr;

use bytes::{Bytes, BytesMut};
use h2::SendStream;
use monoio::buf::IoBufMut;
use monoio::io::{AsyncReadRent, AsyncWriteRentExt};
use monoio::net::TcpStream;
use smg_proto::scheduler::generate_complete::MatchedStop;
use smg_proto::scheduler::{generate_response, GenerateComplete, GenerateRequest, GenerateStreamChunk};
use smg_wire::chunked::ChunkedDecoder;
use sonic_rs::{JsonContainerTrait, JsonValueTrait};

use crate::load::sse::SseParser;
use crate::sim::grpc::generate::{gone, response, End};
use crate::sim::grpc::wire::{self, Code, Status};
use crate::sync::Event;

/// Most tokens a call without `max_new_tokens` may generate (llama.cpp would go to its
/// context's end).
const DEFAULT_MAX_TOKENS: u32 = 256;

/// Parses `http://host:port` into the llama.cpp server's address.
pub fn parse_url(url: &str) -> Result<SocketAddr, String> {
    let rest = url
        .trim_end_matches('/')
        .strip_prefix("http://")
        .ok_or_else(|| format!("--llama-url {url}: expected http://host:port"))?;
    use std::net::ToSocketAddrs;
    rest.to_socket_addrs()
        .map_err(|e| format!("--llama-url {url}: {e}"))?
        .next()
        .ok_or_else(|| format!("--llama-url {url}: no address"))
}

/// The `/completion` body for a Generate request.
fn body(req: &GenerateRequest, ids: &[u32]) -> Vec<u8> {
    let sp = req.sampling_params.clone().unwrap_or_default();
    let mut b = Vec::with_capacity(64 + ids.len() * 6);
    b.extend_from_slice(b"{\"prompt\":[");
    for (i, id) in ids.iter().enumerate() {
        if i > 0 {
            b.push(b',');
        }
        b.extend_from_slice(id.to_string().as_bytes());
    }
    let n_predict = sp.max_new_tokens.unwrap_or(DEFAULT_MAX_TOKENS);
    let top_k = if sp.top_k <= 0 { 0 } else { sp.top_k };
    b.extend_from_slice(
        format!(
            "],\"stream\":true,\"return_tokens\":true,\"cache_prompt\":true,\"n_predict\":{n_predict},\
             \"temperature\":{},\"top_p\":{},\"top_k\":{top_k},\"min_p\":{},\"repeat_penalty\":{},\
             \"presence_penalty\":{},\"frequency_penalty\":{},\"ignore_eos\":{}}}",
            sp.temperature,
            sp.top_p,
            sp.min_p,
            if sp.repetition_penalty == 0.0 { 1.0 } else { sp.repetition_penalty },
            sp.presence_penalty,
            sp.frequency_penalty,
            sp.ignore_eos,
        )
        .as_bytes(),
    );
    b
}

/// Serves one Generate call through the llama.cpp server at `addr`.
pub(crate) async fn generate(
    addr: SocketAddr,
    req: &GenerateRequest,
    abort: &Event,
    send: &mut SendStream<Bytes>,
) -> Result<(), End> {
    let ids: Vec<u32> = req.tokenized.as_ref().map(|t| t.input_ids.clone()).unwrap_or_default();
    if ids.is_empty() {
        return Err(End::Failed(Status::new(Code::InvalidArgument, "the request has no input_ids")));
    }
    if req.sampling_params.as_ref().is_some_and(|s| s.n > 1) {
        return Err(End::Failed(Status::new(Code::InvalidArgument, "the llama.cpp bridge samples n = 1")));
    }
    let unavailable = |e: String| End::Failed(Status::new(Code::Unavailable, format!("llama.cpp server: {e}")));
    let mut conn = TcpStream::connect(addr).await.map_err(|e| unavailable(e.to_string()))?;
    let _ = conn.set_nodelay(true);
    let json = body(req, &ids);
    let mut head = format!(
        "POST /completion HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        json.len()
    )
    .into_bytes();
    head.extend_from_slice(&json);
    let (res, _) = conn.write_all(head).await;
    res.map_err(|e| unavailable(e.to_string()))?;

    let prompt_tokens = ids.len() as u32;
    let mut output: Vec<u32> = Vec::new();
    let mut generated = 0u32;
    let mut buf: Vec<u8> = Vec::with_capacity(16 * 1024);
    let mut body_at: Option<usize> = None;
    let mut chunked = ChunkedDecoder::new();
    let mut decoded: Vec<u8> = Vec::new();
    let mut sse = SseParser::default();
    let mut stop: Option<(String, bool)> = None;
    loop {
        let len = buf.len();
        if buf.capacity() - len < 8192 {
            buf.reserve(8192);
        }
        let cap = buf.capacity();
        let read = conn.read(buf.slice_mut(len..cap));
        let (res, b) = monoio::select! {
            r = read => r,
            _ = abort.wait() => return finish(req, prompt_tokens, &mut output, generated, "abort", None, send),
            _ = gone(send) => return Err(End::Gone),
        };
        buf = b.into_inner();
        match res {
            Ok(0) | Err(_) => return Err(unavailable("connection closed mid-response".into())),
            Ok(_) => {}
        }
        let start = match body_at {
            Some(s) => s,
            None => {
                let mut headers = [httparse::EMPTY_HEADER; 32];
                let mut r = httparse::Response::new(&mut headers);
                match r.parse(&buf) {
                    Ok(httparse::Status::Complete(n)) => {
                        let status = r.code.unwrap_or(0);
                        if status != 200 {
                            let msg = String::from_utf8_lossy(&buf[n..]).into_owned();
                            let code = if status == 400 { Code::InvalidArgument } else { Code::from_http(status) };
                            return Err(End::Failed(Status::new(code, format!("llama.cpp answered {status}: {msg}"))));
                        }
                        body_at = Some(n);
                        n
                    }
                    Ok(httparse::Status::Partial) => continue,
                    Err(e) => return Err(unavailable(format!("bad response head: {e}"))),
                }
            }
        };
        decoded.clear();
        let used = chunked.feed(&buf[start..], Some(&mut decoded)).map_err(|e| unavailable(e.0.to_string()))?;
        buf.drain(start..start + used);
        let mut out = BytesMut::new();
        let mut events: Vec<Vec<u8>> = Vec::new();
        sse.feed(&decoded, |data| events.push(data.to_vec()));
        for data in events {
            let Ok(v) = sonic_rs::from_slice::<sonic_rs::Value>(&data) else { continue };
            let tokens: Vec<u32> = v["tokens"]
                .as_array()
                .map(|a| a.iter().filter_map(|t| t.as_u64()).map(|t| t as u32).collect())
                .unwrap_or_default();
            if !tokens.is_empty() {
                generated += tokens.len() as u32;
                output.extend_from_slice(&tokens);
                if req.stream {
                    let chunk = GenerateStreamChunk {
                        token_ids: tokens,
                        prompt_tokens,
                        completion_tokens: generated,
                        ..Default::default()
                    };
                    out.extend_from_slice(&wire::frame(&response(req, generate_response::Response::Chunk(chunk))));
                }
            }
            if v["stop"].as_bool() == Some(true) {
                let kind = v["stop_type"].as_str().unwrap_or("eos").to_string();
                stop = Some((kind, true));
            }
        }
        if !out.is_empty() {
            send.send_data(out.freeze(), false).map_err(|_| End::Gone)?;
        }
        if let Some((kind, _)) = stop {
            // llama.cpp's "limit" is the length cap; "eos" and "word" end on the model's stop.
            let (reason, matched) = if kind == "limit" { ("length", None) } else { ("stop", Some(EOS)) };
            return finish(req, prompt_tokens, &mut output, generated, reason, matched, send);
        }
        if chunked.is_done() {
            return Err(unavailable("the stream ended without a final event".into()));
        }
    }
}

/// SmolLM2's (and ChatML models') end of turn, `<|im_end|>`: what a natural stop matched.
const EOS: u32 = 2;

fn finish(
    req: &GenerateRequest,
    prompt_tokens: u32,
    output: &mut Vec<u32>,
    generated: u32,
    reason: &str,
    matched: Option<u32>,
    send: &mut SendStream<Bytes>,
) -> Result<(), End> {
    let complete = GenerateComplete {
        output_ids: std::mem::take(output),
        finish_reason: reason.into(),
        prompt_tokens,
        completion_tokens: generated,
        matched_stop: matched.map(MatchedStop::MatchedTokenId),
        ..Default::default()
    };
    let msg = wire::frame(&response(req, generate_response::Response::Complete(complete)));
    send.send_data(msg, false).map_err(|_| End::Gone)
}
