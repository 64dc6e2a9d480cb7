//! `POST /v1/audio/transcriptions` through the real binary, under io_uring and epoll: the
//! form forwarded byte for byte with its Content-Type and boundary, each refused form a
//! plain-text 400 with nothing forwarded, and the JSON routes unchanged. A form over
//! `--max-buffered-request-bytes` streams to the worker through a bounded buffer, checked as
//! it passes: the gateway's memory does not grow with the file.

// clippy.toml's house rules are the gateway's: a test's threads are not shards and may lock.
#![allow(clippy::disallowed_types)]

mod support;

use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sonic_rs::JsonValueTrait;
use support::*;

const PATH: &str = "/v1/audio/transcriptions";
const BOUNDARY: &str = "----smgFormBoundary7MA4YWxkTrZu0gW";

/// A form with `fields` in order; `file` gets a filename and an audio type.
fn form(fields: &[(&str, &[u8])]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, value) in fields {
        out.extend_from_slice(format!("--{BOUNDARY}\r\n").as_bytes());
        if *name == "file" {
            out.extend_from_slice(
                b"Content-Disposition: form-data; name=\"file\"; filename=\"audio.wav\"\r\nContent-Type: audio/wav\r\n\r\n",
            );
        } else {
            out.extend_from_slice(format!("Content-Disposition: form-data; name=\"{name}\"\r\n\r\n").as_bytes());
        }
        out.extend_from_slice(value);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(format!("--{BOUNDARY}--\r\n").as_bytes());
    out
}

fn content_type() -> String {
    format!("multipart/form-data; boundary={BOUNDARY}")
}

/// POSTs `body` with `content_type` (none when empty) on a fresh connection.
fn send(port: u16, path: &str, content_type: &str, body: &[u8]) -> Response {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(30))).unwrap();
    let ct = if content_type.is_empty() { String::new() } else { format!("Content-Type: {content_type}\r\n") };
    let head = format!("POST {path} HTTP/1.1\r\nHost: x\r\n{ct}Content-Length: {}\r\n\r\n", body.len());
    s.write_all(head.as_bytes()).unwrap();
    // A body refused by its declared length is answered, and the socket closed, before
    // all of it is written.
    let _ = s.write_all(body);
    read_response(&mut s, &mut Vec::new(), false).unwrap()
}

/// Pseudo-random bytes that never contain the boundary.
fn audio(n: usize) -> Vec<u8> {
    let mut x = 0x2545_f491_4f6c_dd1du64;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

fn gateway(legacy: bool, w: &FakeWorker, extra: &[&str]) -> Gateway {
    let url = w.url();
    let mut args = vec!["--worker-urls", url.as_str(), "--cores", "2"];
    args.extend_from_slice(extra);
    let gw = Gateway::start(legacy, &args);
    gw.ready_workers(1);
    gw
}

#[test]
fn a_large_form_is_forwarded_unchanged() {
    both_drivers(|legacy| {
        let w = FakeWorker::start("org/asr");
        let gw = gateway(legacy, &w, &["--max-payload-size", "33554432"]);
        let file = audio(20 << 20);
        let body = form(&[
            ("model", b"org/asr"),
            ("file", &file),
            ("language", b"en"),
            ("temperature", b"0.2"),
            ("timestamp_granularities[]", b"word"),
            ("stream", b"false"),
        ]);
        let r = send(gw.port, PATH, &content_type(), &body);
        assert_eq!(r.status, 200, "{}", r.text());
        let v = r.json();
        assert_eq!(v["sha"].as_str(), Some(sha_hex(&body).as_str()));
        assert_eq!(v["len"].as_u64(), Some(body.len() as u64));
        assert_eq!(r.header("x-worker"), Some("1"), "the worker's answer is relayed");
        let reqs = w.requests();
        assert_eq!(reqs.len(), 1);
        assert_eq!(reqs[0].path, PATH);
        assert_eq!(reqs[0].header("content-type"), Some(content_type().as_str()));
        assert_eq!(sha_hex(&reqs[0].body), sha_hex(&body));
        // The file part itself, found again in what the worker got.
        let at = reqs[0].body.windows(64).position(|x| x == &file[..64]).unwrap();
        assert_eq!(sha_hex(&reqs[0].body[at..at + file.len()]), sha_hex(&file));

        // Over --max-payload-size: 413, as any body.
        let r = send(gw.port, PATH, &content_type(), &form(&[("model", b"org/asr"), ("file", &audio(40 << 20))]));
        assert_eq!(r.status, 413);
        assert_eq!(w.requests().len(), 1);
    });
}

#[test]
fn each_refused_form_is_a_plain_400_and_nothing_is_forwarded() {
    both_drivers(|legacy| {
        let w = FakeWorker::start("org/asr");
        let gw = gateway(legacy, &w, &[]);
        let ct = content_type();
        let mut truncated = form(&[("model", b"org/asr"), ("file", b"RIFF")]);
        truncated.truncate(truncated.len() - 10);
        let cases: Vec<(&str, String, Vec<u8>, &str)> = vec![
            ("no file", ct.clone(), form(&[("model", b"org/asr")]), "file"),
            ("empty file", ct.clone(), form(&[("model", b"org/asr"), ("file", b"")]), "file"),
            ("no model", ct.clone(), form(&[("file", b"RIFF")]), "model"),
            (
                "temperature high",
                ct.clone(),
                form(&[("model", b"org/asr"), ("file", b"R"), ("temperature", b"1.1")]),
                "temperature",
            ),
            (
                "temperature low",
                ct.clone(),
                form(&[("model", b"org/asr"), ("file", b"R"), ("temperature", b"-1")]),
                "temperature",
            ),
            ("stream", ct.clone(), form(&[("model", b"org/asr"), ("file", b"R"), ("stream", b"yes")]), "stream"),
            ("truncated", ct.clone(), truncated, "Malformed"),
            (
                "other boundary",
                "multipart/form-data; boundary=nope".into(),
                form(&[("model", b"org/asr"), ("file", b"R")]),
                "Malformed",
            ),
            ("json type", "application/json".into(), form(&[("model", b"org/asr"), ("file", b"R")]), "Malformed"),
            ("no type", String::new(), form(&[("model", b"org/asr"), ("file", b"R")]), "Malformed"),
        ];
        for (what, ct, body, needle) in cases {
            let r = send(gw.port, PATH, &ct, &body);
            assert_eq!(r.status, 400, "{what}: {}", r.text());
            assert!(r.header("content-type").is_some_and(|t| t.starts_with("text/plain")), "{what}: {:?}", r.headers);
            assert_eq!(r.header("x-smg-error-code"), None, "{what}");
            assert!(r.text().contains(needle), "{what}: {}", r.text());
        }
        assert!(
            w.requests().is_empty(),
            "nothing forwarded: {:?}",
            w.requests().iter().map(|r| &r.path).collect::<Vec<_>>()
        );
        // The connection carries on after a refusal.
        let mut s = gw.connect();
        let mut rest = Vec::new();
        for body in [form(&[("model", b"org/asr")]), form(&[("model", b"org/asr"), ("file", b"RIFF")])] {
            let head = format!(
                "POST {PATH} HTTP/1.1\r\nHost: x\r\nContent-Type: {}\r\nContent-Length: {}\r\n\r\n",
                content_type(),
                body.len()
            );
            s.write_all(head.as_bytes()).unwrap();
            s.write_all(&body).unwrap();
        }
        assert_eq!(read_response(&mut s, &mut rest, false).unwrap().status, 400);
        assert_eq!(read_response(&mut s, &mut rest, false).unwrap().status, 200);
    });
}

#[test]
fn aliases_chunked_uploads_and_json_routes() {
    both_drivers(|legacy| {
        let w = FakeWorker::start("org/asr");
        let gw = gateway(legacy, &w, &["--model-alias", "asr=org/asr"]);
        // An alias routes as its canonical model, which replaces it in the form.
        let body = form(&[("file", b"RIFF...."), ("model", b"asr")]);
        let r = send(gw.port, PATH, &content_type(), &body);
        assert_eq!(r.status, 200, "{}", r.text());
        let got = &w.requests()[0];
        assert_eq!(got.body, form(&[("file", b"RIFF...."), ("model", b"org/asr")]));
        assert_eq!(got.header("content-length"), Some(got.body.len().to_string().as_str()));
        // A chunked upload is forwarded de-chunked, with its length.
        let body = form(&[("model", b"org/asr"), ("file", &audio(300_000))]);
        let mut s = gw.connect();
        let head = format!(
            "POST {PATH} HTTP/1.1\r\nHost: x\r\nContent-Type: {}\r\nTransfer-Encoding: chunked\r\n\r\n",
            content_type()
        );
        s.write_all(head.as_bytes()).unwrap();
        for c in body.chunks(7777) {
            s.write_all(format!("{:x}\r\n", c.len()).as_bytes()).unwrap();
            s.write_all(c).unwrap();
            s.write_all(b"\r\n").unwrap();
        }
        s.write_all(b"0\r\n\r\n").unwrap();
        let r = read_response(&mut s, &mut Vec::new(), false).unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.json()["sha"].as_str(), Some(sha_hex(&body).as_str()));
        // JSON routes keep their own Content-Type, whatever the client sent.
        let chat = r#"{"model":"org/asr","messages":[{"role":"user","content":"hi"}]}"#;
        assert_eq!(post(gw.port, "/v1/chat/completions", chat, &[]).status, 200);
        assert_eq!(send(gw.port, "/v1/embeddings", "text/plain", br#"{"model":"org/asr","input":"x"}"#).status, 200);
        let reqs = w.requests();
        assert_eq!(reqs.len(), 4);
        for r in &reqs[2..] {
            assert_eq!(r.header("content-type"), Some("application/json"), "{}", r.path);
        }
    });
}

// === Streamed forms ===

/// What the hashing worker saw.
#[derive(Default)]
struct HashState {
    /// Body bytes received, across requests.
    received: AtomicUsize,
    /// Bodies that arrived whole: (length, SHA-256, the first 4 KiB).
    whole: Mutex<Vec<(usize, String, Vec<u8>)>>,
    /// Connections that ended in the middle of a body.
    cut: AtomicUsize,
}

/// A worker that hashes each body as it arrives (never holding it) and answers
/// `{"len":N,"sha":"..."}`.
struct HashSink {
    port: u16,
    st: Arc<HashState>,
}

impl HashSink {
    fn start(model: &'static str) -> HashSink {
        let listener = local_listener();
        let port = listener.local_addr().unwrap().port();
        let st = Arc::new(HashState::default());
        let s2 = Arc::clone(&st);
        std::thread::spawn(move || {
            for c in listener.incoming().flatten() {
                let st = Arc::clone(&s2);
                std::thread::spawn(move || hash_conn(c, &st, model));
            }
        });
        HashSink { port, st }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn whole(&self) -> Vec<(usize, String, Vec<u8>)> {
        self.st.whole.lock().unwrap().clone()
    }
}

fn hash_conn(mut s: std::net::TcpStream, st: &HashState, model: &str) {
    use sha2::Digest;
    use std::io::Read;
    let mut buf = Vec::new();
    let mut tmp = vec![0u8; 256 * 1024];
    loop {
        let (path, len, head_len) = loop {
            let mut h = [httparse::EMPTY_HEADER; 64];
            let mut r = httparse::Request::new(&mut h);
            if let Ok(httparse::Status::Complete(n)) = r.parse(&buf) {
                let len = r
                    .headers
                    .iter()
                    .find(|h| h.name.eq_ignore_ascii_case("content-length"))
                    .map_or(0, |h| std::str::from_utf8(h.value).unwrap().parse().unwrap());
                break (r.path.unwrap().to_string(), len, n);
            }
            match s.read(&mut tmp) {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&tmp[..n]),
            }
        };
        buf.drain(..head_len);
        let (mut got, mut sha, mut first) = (0usize, sha2::Sha256::new(), Vec::new());
        loop {
            let take = buf.len().min(len - got);
            sha.update(&buf[..take]);
            let k = (4096 - first.len().min(4096)).min(take);
            first.extend_from_slice(&buf[..k]);
            buf.drain(..take);
            got += take;
            st.received.fetch_add(take, Ordering::SeqCst);
            if got == len {
                break;
            }
            match s.read(&mut tmp) {
                Ok(0) | Err(_) => {
                    st.cut.fetch_add(1, Ordering::SeqCst);
                    return;
                }
                Ok(n) => buf.extend_from_slice(&tmp[..n]),
            }
        }
        let sha: String = sha.finalize().iter().map(|x| format!("{x:02x}")).collect();
        let body = match path.as_str() {
            "/health" => "ok".to_string(),
            "/v1/models" => format!(r#"{{"object":"list","data":[{{"id":"{model}","object":"model"}}]}}"#),
            PATH => {
                st.whole.lock().unwrap().push((len, sha.clone(), first));
                format!(r#"{{"len":{len},"sha":"{sha}"}}"#)
            }
            _ => {
                let _ = s.write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n");
                continue;
            }
        };
        let out = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        if s.write_all(out.as_bytes()).is_err() {
            return;
        }
    }
}

/// `field` of /proc/<pid>/status (`VmRSS:`, `VmHWM:`), in KiB.
fn status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with(field)).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// Uploads a form of `before` fields, a `file` part of `file_len` generated bytes, then
/// `after` fields, written in 64 KiB pieces as it is generated (the test never holds it);
/// returns the response and the form's length and SHA-256.
fn upload_form(
    port: u16,
    before: &[(&str, &[u8])],
    file_len: usize,
    after: &[(&str, &[u8])],
) -> (Response, usize, String) {
    use sha2::Digest;
    let mut head_part = form(before);
    head_part.truncate(head_part.len() - (BOUNDARY.len() + 6)); // the closing delimiter
    head_part.extend_from_slice(format!("--{BOUNDARY}\r\n").as_bytes());
    head_part.extend_from_slice(
        b"Content-Disposition: form-data; name=\"file\"; filename=\"audio.wav\"\r\nContent-Type: audio/wav\r\n\r\n",
    );
    let mut tail = b"\r\n".to_vec();
    tail.extend_from_slice(&form(after));
    let total = head_part.len() + file_len + tail.len();
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let head = format!(
        "POST {PATH} HTTP/1.1\r\nHost: x\r\nContent-Type: {}\r\nContent-Length: {total}\r\n\r\n",
        content_type()
    );
    s.write_all(head.as_bytes()).unwrap();
    let mut sha = sha2::Sha256::new();
    let mut put = |s: &mut std::net::TcpStream, b: &[u8]| {
        sha.update(b);
        // A refused form is answered, and the socket closed, before all of it is written.
        s.write_all(b).is_ok()
    };
    let mut ok = put(&mut s, &head_part);
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut piece = vec![0u8; 64 * 1024];
    let mut left = file_len;
    while ok && left > 0 {
        let n = left.min(piece.len());
        for b in &mut piece[..n] {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *b = (x >> 24) as u8;
        }
        ok = put(&mut s, &piece[..n]);
        left -= n;
    }
    if ok {
        put(&mut s, &tail);
    }
    let sha: String = sha.finalize().iter().map(|x| format!("{x:02x}")).collect();
    (read_response(&mut s, &mut Vec::new(), false).unwrap(), total, sha)
}

fn sink_gateway(legacy: bool, sinks: &[&HashSink], extra: &[&str]) -> Gateway {
    let urls: Vec<String> = sinks.iter().map(|s| s.url()).collect();
    let mut args = vec!["--worker-urls"];
    args.extend(urls.iter().map(String::as_str));
    args.extend_from_slice(&["--cores", "2"]);
    args.extend_from_slice(extra);
    let gw = Gateway::start(legacy, &args);
    gw.ready_workers(sinks.len());
    gw
}

/// A 150 MB file part streams to the worker unchanged while the gateway's peak RSS grows by
/// a few MiB (buffered, it was +700 MiB, and 540 MiB stayed), and RSS is back near where it
/// started afterwards.
#[test]
fn a_150_mb_form_streams_with_bounded_memory() {
    both_drivers(|legacy| {
        let sink = HashSink::start("org/asr");
        let gw = sink_gateway(legacy, &[&sink], &[]);
        // A small form first, so what the first request allocates is in the base.
        let small = form(&[("model", b"org/asr"), ("file", b"RIFF")]);
        assert_eq!(send(gw.port, PATH, &content_type(), &small).status, 200);
        let base = status_kib(gw.pid(), "VmRSS:");
        let fields: [(&str, &[u8]); 2] = [("model", b"org/asr"), ("language", b"en")];
        let (r, len, sha) = upload_form(gw.port, &fields, 150 << 20, &[("temperature", b"0.2")]);
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.json()["len"].as_u64(), Some(len as u64));
        assert_eq!(r.json()["sha"].as_str(), Some(sha.as_str()), "the form changed on the way");
        let peak = status_kib(gw.pid(), "VmHWM:").saturating_sub(base);
        println!("150 MB form ({}): base RSS {base} KiB, peak +{peak} KiB", if legacy { "epoll" } else { "io_uring" });
        assert!(peak < 16 << 10, "peak RSS grew {peak} KiB during a 150 MB upload");
        let back = wait_until(patience(Duration::from_secs(5)), || status_kib(gw.pid(), "VmRSS:") < base + (8 << 10));
        assert!(back, "RSS {} KiB after the upload, base {base} KiB", status_kib(gw.pid(), "VmRSS:"));
    });
}

/// Refusals of a streamed form: found in its head, nothing reaches a worker; found after
/// its file, the worker has part of it, never all, and its connection is closed; either way
/// the client gets the contract's plain-text 400 (or the model's 404).
#[test]
fn a_streamed_form_is_checked_as_it_passes() {
    both_drivers(|legacy| {
        let asr = HashSink::start("org/asr");
        let gw = sink_gateway(legacy, &[&asr], &["--model-alias", "asr=org/asr"]);
        const FILE: usize = 3 << 20;
        let plain_400 = |r: &Response, needle: &str| {
            assert_eq!(r.status, 400, "{}", r.text());
            assert!(r.header("content-type").is_some_and(|t| t.starts_with("text/plain")), "{:?}", r.headers);
            assert!(r.text().contains(needle), "{}", r.text());
        };
        // Found after the file: a temperature out of range, a second model the form was not
        // routed on, a form without its closing delimiter.
        let (r, _, _) = upload_form(gw.port, &[("model", b"org/asr")], FILE, &[("temperature", b"1.5")]);
        plain_400(&r, "temperature");
        assert!(wait_until(patience(Duration::from_secs(5)), || asr.st.cut.load(Ordering::SeqCst) == 1));
        assert!(asr.st.received.load(Ordering::SeqCst) > 0, "the worker got the form's head");
        let (r, _, _) = upload_form(gw.port, &[("model", b"org/asr")], FILE, &[("model", b"other")]);
        assert_eq!(r.status, 404, "{}", r.text());
        assert!(wait_until(patience(Duration::from_secs(5)), || asr.st.cut.load(Ordering::SeqCst) == 2));
        // The fields' values are judged with the whole form, as a buffered form's are.
        let (r, _, _) = upload_form(gw.port, &[("model", b"org/asr"), ("stream", b"yes")], FILE, &[]);
        plain_400(&r, "stream");
        assert!(wait_until(patience(Duration::from_secs(5)), || asr.st.cut.load(Ordering::SeqCst) == 3));
        assert!(asr.whole().is_empty(), "a refused form reached the worker whole");
        // Found in the head: nothing forwarded.
        let seen = asr.st.received.load(Ordering::SeqCst);
        let (r, _, _) = upload_form(gw.port, &[("model", b"")], FILE, &[]);
        plain_400(&r, "model");
        let (r, _, _) = upload_form(gw.port, &[("model", &[0xff, 0xfe])], FILE, &[]);
        plain_400(&r, "UTF-8");
        assert_eq!(asr.st.received.load(Ordering::SeqCst), seen);
        // An alias in the head is replaced by its model, the rest forwarded as sent.
        let (r, len, _) = upload_form(gw.port, &[("model", b"asr")], FILE, &[]);
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.json()["len"].as_u64(), Some(len as u64 + 4));
        let whole = asr.whole();
        assert!(whole[0].2.windows(9).any(|w| w == b"\r\norg/asr"), "{}", String::from_utf8_lossy(&whole[0].2));
        // One model in the fleet: a form naming it after the file goes to it.
        let (r, len, sha) = upload_form(gw.port, &[("language", b"en")], FILE, &[("model", b"org/asr")]);
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!((r.json()["len"].as_u64(), r.json()["sha"].as_str()), (Some(len as u64), Some(sha.as_str())));
        // Several: the model must come first.
        let whisper = HashSink::start("org/whisper");
        let gw = sink_gateway(legacy, &[&asr, &whisper], &[]);
        let seen = asr.st.received.load(Ordering::SeqCst);
        let (r, _, _) = upload_form(gw.port, &[], FILE, &[("model", b"org/whisper")]);
        plain_400(&r, "before its file");
        let (r, len, sha) = upload_form(gw.port, &[("model", b"org/whisper")], FILE, &[]);
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(whisper.whole(), vec![(len, sha, whisper.whole()[0].2.clone())]);
        assert_eq!(asr.st.received.load(Ordering::SeqCst), seen, "routed by the form's model");
    });
}
