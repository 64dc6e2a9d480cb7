//! A tonic-free gRPC client for tests that call `smg-sim --grpc`: an h2 connection on the
//! test's own monoio runtime and smg-proto's messages.
#![allow(dead_code)]

use std::future::Future;

use bytes::{Buf, Bytes, BytesMut};
use monoio::io::IntoPollIo;
use prost::Message;
use smg_proto::scheduler::{self as pb, generate_response::Response as GenResp};

pub type Client = h2::client::SendRequest<Bytes>;

/// The test's own runtime (epoll: the client side does not need io_uring).
pub fn block_on<F: Future>(f: F) -> F::Output {
    monoio::RuntimeBuilder::<monoio::LegacyDriver>::new().enable_timer().build().expect("runtime").block_on(f)
}

pub async fn connect(port: u16) -> Client {
    let tcp = monoio::net::TcpStream::connect(("127.0.0.1", port)).await.expect("connect");
    let (client, conn) = h2::client::handshake(tcp.into_poll_io().expect("poll io")).await.expect("h2 handshake");
    monoio::spawn(async move {
        let _ = conn.await;
    });
    client
}

/// A call's messages and final status (code, message).
pub struct Reply {
    pub messages: Vec<Bytes>,
    pub code: u32,
    pub message: String,
    /// The status came in the response head ("trailers only": no message at all).
    pub trailers_only: bool,
}

fn frame<M: Message>(m: &M) -> Bytes {
    let mut b = BytesMut::new();
    b.extend_from_slice(&[0]);
    b.extend_from_slice(&(m.encoded_len() as u32).to_be_bytes());
    m.encode(&mut b).unwrap();
    b.freeze()
}

fn status_of(h: &http::HeaderMap) -> Option<(u32, String)> {
    let code = h.get("grpc-status")?.to_str().ok()?.parse().ok()?;
    let msg = h.get("grpc-message").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
    // Percent-encoded on the wire (gRPC's rule); the tests read plain text.
    let msg = percent_decode(&msg);
    Some((code, msg))
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match (b[i], s.get(i + 1..i + 3).and_then(|h| u8::from_str_radix(h, 16).ok())) {
            (b'%', Some(v)) => {
                out.push(v);
                i += 3;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Starts a call; its answer is read by [`finish`].
pub async fn start<M: Message>(client: &mut Client, method: &str, req: &M) -> h2::client::ResponseFuture {
    let request = http::Request::post(format!("http://127.0.0.1{method}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap();
    let mut c = client.clone().ready().await.expect("h2 ready");
    let (resp, mut send) = c.send_request(request, false).expect("send request");
    send.send_data(frame(req), true).expect("send body");
    *client = c;
    resp
}

pub async fn finish(resp: h2::client::ResponseFuture) -> Reply {
    finish_counting(resp, Default::default()).await
}

/// [`finish`], adding the body bytes to `got` as they come.
pub async fn finish_counting(resp: h2::client::ResponseFuture, got: std::rc::Rc<std::cell::Cell<usize>>) -> Reply {
    let resp = resp.await.expect("response head");
    assert_eq!(resp.status(), 200);
    if let Some((code, message)) = status_of(resp.headers()) {
        return Reply { messages: Vec::new(), code, message, trailers_only: true };
    }
    let mut body = resp.into_body();
    let mut buf = BytesMut::new();
    while let Some(d) = body.data().await {
        let d = d.expect("body");
        got.set(got.get() + d.len());
        let _ = body.flow_control().release_capacity(d.len());
        buf.extend_from_slice(&d);
    }
    let (code, message) =
        body.trailers().await.ok().flatten().as_ref().and_then(status_of).expect("grpc-status trailer");
    let mut messages = Vec::new();
    let mut buf = buf.freeze();
    while buf.len() >= 5 {
        let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
        buf.advance(5);
        messages.push(buf.split_to(len));
    }
    assert!(buf.is_empty(), "trailing bytes in the body");
    Reply { messages, code, message, trailers_only: false }
}

/// One call of `method` with `req`, read to its end.
pub async fn call<M: Message>(client: &mut Client, method: &str, req: &M) -> Reply {
    let resp = start(client, method, req).await;
    finish(resp).await
}

/// The messages of a call that ended OK.
pub fn decode<M: Message + Default>(r: &Reply) -> Vec<M> {
    assert_eq!(r.code, 0, "status {} {}", r.code, r.message);
    r.messages.iter().map(|m| M::decode(m.clone()).expect("decode")).collect()
}

/// (chunks, completes) of a Generate call's messages.
pub fn split(msgs: Vec<pb::GenerateResponse>) -> (Vec<pb::GenerateStreamChunk>, Vec<pb::GenerateComplete>) {
    let (mut chunks, mut completes) = (Vec::new(), Vec::new());
    for m in msgs {
        match m.response.expect("response") {
            GenResp::Chunk(c) => chunks.push(c),
            GenResp::Complete(c) => completes.push(c),
        }
    }
    (chunks, completes)
}

/// [`connect`], with the client's per-stream flow-control window set to `window` bytes (a
/// slow reader: the server may send no more than that unread).
pub async fn connect_with_window(port: u16, window: u32) -> Client {
    let tcp = monoio::net::TcpStream::connect(("127.0.0.1", port)).await.expect("connect");
    let (client, conn) = h2::client::Builder::new()
        .initial_window_size(window)
        .handshake(tcp.into_poll_io().expect("poll io"))
        .await
        .expect("h2 handshake");
    monoio::spawn(async move {
        let _ = conn.await;
    });
    client
}

/// A server-streaming call read one message at a time.
pub struct Streaming {
    body: h2::RecvStream,
    buf: BytesMut,
}

impl Streaming {
    /// Waits for the call's response head; Err with the status of a call that failed at once.
    pub async fn open(resp: h2::client::ResponseFuture) -> Result<Streaming, (u32, String)> {
        let resp = resp.await.expect("response head");
        assert_eq!(resp.status(), 200);
        if let Some(status) = status_of(resp.headers()) {
            return Err(status);
        }
        Ok(Streaming { body: resp.into_body(), buf: BytesMut::new() })
    }

    /// The next message; None once the body ended (the status is then in [`Self::status`]) or
    /// the connection was cut.
    pub async fn next<M: Message + Default>(&mut self) -> Option<M> {
        loop {
            if self.buf.len() >= 5 {
                let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]) as usize;
                if self.buf.len() >= 5 + len {
                    self.buf.advance(5);
                    let msg = self.buf.split_to(len).freeze();
                    return Some(M::decode(msg).expect("decode"));
                }
            }
            match self.body.data().await {
                Some(Ok(d)) => {
                    let _ = self.body.flow_control().release_capacity(d.len());
                    self.buf.extend_from_slice(&d);
                }
                Some(Err(_)) | None => return None,
            }
        }
    }

    /// The status trailers after the last message; None when the stream was cut without them.
    pub async fn status(&mut self) -> Option<(u32, String)> {
        let status = self.body.trailers().await.ok().flatten().as_ref().and_then(status_of);
        assert!(status.is_none() || self.buf.is_empty(), "a partial message before the status");
        status
    }
}
