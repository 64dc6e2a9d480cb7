//! `smg-sim --grpc --llama-url URL`: the scheduler protocol served by a real model. A
//! Generate call samples through a llama.cpp server's `POST /completion` with the request's
//! token ids as the prompt (`return_tokens`), and the tokens come back as
//! `GenerateStreamChunk`s and a `GenerateComplete`: a gateway that renders templates, tokenizes
//! and detokenizes itself then produces real text over gRPC, end to end.
//!
//! Sampling fields map to llama.cpp's names; stop strings stay the gateway's job (none are
//! passed); `n` > 1 is refused (llama.cpp samples one sequence per call). An Abort, or the
//! client going away, drops the llama.cpp connection, which makes it stop the generation.
//!
//! `return_logprob` asks llama.cpp for `n_probs` (`top_logprobs_num`, at least 1) and passes its
//! `completion_probabilities` on as OutputLogProbs. llama.cpp reports none for a token that
//! ends inside a UTF-8 character, so such a token's position has no entry.

use std::net::SocketAddr;

use bytes::Bytes;
use h2::SendStream;
use monoio::buf::IoBufMut;
use monoio::io::{AsyncReadRent, AsyncWriteRentExt};
use monoio::net::TcpStream;
use smg_proto::scheduler::generate_complete::MatchedStop;
use smg_proto::scheduler::{
    generate_response, GenerateComplete, GenerateRequest, GenerateStreamChunk, OutputLogProbs, TopLogProbs,
};
use smg_wire::chunked::ChunkedDecoder;
use sonic_rs::{JsonContainerTrait, JsonValueTrait};

use crate::sim::grpc::stream::{gone, response, End};
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

/// The `/completion` body for one step: the prompt so far, one token to sample.
/// `n_probs`: the alternatives llama.cpp reports with the sampled token (0: none asked).
fn body(sp: &smg_proto::scheduler::SamplingParams, ids: &[u32], n_probs: u32) -> Vec<u8> {
    let mut b = Vec::with_capacity(64 + ids.len() * 6);
    b.extend_from_slice(b"{\"prompt\":[");
    for (i, id) in ids.iter().enumerate() {
        if i > 0 {
            b.push(b',');
        }
        b.extend_from_slice(id.to_string().as_bytes());
    }
    let top_k = if sp.top_k <= 0 { 0 } else { sp.top_k };
    b.extend_from_slice(
        format!(
            "],\"stream\":false,\"return_tokens\":true,\"cache_prompt\":true,\"n_predict\":1,\
             \"temperature\":{},\"top_p\":{},\"top_k\":{top_k},\"min_p\":{},\"repeat_penalty\":{},\
             \"presence_penalty\":{},\"frequency_penalty\":{},\"ignore_eos\":{},\"n_probs\":{n_probs}}}",
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

/// Serves one Generate call through the llama.cpp server at `addr`, one token per
/// `/completion` call (`n_predict` 1, the prompt growing by each sampled token, llama.cpp's
/// prompt cache keeping it one token of work a step). One call per token, because
/// llama-server's own stream leaves out of its `tokens` arrays the tokens that end inside a
/// UTF-8 character (it sends only the token that completes it), and a gateway that
/// detokenizes needs every id.
pub(crate) async fn generate(
    addr: SocketAddr,
    req: &GenerateRequest,
    abort: &Event,
    send: &mut SendStream<Bytes>,
) -> Result<(), End> {
    let mut ids: Vec<u32> = req.tokenized.as_ref().map(|t| t.input_ids.clone()).unwrap_or_default();
    if ids.is_empty() {
        return Err(End::Failed(Status::new(Code::INVALID_ARGUMENT, "the request has no input_ids")));
    }
    let sp = req.sampling_params.clone().unwrap_or_default();
    if sp.n > 1 {
        return Err(End::Failed(Status::new(Code::INVALID_ARGUMENT, "the llama.cpp bridge samples n = 1")));
    }
    let prompt_tokens = ids.len() as u32;
    let max = sp.max_new_tokens.unwrap_or(DEFAULT_MAX_TOKENS);
    let mut out = Output::default();
    let top = req.top_logprobs_num.max(0) as u32;
    let n_probs = if req.return_logprob { top.max(1) } else { 0 };
    while (out.ids.len() as u32) < max {
        let json = body(&sp, &ids, n_probs);
        let step = monoio::select! {
            r = complete_one(addr, &json) => r?,
            _ = abort.wait() => {
                let n = out.ids.len() as u32;
                return finish(req, prompt_tokens, &mut out, n, "abort", None, send);
            }
            _ = gone(send) => return Err(End::Gone),
        };
        let tokens: Vec<u32> = step["tokens"]
            .as_array()
            .map(|a| a.iter().filter_map(|t| t.as_u64()).map(|t| t as u32).collect())
            .unwrap_or_default();
        // The model's end of turn: llama.cpp returns the EOS token with `stop_type` "eos";
        // like SGLang, the stop token counts as generated but is not part of the output.
        if step["stop_type"].as_str() == Some("eos") || tokens.is_empty() {
            let matched = tokens.last().copied().unwrap_or(EOS);
            let n = out.ids.len() as u32 + 1;
            return finish(req, prompt_tokens, &mut out, n, "stop", Some(matched), send);
        }
        ids.extend_from_slice(&tokens);
        out.ids.extend_from_slice(&tokens);
        let mut step_logprobs = OutputLogProbs::default();
        if req.return_logprob {
            step_probabilities(&step, top, &mut step_logprobs);
        }
        if req.stream {
            let chunk = GenerateStreamChunk {
                token_ids: tokens,
                prompt_tokens,
                completion_tokens: out.ids.len() as u32,
                output_logprobs: req.return_logprob.then_some(step_logprobs),
                ..Default::default()
            };
            let msg = wire::frame(&response(req, generate_response::Response::Chunk(chunk)));
            send.send_data(msg, false).map_err(|_| End::Gone)?;
        } else {
            out.logprobs.token_logprobs.extend(step_logprobs.token_logprobs);
            out.logprobs.token_ids.extend(step_logprobs.token_ids);
            out.logprobs.top_logprobs.extend(step_logprobs.top_logprobs);
        }
    }
    let n = out.ids.len() as u32;
    finish(req, prompt_tokens, &mut out, n, "length", None, send)
}

/// What a call has generated, for its GenerateComplete.
#[derive(Default)]
struct Output {
    ids: Vec<u32>,
    /// Non-streaming: every token's log-probabilities (a stream sent them with its chunks).
    logprobs: OutputLogProbs,
}

/// llama.cpp's `completion_probabilities` of one step (`logprob`, `top_logprobs`, each with
/// its `id`) as the engine's OutputLogProbs, `top` alternatives kept.
fn step_probabilities(step: &sonic_rs::Value, top: u32, out: &mut OutputLogProbs) {
    let Some(probs) = step["completion_probabilities"].as_array() else { return };
    for p in probs.iter() {
        let id = p["id"].as_u64().unwrap_or(0) as u32;
        out.token_ids.push(id);
        out.token_logprobs.push(p["logprob"].as_f64().unwrap_or(f64::NEG_INFINITY) as f32);
        if top > 0 {
            let mut t = TopLogProbs::default();
            for alt in
                p["top_logprobs"].as_array().map(|a| a.iter().take(top as usize).collect()).unwrap_or_else(Vec::new)
            {
                t.token_ids.push(alt["id"].as_u64().unwrap_or(0) as u32);
                t.values.push(alt["logprob"].as_f64().unwrap_or(f64::NEG_INFINITY) as f32);
            }
            out.top_logprobs.push(t);
        }
    }
}

/// One `/completion` call on its own connection: the parsed JSON answer.
async fn complete_one(addr: SocketAddr, json: &[u8]) -> Result<sonic_rs::Value, End> {
    let unavailable = |e: String| End::Failed(Status::new(Code::UNAVAILABLE, format!("llama.cpp server: {e}")));
    let mut conn = TcpStream::connect(addr).await.map_err(|e| unavailable(e.to_string()))?;
    let _ = conn.set_nodelay(true);
    let mut out = format!(
        "POST /completion HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: {}\r\n\r\n",
        json.len()
    )
    .into_bytes();
    out.extend_from_slice(json);
    let (res, _) = conn.write_all(out).await;
    res.map_err(|e| unavailable(e.to_string()))?;
    let mut buf: Vec<u8> = Vec::with_capacity(16 * 1024);
    loop {
        let len = buf.len();
        if buf.capacity() - len < 8192 {
            buf.reserve(8192);
        }
        let cap = buf.capacity();
        let (res, b) = conn.read(buf.slice_mut(len..cap)).await;
        buf = b.into_inner();
        match res {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) => return Err(unavailable(e.to_string())),
        }
    }
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut r = httparse::Response::new(&mut headers);
    let n = match r.parse(&buf) {
        Ok(httparse::Status::Complete(n)) => n,
        _ => return Err(unavailable("bad response head".into())),
    };
    let status = r.code.unwrap_or(0);
    let chunked = r
        .headers
        .iter()
        .any(|h| h.name.eq_ignore_ascii_case("transfer-encoding") && h.value.eq_ignore_ascii_case(b"chunked"));
    let mut body = buf[n..].to_vec();
    if chunked {
        let mut decoded = Vec::new();
        ChunkedDecoder::new().feed(&body, Some(&mut decoded)).map_err(|e| unavailable(e.0.to_string()))?;
        body = decoded;
    }
    if status != 200 {
        let code = if status == 400 { Code::INVALID_ARGUMENT } else { wire::code_for_http(status) };
        let msg = format!("llama.cpp answered {status}: {}", String::from_utf8_lossy(&body));
        return Err(End::Failed(Status::new(code, msg)));
    }
    sonic_rs::from_slice(&body).map_err(|e| unavailable(format!("answer: {e}")))
}

/// SmolLM2's (and ChatML models') end of turn, `<|im_end|>`: a natural stop that named no token.
const EOS: u32 = 2;

fn finish(
    req: &GenerateRequest,
    prompt_tokens: u32,
    out: &mut Output,
    generated: u32,
    reason: &str,
    matched: Option<u32>,
    send: &mut SendStream<Bytes>,
) -> Result<(), End> {
    let complete = GenerateComplete {
        output_logprobs: (req.return_logprob && !req.stream).then(|| std::mem::take(&mut out.logprobs)),
        output_ids: std::mem::take(&mut out.ids),
        finish_reason: reason.into(),
        prompt_tokens,
        completion_tokens: generated,
        matched_stop: matched.map(MatchedStop::MatchedTokenId),
        ..Default::default()
    };
    let msg = wire::frame(&response(req, generate_response::Response::Complete(complete)));
    send.send_data(msg, false).map_err(|_| End::Gone)
}
