//! `POST /v1/audio/transcriptions` through the real binary, under io_uring and epoll: the
//! form forwarded byte for byte with its Content-Type and boundary, each refused form a
//! plain-text 400 with nothing forwarded, and the JSON routes unchanged.

mod support;

use std::io::Write;

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
