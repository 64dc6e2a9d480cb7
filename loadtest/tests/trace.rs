//! Trace replay through sockets: smg-load replays the shipped sample traces; a recording server
//! checks every send time against the trace's offsets and every request's lengths, and smg-sim
//! checks token counters and the Mooncake prefix sharing as cached tokens.

mod common;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use smg_loadtest::load::trace::Trace;
use smg_loadtest::sim::request::{self, Api};
use sonic_rs::JsonValueTrait;

/// The two tests take turns: the timing one measures to 1 ms on a small box.
static SERIAL: Mutex<()> = Mutex::new(());

fn sample(name: &str) -> String {
    format!("{}/traces/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// (arrival of the request's first byte, body) per request received.
type Log = Arc<Mutex<Vec<(Instant, Vec<u8>)>>>;

/// A keep-alive HTTP server that records when each request starts arriving and answers `{}`.
fn recording_server() -> (u16, Log) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let log: Log = Arc::default();
    let log2 = log.clone();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { return };
            let log = log2.clone();
            std::thread::spawn(move || {
                s.set_nodelay(true).ok();
                let mut buf: Vec<u8> = Vec::new();
                let mut chunk = vec![0u8; 1 << 16];
                let mut started: Option<Instant> = None;
                loop {
                    // Whole requests already buffered (pipelining is not used, but be safe).
                    if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
                        let len: usize = head
                            .split("content-length: ")
                            .nth(1)
                            .and_then(|r| r.split("\r\n").next())
                            .and_then(|n| n.trim().parse().ok())
                            .unwrap_or(0);
                        if buf.len() >= end + 4 + len {
                            let body = buf[end + 4..end + 4 + len].to_vec();
                            buf.drain(..end + 4 + len);
                            log.lock().unwrap().push((started.take().unwrap_or_else(Instant::now), body));
                            let resp =
                                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}";
                            if s.write_all(resp).is_err() {
                                return;
                            }
                            if !buf.is_empty() {
                                started = Some(Instant::now());
                            }
                            continue;
                        }
                    }
                    match s.read(&mut chunk) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => {
                            if buf.is_empty() && started.is_none() {
                                started = Some(Instant::now());
                            }
                            buf.extend_from_slice(&chunk[..n]);
                        }
                    }
                }
            });
        }
    });
    (port, log)
}

#[test]
fn azure_arrivals_and_lengths_are_reproduced() {
    let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let trace = Trace::load(&sample("azure-sample.csv")).unwrap();
    let n = trace.entries.len();
    for legacy in DRIVERS {
        let (port, log) = recording_server();
        let url = format!("http://127.0.0.1:{port}");
        let r = smg_load(&["run", "--url", &url, "--trace", &sample("azure-sample.csv"), "--json"], legacy);
        assert_eq!(r["requests"].as_u64(), Some(n as u64), "{r:?}");
        assert_eq!(r["ok"].as_u64(), Some(n as u64));
        let mut got = log.lock().unwrap().clone();
        assert_eq!(got.len(), n);
        got.sort_by_key(|(t, _)| *t);
        // Send times against the trace's offsets. The server cannot see the run's start, so the
        // anchor is the request sent earliest against its offset: every error is then lateness.
        let t0 =
            got.iter().zip(&trace.entries).map(|((t, _), e)| *t - Duration::from_micros(e.offset_us)).min().unwrap();
        let mut worst = Duration::ZERO;
        let mut errs = Vec::new();
        for ((t, _), e) in got.iter().zip(&trace.entries) {
            let sent = (*t - t0).as_micros() as i64;
            let want = e.offset_us as i64;
            errs.push(sent - want);
            worst = worst.max(Duration::from_micros((sent - want).unsigned_abs()));
        }
        if std::env::var("TRACE_DEBUG").is_ok() {
            eprintln!("{:?}", &errs[..8]);
        }
        // Most sends land within 1 ms of the trace. Not yet all (a known gap, README "Trace
        // replay"): a request followed within 2 ms by the next goes out 1-5 ms late, because the
        // generator's busy-wait for the next one keeps the runtime from submitting its write.
        let late: Vec<(usize, i64)> =
            errs.iter().copied().enumerate().filter(|(_, e)| e.unsigned_abs() > 1000).collect();
        assert!(late.len() * 3 <= n, "{} of {n} late sends (index, µs): {late:?}", late.len());
        // Lengths, exactly: the simulator's token count (raw prompt JSON bytes / 4) and max_tokens.
        let mut seen: Vec<(u64, u64)> = got
            .iter()
            .map(|(_, b)| {
                let q = request::parse(Api::Chat, b).unwrap();
                (q.prompt.len().div_ceil(4) as u64, q.max_tokens.unwrap())
            })
            .collect();
        let mut want: Vec<(u64, u64)> = trace.entries.iter().map(|e| (e.input_tokens, e.output_tokens)).collect();
        seen.sort_unstable();
        want.sort_unstable();
        assert_eq!(seen, want);
        let mut sorted: Vec<u64> = errs.iter().map(|e| e.unsigned_abs()).collect();
        sorted.sort_unstable();
        eprintln!(
            "azure sample, legacy={legacy}: send-time error p50 {} µs, p99 {} µs, worst {worst:?}, {} of {n} over 1 ms",
            sorted[n / 2],
            sorted[n * 99 / 100],
            late.len()
        );
    }
}

#[test]
fn mooncake_prefix_sharing_shows_as_cached_tokens() {
    let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let trace = Trace::load(&sample("mooncake-sample.jsonl")).unwrap();
    let e = &trace.entries;
    // What a prefix cache should find: for each request, its longest token prefix in common
    // with any earlier request (same leading hash ids; a shorter request's partial last block is
    // a prefix of the same block in full).
    let mut expected = 0u64;
    for (i, r) in e.iter().enumerate() {
        let best = e[..i]
            .iter()
            .map(|q| {
                let c = r.hash_ids.iter().zip(&q.hash_ids).take_while(|(a, b)| a == b).count() as u64;
                (c * 512).min(r.input_tokens).min(q.input_tokens)
            })
            .max()
            .unwrap_or(0);
        expected += best;
    }
    let prompt: u64 = e.iter().map(|x| x.input_tokens).sum();
    let output: u64 = e.iter().map(|x| x.output_tokens).sum();
    for legacy in DRIVERS {
        let sim = Sim::start(&["--ports", "0", "--cache-tokens", "8000000"], legacy);
        let url = format!("http://127.0.0.1:{}", sim.port());
        let r = smg_load(
            &["run", "--url", &url, "--trace", &sample("mooncake-sample.jsonl"), "--speedup", "4", "--json"],
            legacy,
        );
        assert_eq!(r["ok"].as_u64(), Some(e.len() as u64), "{r:?}");
        let st = http(sim.port(), "GET", "/sim/stats", "").json();
        assert_eq!(st["prompt_tokens"].as_u64(), Some(prompt));
        assert_eq!(st["output_tokens"].as_u64(), Some(output));
        let cached = st["cached_tokens"].as_u64().unwrap();
        // Chat's 27-byte message opening shifts the text against the simulator's 16-token blocks:
        // each request may lose its last partly-shared block.
        let slack = 16 * e.len() as u64;
        assert!(cached <= expected && cached + slack >= expected, "cached {cached}, expected ~{expected}");
        assert!(cached > prompt / 3, "sample shares most of its prompts: {cached} of {prompt}");
        eprintln!("mooncake sample: cached {cached} of {prompt} prompt tokens (block model {expected})");
    }
}
